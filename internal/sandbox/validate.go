package sandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// The bounds of a create request: one set for every API (the native one,
// internal/api, and E2B's, internal/e2b), so that each door admits the
// same sandboxes. API.md "Lifecycle" documents them.
const (
	MinWidth, MaxWidth       = 320, 7680
	MinHeight, MaxHeight     = 200, 4320
	MinDPI, MaxDPI           = 50, 600
	MinVCPUs, MaxVCPUs       = 1, 64
	MinMemoryMB, MaxMemoryMB = 256, 262144
	// MaxTimeoutSeconds bounds timeout_seconds and idle_timeout_seconds:
	// a sandbox lives at most a year (less when the daemon's maximum
	// lifetime is shorter).
	MaxTimeoutSeconds     = 366 * 24 * 3600
	MaxStartURLBytes      = 8 << 10
	MaxEnvVars            = 256
	MaxEnvKeyBytes        = 256
	MaxEnvValueBytes      = 32 << 10
	MaxMetadataPairs      = 64
	MaxMetadataKeyBytes   = 128
	MaxMetadataValueBytes = 1024
	MaxAllowCIDRs         = 256
	MaxTemplateName       = 64
)

var (
	backendNames = map[string]bool{"firecracker": true, "qemu": true, "gvisor": true, "runc": true}
	templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	envName      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// FieldError is a create request that breaks one of the shared rules. Its
// message is Field, then the index in brackets when Index >= 0, then
// Detail: `env: "1X" is not a valid variable name (...)`. Field is the
// native API's name of the field ("env", "network.egress.allow"); an API
// whose wire names differ (E2B's "envVars") says its own name in front of
// the same Detail. It is an errdefs.ErrInvalid, meant for users.
type FieldError struct {
	Field  string
	Index  int // position in a list field, -1 for none
	Detail string
}

func (e *FieldError) Error() string {
	if e.Index >= 0 {
		return fmt.Sprintf("%s[%d]%s", e.Field, e.Index, e.Detail)
	}
	return e.Field + e.Detail
}

// Unwrap makes a FieldError an errdefs.ErrInvalid.
func (e *FieldError) Unwrap() error { return errdefs.ErrInvalid }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Index: -1, Detail: fmt.Sprintf(format, args...)}
}

// ValidateCreate checks req against the rules every API shares and returns
// it normalized: allow-list entries become masked prefixes (a bare address
// a one-host prefix). Zero values mean "daemon default" and always pass.
// The error is a *FieldError. Owner is not looked at: the API layers set
// it from the API key, never from a body.
func ValidateCreate(req CreateRequest) (CreateRequest, error) {
	if req.Template != "" && (len(req.Template) > MaxTemplateName || !templateName.MatchString(req.Template)) {
		return req, fieldErr("template", " %q is not a valid template name", truncate(req.Template, MaxTemplateName))
	}
	if req.Backend != "" && !backendNames[req.Backend] {
		return req, fieldErr("backend", " must be firecracker, qemu, gvisor or runc, not %q", truncate(req.Backend, 32))
	}
	if res := req.Resolution; res != (Resolution{}) &&
		(res.Width < MinWidth || res.Width > MaxWidth || res.Height < MinHeight || res.Height > MaxHeight) {
		return req, fieldErr("resolution", " %dx%d is out of range %d..%d x %d..%d",
			res.Width, res.Height, MinWidth, MaxWidth, MinHeight, MaxHeight)
	}
	for _, c := range []struct {
		name     string
		v        int
		min, max int
	}{
		{"dpi", req.DPI, MinDPI, MaxDPI},
		{"vcpus", req.VCPUs, MinVCPUs, MaxVCPUs},
		{"memory_mb", req.MemoryMB, MinMemoryMB, MaxMemoryMB},
	} {
		if c.v != 0 && (c.v < c.min || c.v > c.max) {
			return req, fieldErr(c.name, " must be %d..%d, not %d", c.min, c.max, c.v)
		}
	}
	if err := CheckTimeout("timeout_seconds", req.TimeoutSeconds); err != nil {
		return req, err
	}
	if err := CheckTimeout("idle_timeout_seconds", req.IdleTimeoutSeconds); err != nil {
		return req, err
	}
	if req.StartURL != "" {
		if err := checkStartURL(req.StartURL); err != nil {
			return req, err
		}
	}
	if err := CheckEnv(req.Env); err != nil {
		return req, err
	}
	if err := checkVolumeMounts(req.Volumes); err != nil {
		return req, err
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return req, err
	}
	if req.FromSnapshot != "" {
		if err := CheckSnapshotRef("from_snapshot", req.FromSnapshot); err != nil {
			return req, err
		}
	}
	n, err := checkNetwork(req.Network)
	if err != nil {
		return req, err
	}
	req.Network = n
	return req, nil
}

// CheckTimeout checks a timeout in seconds, for creates and for a running
// sandbox's new expiry: 0 (the default, or the daemon's maximum) up to
// MaxTimeoutSeconds. field names it in the message.
func CheckTimeout(field string, seconds int) error {
	if seconds < 0 || seconds > MaxTimeoutSeconds {
		return fieldErr(field, " must be 0..%d, not %d", MaxTimeoutSeconds, seconds)
	}
	return nil
}

func checkStartURL(s string) error {
	if len(s) > MaxStartURLBytes {
		return fieldErr("start_url", " is longer than %d bytes", MaxStartURLBytes)
	}
	u, err := url.Parse(s)
	if err != nil || strings.ContainsAny(s, " \t\r\n") {
		return fieldErr("start_url", " is not a valid URL")
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
		if u.Host == "" {
			return fieldErr("start_url", " %q has no host", truncate(s, 256))
		}
	case "about", "file":
	default:
		return fieldErr("start_url", " must be an http, https, about or file URL")
	}
	return nil
}

// CheckEnv checks an environment, a sandbox's or a command's: at most
// MaxEnvVars POSIX variable names, each value at most MaxEnvValueBytes and
// free of NUL bytes.
func CheckEnv(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return fieldErr("env", " has %d variables (at most %d)", len(env), MaxEnvVars)
	}
	for k, v := range env {
		if len(k) > MaxEnvKeyBytes || !envName.MatchString(k) {
			return fieldErr("env", `: %q is not a valid variable name (letters, digits and _, not starting with a digit)`, truncate(k, 64))
		}
		if len(v) > MaxEnvValueBytes {
			return fieldErr("env", ": the value of %s is longer than %d bytes", k, MaxEnvValueBytes)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return fieldErr("env", ": the value of %s contains a NUL byte", k)
		}
	}
	return nil
}

func checkMetadata(md map[string]string) error {
	if len(md) > MaxMetadataPairs {
		return fieldErr("metadata", " has %d keys (at most %d)", len(md), MaxMetadataPairs)
	}
	for k, v := range md {
		if k == "" || len(k) > MaxMetadataKeyBytes || !utf8.ValidString(k) || hasControl(k) {
			return fieldErr("metadata", ": %q is not a valid key (1..%d printable bytes)", truncate(k, 64), MaxMetadataKeyBytes)
		}
		if len(v) > MaxMetadataValueBytes {
			return fieldErr("metadata", ": the value of %q is longer than %d bytes", k, MaxMetadataValueBytes)
		}
		if !utf8.ValidString(v) {
			return fieldErr("metadata", ": the value of %q is not valid UTF-8", k)
		}
	}
	return nil
}

// checkNetwork checks an egress policy and returns it with its allow-list
// masked.
func checkNetwork(n Network) (Network, error) {
	switch n.Egress {
	case "", "none", "all":
	default:
		return n, fieldErr("network.egress", ` must be "none", "all" or {"allow": [CIDR, ...]}, not %q`, truncate(n.Egress, 32))
	}
	if n.Allow == nil {
		return n, nil
	}
	if n.Egress != "" {
		return n, fieldErr("network.egress", ` is either "none", "all" or an allow-list, not %q with one`, n.Egress)
	}
	if len(n.Allow) > MaxAllowCIDRs {
		return n, fieldErr("network.egress.allow", " has %d entries (at most %d)", len(n.Allow), MaxAllowCIDRs)
	}
	allow := make([]string, len(n.Allow))
	for i, a := range n.Allow {
		p, err := parsePrefix(strings.TrimSpace(a))
		if err != nil {
			return n, &FieldError{Field: "network.egress.allow", Index: i,
				Detail: fmt.Sprintf(": %q is not an IP address or CIDR (cubicle filters egress by address, not by domain name)", truncate(a, 64))}
		}
		allow[i] = p.String()
	}
	n.Allow = allow
	return n, nil
}

// parsePrefix parses a CIDR, or a bare address as a one-host prefix, masked.
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("parse address: %w", err)
		}
		if a.Zone() != "" {
			return netip.Prefix{}, errors.New("address has a zone")
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("parse prefix: %w", err)
	}
	return p.Masked(), nil
}

func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// truncate shortens s for an error message, keeping it valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
