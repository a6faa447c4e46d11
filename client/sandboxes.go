package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Sandbox states (Sandbox.State).
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StatePausing  = "pausing"
	StatePaused   = "paused" // saved to disk; Resume brings it back
	StateResuming = "resuming"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateFailed   = "failed"
	// StateLost is a cluster's: the sandbox's node has left the cluster
	// (its lease expired); it is running again if the node comes back.
	StateLost = "lost"
)

// Egress policies for Network.Egress. An allow-list is given with
// Network.Allow instead.
const (
	EgressNone = "none"
	EgressAll  = "all"
)

// Resolution is a screen size in pixels.
type Resolution struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// String returns "WIDTHxHEIGHT".
func (r Resolution) String() string { return fmt.Sprintf("%dx%d", r.Width, r.Height) }

// Network is a sandbox's egress policy. On the wire it is
// {"egress": "none"}, {"egress": "all"} or {"egress": {"allow": ["CIDR", ...]}}:
// a non-empty Allow selects the allow-list form and Egress must then be "".
type Network struct {
	// Egress is EgressNone or EgressAll ("" with Allow set, or for the
	// daemon's default).
	Egress string
	// Allow lists the CIDRs the sandbox may reach.
	Allow []string
}

type allowList struct {
	Allow []string `json:"allow"`
}

// MarshalJSON encodes n in API.md's form.
func (n Network) MarshalJSON() ([]byte, error) {
	switch {
	case len(n.Allow) > 0 && n.Egress != "":
		return nil, fmt.Errorf("network: egress %q and an allow-list are exclusive", n.Egress)
	case len(n.Allow) > 0:
		return json.Marshal(struct {
			Egress allowList `json:"egress"`
		}{allowList{n.Allow}})
	case n.Egress != "":
		return json.Marshal(struct {
			Egress string `json:"egress"`
		}{n.Egress})
	default:
		return []byte("{}"), nil
	}
}

// UnmarshalJSON decodes either form of "egress".
func (n *Network) UnmarshalJSON(b []byte) error {
	var w struct {
		Egress json.RawMessage `json:"egress"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*n = Network{}
	if len(w.Egress) == 0 || string(w.Egress) == "null" {
		return nil
	}
	if w.Egress[0] == '"' {
		return json.Unmarshal(w.Egress, &n.Egress)
	}
	var a allowList
	if err := json.Unmarshal(w.Egress, &a); err != nil {
		return fmt.Errorf("network.egress: %w", err)
	}
	n.Allow = a.Allow
	return nil
}

// CreateRequest is the body of Create. Zero fields take the daemon's
// defaults.
type CreateRequest struct {
	// Template is the image to boot; the daemon's default is "desktop".
	Template string `json:"template,omitempty"`
	// Backend is firecracker, qemu, gvisor or runc.
	Backend    string      `json:"backend,omitempty"`
	Resolution *Resolution `json:"resolution,omitempty"`
	DPI        int         `json:"dpi,omitempty"`
	VCPUs      int         `json:"vcpus,omitempty"`
	MemoryMB   int         `json:"memory_mb,omitempty"`
	// TimeoutSeconds is the maximum lifetime from now (0 = daemon maximum).
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// IdleTimeoutSeconds reaps the sandbox after this long without API use.
	IdleTimeoutSeconds int `json:"idle_timeout_seconds,omitempty"`
	// StartURL opens Chromium there once the desktop is up.
	StartURL string            `json:"start_url,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Network  *Network          `json:"network,omitempty"`
	// Volumes are attached read-write for the sandbox's life (gvisor,
	// runc and qemu). Each must be this key's and free: a volume another sandbox
	// holds yields an error for which IsConflict is true.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// AutoPause makes the sandbox's lifetime and idle timeouts pause it
	// instead of destroying it (on a backend that can pause; see
	// Capabilities).
	AutoPause bool `json:"auto_pause,omitempty"`
	// FromSnapshot starts the sandbox from one of this key's snapshots
	// (its ID or name; see CreateSnapshot) instead of booting it: it has
	// the snapshot's memory, programs and files, and an identity of its
	// own. Leave the shape (template, backend, resolution, DPI, vCPUs,
	// memory) out, or give the snapshot's; StartURL, Env and Volumes
	// cannot be set.
	FromSnapshot string `json:"from_snapshot,omitempty"`
}

// VolumeMount attaches the volume Name at Path (absolute) in a sandbox.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Sandbox is the daemon's view of one sandbox.
type Sandbox struct {
	ID string `json:"id"`
	// State is one of the State constants.
	State    string `json:"state"`
	Template string `json:"template"`
	Backend  string `json:"backend"`
	// Isolation is vm, gvisor or namespace.
	Isolation    string            `json:"isolation"`
	Resolution   Resolution        `json:"resolution"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	LastActiveAt time.Time         `json:"last_active_at"`
	Metadata     map[string]string `json:"metadata"`
	IP           string            `json:"ip,omitempty"`
	// Volumes are the volumes the sandbox holds.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Desktop is false for a headless sandbox: its image has no X server,
	// so screenshots, input and the live view answer CodeNoDesktop (see
	// IsNoDesktop); commands and files work. It is nil until the sandbox
	// has started (still starting, or failed before).
	Desktop *bool `json:"desktop,omitempty"`
	// Error says why the sandbox failed; set only in StateFailed.
	Error string `json:"error,omitempty"`
	// PausedAt is when a paused sandbox paused, and PausedBytes what it
	// takes on the host's disk; zero otherwise.
	PausedAt    time.Time `json:"paused_at,omitzero"`
	PausedBytes int64     `json:"paused_bytes,omitempty"`
	// AutoPause is set when its timers pause it instead of destroying it.
	AutoPause bool `json:"auto_pause,omitempty"`
	// FromSnapshot is the snapshot it was started from, if any.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Node is the cluster node it runs on; empty on a single host.
	Node string `json:"node,omitempty"`
}

// UnmarshalJSON decodes a Sandbox, taking an empty time string for the zero
// time instead of failing on it.
func (s *Sandbox) UnmarshalJSON(b []byte) error {
	type plain Sandbox
	var w struct {
		*plain
		CreatedAt    optTime `json:"created_at"`
		ExpiresAt    optTime `json:"expires_at"`
		LastActiveAt optTime `json:"last_active_at"`
	}
	w.plain = (*plain)(s)
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	s.CreatedAt, s.ExpiresAt, s.LastActiveAt = time.Time(w.CreatedAt), time.Time(w.ExpiresAt), time.Time(w.LastActiveAt)
	return nil
}

// optTime is an RFC 3339 time that may be "" or null.
type optTime time.Time

func (t *optTime) UnmarshalJSON(b []byte) error {
	var s *string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == nil || *s == "" {
		*t = optTime{}
		return nil
	}
	v, err := time.Parse(time.RFC3339Nano, *s)
	if err != nil {
		return err
	}
	*t = optTime(v)
	return nil
}

// CreateOption modifies a Create call.
type CreateOption func(*createOptions)

type createOptions struct{ noWait bool }

// WithoutWait makes Create return at once with the sandbox in StateStarting
// (?wait=false) instead of waiting until its desktop is ready. Poll Get to
// see it reach StateRunning or StateFailed.
func WithoutWait() CreateOption { return func(o *createOptions) { o.noWait = true } }

// Create starts a sandbox. By default it returns once the desktop is
// usable (the image's session complete: keys typed at once reach
// Chromium), which takes as long as the boot, or the restore of a boot
// template; on failure the daemon leaves nothing behind. Create is never
// retried.
func (c *Client) Create(ctx context.Context, req CreateRequest, opts ...CreateOption) (Sandbox, error) {
	var o createOptions
	for _, f := range opts {
		f(&o)
	}
	body, n, err := jsonBody(req)
	if err != nil {
		return Sandbox{}, err
	}
	r := &request{method: http.MethodPost, path: "/v1/sandboxes", body: body, contentLen: n, contentType: "application/json"}
	if o.noWait {
		r.query = url.Values{"wait": {"false"}}
	}
	var s Sandbox
	err = c.doJSON(ctx, r, &s)
	return s, err
}

// ListOptions filters List. Zero fields match every sandbox.
type ListOptions struct {
	// State keeps only sandboxes in this state.
	State string
	// Metadata keeps only sandboxes whose metadata has all these pairs.
	Metadata map[string]string
}

// List returns the sandboxes matching opts.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	for k, v := range opts.Metadata {
		q.Set("metadata."+k, v)
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes", query: q, retry: true}, &out)
	return out.Sandboxes, err
}

// Get returns the sandbox id. An unknown id yields an error for which
// IsNotFound is true.
func (c *Client) Get(ctx context.Context, id string) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	var s Sandbox
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: sandboxPath(id), retry: true}, &s)
	return s, err
}

// Destroy stops the sandbox id and frees everything it holds; it returns
// once that is done. An unknown id yields an error for which IsNotFound is
// true (so a retried Destroy whose first attempt succeeded reports
// not_found).
func (c *Client) Destroy(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return c.doJSON(ctx, &request{method: http.MethodDelete, path: sandboxPath(id), retry: true}, nil)
}

// SetTimeout sets the sandbox's expiry to seconds from now and returns the
// sandbox with its new ExpiresAt.
func (c *Client) SetTimeout(ctx context.Context, id string, seconds int) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	body, n, err := jsonBody(map[string]int{"timeout_seconds": seconds})
	if err != nil {
		return Sandbox{}, err
	}
	var s Sandbox
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "timeout"), body: body, contentLen: n, contentType: "application/json"}, &s)
	return s, err
}

// Pause saves a running sandbox to disk and returns it paused: its
// memory, processes and files are kept, it holds no CPU or memory, and
// it expires at the daemon's paused lifetime. A backend that cannot
// pause answers CodeNotSupported; a sandbox not running, CodeConflict.
func (c *Client) Pause(ctx context.Context, id string) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	var s Sandbox
	err := c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "pause")}, &s)
	return s, err
}

// Resume brings a paused sandbox back as it was and returns it running,
// expiring seconds from now (0: with the running time it had left when
// it paused).
func (c *Client) Resume(ctx context.Context, id string, seconds int) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	body, n, err := jsonBody(map[string]int{"timeout_seconds": seconds})
	if err != nil {
		return Sandbox{}, err
	}
	var s Sandbox
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "resume"), body: body, contentLen: n, contentType: "application/json"}, &s)
	return s, err
}

// Fork copies a running sandbox, as it is, into count new running
// sandboxes (1..10), each with its own id, token, hostname, machine-id
// and address; the sandbox runs on. A backend that cannot fork answers
// CodeNotSupported; a sandbox not running or holding volumes,
// CodeConflict.
func (c *Client) Fork(ctx context.Context, id string, count int) ([]Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	body, n, err := jsonBody(map[string]int{"count": count})
	if err != nil {
		return nil, err
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "fork"), body: body, contentLen: n, contentType: "application/json"}, &out)
	return out.Sandboxes, err
}

// errEmptyID is returned for calls naming no sandbox, which would otherwise
// address a different endpoint.
var errEmptyID = errors.New("client: empty sandbox id")

func checkID(id string) error {
	if id == "" {
		return errEmptyID
	}
	return nil
}
