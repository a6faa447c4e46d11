package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/strictjson"
)

// Bounds of what this API accepts. What a create may ask for is bounded by
// the rules every API shares (sandbox.ValidateCreate), so both doors admit
// the same sandboxes.
const (
	maxBodyBytes = 1 << 20
	maxListLimit = 100
	maxIDBytes   = 128

	// v1DefaultTimeout and v2DefaultTimeout are the spec's defaults of
	// NewSandbox.timeout (v1) and NewSandboxV2.timeout / ConnectSandboxV2.timeout.
	v1DefaultTimeout = 15
	v2DefaultTimeout = 300
	// v1DefaultResumeTimeout is the timeout of E2B's deprecated resume
	// when its body has none (its ResumedSandbox default).
	v1DefaultResumeTimeout = 15

	// idleNever is the idle timeout of E2B sandboxes: out of reach, since
	// E2B has no idle reaper (see the package doc).
	idleNever = 366 * 24 * 3600
)

var sandboxID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// newSandbox is the wire form of E2B's NewSandbox and NewSandboxV2. Fields
// this package ignores are not declared, so any value of theirs decodes.
type newSandbox struct {
	TemplateID          *string           `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	EnvVars             map[string]string `json:"envVars"`
	Metadata            map[string]string `json:"metadata"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	AutoPause           *bool             `json:"autoPause"`
	AutoResume          *struct {
		Enabled *bool `json:"enabled"`
	} `json:"autoResume"`
	Network      *networkConfig    `json:"network"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
}

// networkConfig is the part of E2B's SandboxNetworkConfig that changes
// where a sandbox's traffic may go.
type networkConfig struct {
	AllowOut    []string        `json:"allowOut"`
	DenyOut     []string        `json:"denyOut"`
	EgressProxy json.RawMessage `json:"egressProxy"`
}

// createParams is a decoded, validated create request.
type createParams struct {
	template string // the E2B template name the client used
	req      sandbox.CreateRequest
}

// fromSnapshot reports whether the create starts from a snapshot.
func (p createParams) fromSnapshot() bool { return p.req.FromSnapshot != "" }

// parseNewSandbox decodes and validates a create body; defaultTimeout
// applies when it has no timeout. Errors are 400s with a user message.
func (s *Server) parseNewSandbox(body []byte, defaultTimeout int) (createParams, error) {
	var in newSandbox
	if err := decodeJSON(body, &in, false); err != nil {
		return createParams{}, err
	}
	if in.TemplateID == nil || *in.TemplateID == "" {
		return createParams{}, badRequestf("templateID is required")
	}
	name := *in.TemplateID
	tmpl, ok := s.templates[name]
	var snapshot string
	if !ok {
		// E2B's snapshots are templates: Sandbox.create(snapshotId).
		// Whether the key has one of that ID or name, only the create
		// can tell.
		if sandbox.CheckSnapshotRef("templateID", name) != nil {
			return createParams{}, s.unknownTemplate(name)
		}
		snapshot = name
	}
	timeout, err := timeoutSeconds(in.Timeout, defaultTimeout)
	if err != nil {
		return createParams{}, err
	}
	if in.AutoResume != nil && in.AutoResume.Enabled != nil && *in.AutoResume.Enabled {
		return createParams{}, badRequestf("autoResume is not supported: cubicle resumes a paused sandbox on connect (or resume), not on traffic")
	}
	volumes, err := volumeMounts(in.VolumeMounts)
	if err != nil {
		return createParams{}, err
	}
	network, err := egress(in.AllowInternetAccess, in.Network)
	if err != nil {
		return createParams{}, err
	}
	backend := s.cfg.Backend
	if snapshot != "" {
		backend = "" // the snapshot's
	}
	req, err := sandbox.ValidateCreate(sandbox.CreateRequest{
		Template:           tmpl,
		Backend:            backend,
		FromSnapshot:       snapshot,
		TimeoutSeconds:     timeout,
		IdleTimeoutSeconds: idleNever,
		Env:                in.EnvVars,
		Metadata:           in.Metadata,
		Network:            network,
		Volumes:            volumes,
		AutoPause:          in.AutoPause != nil && *in.AutoPause,
	})
	if err != nil {
		return createParams{}, inE2BWords(err)
	}
	return createParams{template: name, req: req}, nil
}

// volumeMounts decodes E2B's volumeMounts ([{name, path}]: the SDK's
// {path: volume} map) into cubicle volumes of the same key; the shared
// rules check names and paths.
func volumeMounts(raw []json.RawMessage) ([]sandbox.VolumeMount, error) {
	var out []sandbox.VolumeMount
	for i, r := range raw {
		var m struct {
			Name *string `json:"name"`
			Path *string `json:"path"`
		}
		if err := json.Unmarshal(r, &m); err != nil || m.Name == nil || m.Path == nil {
			return nil, badRequestf("volumeMounts[%d] must be {\"name\": string, \"path\": string}", i)
		}
		out = append(out, sandbox.VolumeMount{Name: *m.Name, Path: *m.Path})
	}
	return out, nil
}

// e2bFields are the E2B names of the fields of the shared create rules
// that an E2B body sets under another name.
var e2bFields = map[string]string{
	"env":                  "envVars",
	"timeout_seconds":      "timeout",
	"network.egress.allow": "network.allowOut",
}

// inE2BWords turns an error of the shared create rules into a 400 that
// names the field as E2B's body does.
func inE2BWords(err error) error {
	var fe *sandbox.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	named := *fe
	if n, ok := e2bFields[fe.Field]; ok {
		named.Field = n
	} else if rest, ok := strings.CutPrefix(fe.Field, "volumes"); ok {
		named.Field = "volumeMounts" + rest
	}
	return badRequestf("%s", named.Error())
}

// unknownTemplate is the answer to a create from a template that is
// neither a template nor one of the key's snapshots.
func (s *Server) unknownTemplate(name string) error {
	return badRequestf("unknown template %q; known templates: %s (or one of your snapshots)",
		truncate(name, 64), strings.Join(s.knownTemplates(), ", "))
}

// knownTemplates lists the E2B template names, sorted.
func (s *Server) knownTemplates() []string {
	names := make([]string, 0, len(s.templates))
	for n := range s.templates {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// timeoutBody is the body of POST .../timeout and .../connect.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// parseTimeoutBody decodes a timeout or connect body. With required, the
// body and its timeout must be there (v1 timeout and connect); without, an
// empty body or a missing timeout means def (v2 connect).
func parseTimeoutBody(body []byte, required bool, def int) (int, error) {
	var in timeoutBody
	if err := decodeJSON(body, &in, !required); err != nil {
		return 0, err
	}
	if in.Timeout == nil && required {
		return 0, badRequestf("timeout is required")
	}
	return timeoutSeconds(in.Timeout, def)
}

// parsePauseBody decodes the optional body of POST .../pause. memory:
// false asks for a pause that keeps only the files; cubicle always keeps
// the memory too, which loses nothing the caller wanted.
func parsePauseBody(body []byte) error {
	var in struct {
		Memory *bool `json:"memory"`
	}
	return decodeJSON(body, &in, true)
}

// maxE2BForks is the most forks E2B's API takes in one call; cubicle
// makes at most sandbox.MaxForks.
const maxE2BForks = 100

// parseForkBody reads POST /sandboxes/{id}/fork's {timeout, count}: the
// forks' timeout in seconds (0: the parent's) and how many (default 1).
func parseForkBody(body []byte) (seconds, count int, err error) {
	var in struct {
		Timeout *int64 `json:"timeout"`
		Count   *int64 `json:"count"`
	}
	if err := decodeJSON(body, &in, true); err != nil {
		return 0, 0, err
	}
	if in.Timeout != nil {
		if seconds, err = timeoutSeconds(in.Timeout, 0); err != nil {
			return 0, 0, err
		}
	}
	count = 1
	if in.Count != nil {
		if *in.Count < 1 || *in.Count > maxE2BForks {
			return 0, 0, badRequestf("count must be 1..%d, not %d", maxE2BForks, *in.Count)
		}
		if *in.Count > sandbox.MaxForks {
			return 0, 0, badRequestf("cubicle forks at most %d sandboxes at once, not %d", sandbox.MaxForks, *in.Count)
		}
		count = int(*in.Count)
	}
	return seconds, count, nil
}

// timeoutSeconds validates an E2B timeout: int32 seconds, at least 0. E2B
// reads 0 as "expire now" while cubicle's manager reads it as "the
// maximum", so 0 becomes the smallest timeout the manager can express.
// Above sandbox.MaxTimeoutSeconds it is capped, not refused: E2B's server
// caps a timeout at the longest a sandbox may live, and the SDKs expect
// that.
func timeoutSeconds(t *int64, def int) (int, error) {
	if t == nil {
		return def, nil
	}
	if *t < 0 || *t > math.MaxInt32 {
		return 0, badRequestf("timeout must be 0..%d seconds, not %d", math.MaxInt32, *t)
	}
	return int(min(max(*t, 1), sandbox.MaxTimeoutSeconds)), nil
}

// egress maps E2B's internet and network options onto cubicle's egress
// policy, and refuses what that policy cannot say rather than quietly
// allowing more or less than asked.
func egress(allowInternet *bool, n *networkConfig) (sandbox.Network, error) {
	denyAll := allowInternet != nil && !*allowInternet
	var allowOut []string
	if n != nil {
		if p := bytes.TrimSpace(n.EgressProxy); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
			return sandbox.Network{}, badRequestf("network.egressProxy is not supported by cubicle")
		}
		for i, d := range n.DenyOut {
			switch strings.TrimSpace(d) {
			case "0.0.0.0/0", "::/0":
				denyAll = true
			default:
				return sandbox.Network{}, badRequestf("network.denyOut[%d]: cubicle can only deny all traffic (0.0.0.0/0), not %q; deny all and list what to allow in allowOut",
					i, truncate(d, 64))
			}
		}
		allowOut = n.AllowOut
	}
	if !denyAll {
		if allowInternet != nil && *allowInternet {
			return sandbox.Network{Egress: "all"}, nil
		}
		// allowOut alone allows nothing more than E2B's default, so the
		// daemon's default stands.
		return sandbox.Network{}, nil
	}
	if len(allowOut) == 0 {
		return sandbox.Network{Egress: "none"}, nil
	}
	// Each entry is checked, and masked, by sandbox.ValidateCreate.
	return sandbox.Network{Allow: slices.Clone(allowOut)}, nil
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

// listQuery is a decoded GET /v2/sandboxes query.
type listQuery struct {
	metadata     map[string]string // nil: no filter
	running      bool              // running sandboxes were asked for
	paused       bool              // paused sandboxes were asked for
	template     string            // "": any
	startedAfter time.Time         // zero: any
	asc          bool              // oldest first (default newest first)
	limit        int
	after        *cursor // nil: from the start
}

// parseListQuery decodes the query of GET /v2/sandboxes. Errors are 400s.
func parseListQuery(q url.Values) (listQuery, error) {
	out := listQuery{running: true, paused: true, limit: maxListLimit}
	md, err := parseMetadataFilter(q.Get("metadata"))
	if err != nil {
		return listQuery{}, err
	}
	out.metadata = md
	// state is an exploded-false array (state=running,paused); repeating the
	// parameter works too. Without it E2B lists running and paused ones.
	var states []string
	for _, v := range q["state"] {
		for st := range strings.SplitSeq(v, ",") {
			switch st = strings.TrimSpace(st); st {
			case "":
			case "running", "paused":
				states = append(states, st)
			default:
				return listQuery{}, badRequestf("state must be running or paused, not %q", truncate(st, 32))
			}
		}
	}
	if len(states) > 0 {
		out.running = slices.Contains(states, "running")
		out.paused = slices.Contains(states, "paused")
	}
	out.template = q.Get("template")
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return listQuery{}, badRequestf("startedAfter must be an RFC 3339 date-time, not %q", truncate(v, 64))
		}
		out.startedAfter = t
	}
	switch v := q.Get("order"); v {
	case "", "desc":
	case "asc":
		out.asc = true
	default:
		return listQuery{}, badRequestf("order must be asc or desc, not %q", truncate(v, 32))
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return listQuery{}, badRequestf("limit must be a positive integer, not %q", truncate(v, 32))
		}
		// E2B caps the page size rather than refusing a larger one.
		out.limit = min(n, maxListLimit)
	}
	if v := q.Get("nextToken"); v != "" {
		c, err := decodeCursor(v)
		if err != nil {
			return listQuery{}, badRequestf("invalid nextToken")
		}
		out.after = &c
	}
	return out, nil
}

// parseMetadataFilter decodes E2B's metadata filter, "k=v&k2=v2" with each
// key and value URL-encoded. The JS SDK encodes the pairs once more as a
// whole before the query string encodes the parameter, so after the query
// is parsed the whole is unescaped once, then each key and value, as E2B
// does. An empty filter filters nothing.
func parseMetadataFilter(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	whole, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, badRequestf("metadata is not URL-encoded correctly")
	}
	out := map[string]string{}
	for pair := range strings.SplitSeq(whole, "&") {
		if pair == "" {
			continue
		}
		// The first "=" separates: a value may contain one once its own
		// encoding has been undone by a client that encodes only once.
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, badRequestf("metadata: %q is not a key=value pair", truncate(pair, 64))
		}
		key, err := url.QueryUnescape(k)
		if err != nil || key == "" {
			return nil, badRequestf("metadata: %q is not a valid key", truncate(k, 64))
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return nil, badRequestf("metadata: the value of %q is not URL-encoded correctly", truncate(key, 64))
		}
		if len(out) >= sandbox.MaxMetadataPairs {
			return nil, badRequestf("metadata filters on more than %d keys", sandbox.MaxMetadataPairs)
		}
		out[key] = val
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// cursor is a position in a listing: the last sandbox of the previous page.
type cursor struct {
	created time.Time
	id      string
}

// encodeCursor returns the nextToken that continues after sb. The token is
// opaque to clients; it names a position rather than an offset, so
// sandboxes that come and go between pages shift nothing.
func encodeCursor(sb sandbox.Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(sb.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + sb.ID))
}

// decodeCursor is the inverse of encodeCursor.
func decodeCursor(tok string) (cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return cursor{}, fmt.Errorf("decode next token: %w", err)
	}
	ts, id, ok := strings.Cut(string(raw), "|")
	if !ok || !sandboxID.MatchString(id) {
		return cursor{}, errors.New("malformed next token")
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return cursor{}, fmt.Errorf("next token time: %w", err)
	}
	return cursor{created: t, id: id}, nil
}

// readBody reads a request body of at most limit bytes (see
// strictjson.ReadBody; classify answers its errors).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return strictjson.ReadBody(w, r, limit)
}

// decodeJSON decodes exactly one JSON value into v (see strictjson.Decode),
// except that unknown fields are accepted: E2B's SDKs send fields newer
// than this package. An empty body is an error unless optional.
func decodeJSON(data []byte, v any, optional bool) error {
	err := strictjson.DecodeWith(data, v, strictjson.Options{AllowUnknownFields: true, AllowEmpty: optional})
	var je *strictjson.Error
	if errors.As(err, &je) {
		return badRequestf("invalid JSON body: %s", je.Error())
	}
	return err
}
