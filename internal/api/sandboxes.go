package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/strictjson"
)

// Bounds of a create request (API.md "Lifecycle").
const (
	minWidth, maxWidth       = 320, 7680
	minHeight, maxHeight     = 200, 4320
	minDPI, maxDPI           = 50, 600
	minVCPUs, maxVCPUs       = 1, 64
	minMemoryMB, maxMemoryMB = 256, 262144
	maxTimeoutSeconds        = 366 * 24 * 3600
	maxStartURLBytes         = 8 << 10
	maxEnvVars               = 256
	maxEnvKeyBytes           = 256
	maxEnvValueBytes         = 32 << 10
	maxMetadataPairs         = 64
	maxMetadataKeyBytes      = 128
	maxMetadataValueBytes    = 1024
	maxAllowCIDRs            = 256
	maxTemplateName          = 64
)

var (
	backends     = map[string]bool{"firecracker": true, "qemu": true, "gvisor": true, "runc": true}
	templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	envKey       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	sandboxID    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	states       = map[sandbox.State]bool{
		sandbox.StateStarting: true, sandbox.StateRunning: true, sandbox.StateStopping: true,
		sandbox.StateStopped: true, sandbox.StateFailed: true,
	}
)

// createRequest is the wire form of POST /v1/sandboxes.
type createRequest struct {
	Template           string              `json:"template"`
	Backend            string              `json:"backend"`
	Resolution         *sandbox.Resolution `json:"resolution"`
	DPI                int                 `json:"dpi"`
	VCPUs              int                 `json:"vcpus"`
	MemoryMB           int                 `json:"memory_mb"`
	TimeoutSeconds     int                 `json:"timeout_seconds"`
	IdleTimeoutSeconds int                 `json:"idle_timeout_seconds"`
	StartURL           string              `json:"start_url"`
	Env                map[string]string   `json:"env"`
	Metadata           map[string]string   `json:"metadata"`
	Network            *networkSpec        `json:"network"`
}

// networkSpec is the wire form of "network".
type networkSpec struct {
	Egress egressSpec `json:"egress"`
}

// egressSpec is "none", "all" or {"allow": ["CIDR", ...]}.
type egressSpec struct {
	mode  string
	allow []string
}

// UnmarshalJSON decodes the union form of "egress".
func (e *egressSpec) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case bytes.Equal(data, []byte("null")):
		*e = egressSpec{}
		return nil
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return invalidf(`network.egress must be "none", "all" or {"allow": [CIDR, ...]}`)
		}
		if s != "none" && s != "all" {
			return invalidf(`network.egress must be "none", "all" or {"allow": [CIDR, ...]}, not %q`, s)
		}
		*e = egressSpec{mode: s}
		return nil
	case len(data) > 0 && data[0] == '{':
		var obj struct {
			Allow []string `json:"allow"`
		}
		if err := strictjson.Decode(data, &obj); err != nil {
			return invalidf("network.egress: %s", err)
		}
		if len(obj.Allow) == 0 {
			return invalidf(`network.egress.allow must list at least one CIDR (use "none" to allow nothing)`)
		}
		if len(obj.Allow) > maxAllowCIDRs {
			return invalidf("network.egress.allow has %d entries (at most %d)", len(obj.Allow), maxAllowCIDRs)
		}
		out := make([]string, len(obj.Allow))
		for i, c := range obj.Allow {
			p, err := parseCIDR(c)
			if err != nil {
				return invalidf("network.egress.allow[%d]: %q is not a CIDR", i, c)
			}
			out[i] = p.String()
		}
		*e = egressSpec{allow: out}
		return nil
	}
	return invalidf(`network.egress must be "none", "all" or {"allow": [CIDR, ...]}`)
}

// parseCIDR parses a CIDR, or a bare address as a single-host prefix, and
// returns it masked.
func parseCIDR(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		if a.Zone() != "" {
			return netip.Prefix{}, strconv.ErrSyntax
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return p.Masked(), nil
}

// parseCreateRequest decodes and validates the body of POST /v1/sandboxes.
// Errors are 400 invalid_argument with a message for users.
func parseCreateRequest(body []byte) (sandbox.CreateRequest, error) {
	var in createRequest
	if err := decodeStrict(body, &in); err != nil {
		return sandbox.CreateRequest{}, err
	}
	out := sandbox.CreateRequest{
		Template:           in.Template,
		Backend:            in.Backend,
		DPI:                in.DPI,
		VCPUs:              in.VCPUs,
		MemoryMB:           in.MemoryMB,
		TimeoutSeconds:     in.TimeoutSeconds,
		IdleTimeoutSeconds: in.IdleTimeoutSeconds,
		StartURL:           in.StartURL,
		Env:                in.Env,
		Metadata:           in.Metadata,
	}
	if in.Template != "" && (len(in.Template) > maxTemplateName || !templateName.MatchString(in.Template)) {
		return out, invalidf("template %q is not a valid template name", in.Template)
	}
	if in.Backend != "" && !backends[in.Backend] {
		return out, invalidf("backend must be firecracker, qemu, gvisor or runc, not %q", in.Backend)
	}
	if res := in.Resolution; res != nil && (res.Width != 0 || res.Height != 0) {
		if res.Width < minWidth || res.Width > maxWidth || res.Height < minHeight || res.Height > maxHeight {
			return out, invalidf("resolution %dx%d is out of range %d..%d x %d..%d",
				res.Width, res.Height, minWidth, maxWidth, minHeight, maxHeight)
		}
		out.Resolution = *res
	}
	for _, c := range []struct {
		name     string
		v        int
		min, max int
	}{
		{"dpi", in.DPI, minDPI, maxDPI},
		{"vcpus", in.VCPUs, minVCPUs, maxVCPUs},
		{"memory_mb", in.MemoryMB, minMemoryMB, maxMemoryMB},
	} {
		if c.v != 0 && (c.v < c.min || c.v > c.max) {
			return out, invalidf("%s must be %d..%d, not %d", c.name, c.min, c.max, c.v)
		}
	}
	if err := checkTimeout("timeout_seconds", in.TimeoutSeconds); err != nil {
		return out, err
	}
	if err := checkTimeout("idle_timeout_seconds", in.IdleTimeoutSeconds); err != nil {
		return out, err
	}
	if in.StartURL != "" {
		if err := checkStartURL(in.StartURL); err != nil {
			return out, err
		}
	}
	if err := checkEnv(in.Env); err != nil {
		return out, err
	}
	if err := checkMetadata(in.Metadata); err != nil {
		return out, err
	}
	if in.Network != nil {
		out.Network = sandbox.Network{Egress: in.Network.Egress.mode, Allow: in.Network.Egress.allow}
	}
	return out, nil
}

func checkTimeout(name string, v int) error {
	if v < 0 || v > maxTimeoutSeconds {
		return invalidf("%s must be 0..%d, not %d", name, maxTimeoutSeconds, v)
	}
	return nil
}

func checkStartURL(s string) error {
	if len(s) > maxStartURLBytes {
		return invalidf("start_url is longer than %d bytes", maxStartURLBytes)
	}
	u, err := url.Parse(s)
	if err != nil || strings.ContainsAny(s, " \t\r\n") {
		return invalidf("start_url is not a valid URL")
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
		if u.Host == "" {
			return invalidf("start_url %q has no host", s)
		}
	case "about", "file":
	default:
		return invalidf("start_url must be an http, https, about or file URL")
	}
	return nil
}

func checkEnv(env map[string]string) error {
	if len(env) > maxEnvVars {
		return invalidf("env has %d variables (at most %d)", len(env), maxEnvVars)
	}
	for k, v := range env {
		if len(k) > maxEnvKeyBytes || !envKey.MatchString(k) {
			return invalidf("env: %q is not a valid variable name", k)
		}
		if len(v) > maxEnvValueBytes {
			return invalidf("env: the value of %s is longer than %d bytes", k, maxEnvValueBytes)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return invalidf("env: the value of %s contains a NUL byte", k)
		}
	}
	return nil
}

func checkMetadata(md map[string]string) error {
	if len(md) > maxMetadataPairs {
		return invalidf("metadata has %d keys (at most %d)", len(md), maxMetadataPairs)
	}
	for k, v := range md {
		if k == "" || len(k) > maxMetadataKeyBytes || !utf8.ValidString(k) || hasControl(k) {
			return invalidf("metadata: %q is not a valid key (1..%d printable bytes)", k, maxMetadataKeyBytes)
		}
		if len(v) > maxMetadataValueBytes || !utf8.ValidString(v) {
			return invalidf("metadata: the value of %q is longer than %d bytes", k, maxMetadataValueBytes)
		}
	}
	return nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// pathID returns the sandbox id of the request's path, or a 404 error when
// it cannot be a sandbox id.
func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !sandboxID.MatchString(id) {
		return "", &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "sandbox not found"}
	}
	return id, nil
}

func (s *server) createSandbox(w http.ResponseWriter, r *http.Request) {
	if !s.create.Allow() {
		w.Header().Set("Retry-After", "1")
		s.writeError(w, r, &httpError{status: http.StatusTooManyRequests, code: codeRateLimited,
			msg: "too many sandbox creations; retry later"})
		return
	}
	wait := true
	if v := r.URL.Query().Get("wait"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.writeError(w, r, invalidf("wait must be true or false, not %q", v))
			return
		}
		wait = b
	}
	body, err := readBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req, err := parseCreateRequest(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req.Owner = s.keys.Owner(r)
	sb, err := s.mgr.Create(r.Context(), req, wait)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	writeJSON(w, http.StatusCreated, sb)
}

func (s *server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	var f sandbox.Filter
	for k, vs := range r.URL.Query() {
		switch {
		case k == "state":
			st := sandbox.State(vs[0])
			if len(vs) != 1 || !states[st] {
				s.writeError(w, r, invalidf("state must be one of starting, running, stopping, stopped, failed"))
				return
			}
			f.State = st
		case strings.HasPrefix(k, "metadata."):
			key := strings.TrimPrefix(k, "metadata.")
			if key == "" || len(vs) != 1 {
				s.writeError(w, r, invalidf("metadata filters are metadata.KEY=VALUE, each key once"))
				return
			}
			if f.Metadata == nil {
				f.Metadata = map[string]string{}
			}
			f.Metadata[key] = vs[0]
		}
	}
	list := s.mgr.List(r.Context(), f)
	if list == nil {
		list = []sandbox.Sandbox{}
	}
	writeJSON(w, http.StatusOK, struct {
		Sandboxes []sandbox.Sandbox `json:"sandboxes"`
	}{list})
}

func (s *server) getSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mgr.Destroy(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) setTimeout(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var in struct {
		TimeoutSeconds *int `json:"timeout_seconds"`
	}
	if err := decodeJSON(w, r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	if in.TimeoutSeconds == nil {
		s.writeError(w, r, invalidf("timeout_seconds is required"))
		return
	}
	if err := checkTimeout("timeout_seconds", *in.TimeoutSeconds); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.mgr.SetTimeout(r.Context(), id, *in.TimeoutSeconds)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}
