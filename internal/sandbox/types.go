package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// State is a sandbox's place in its life; transitions (state.go) lists
// the moves between states.
type State string

// The sandbox states of API.md.
const (
	StateStarting State = "starting"
	StateRunning  State = "running"
	StatePausing  State = "pausing"
	StatePaused   State = "paused"
	StateResuming State = "resuming"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
	// StateLost is never a manager's: in cluster mode the API answers it
	// for a sandbox whose node stopped renewing its membership, until
	// the node comes back (running again) or its sandbox is gone.
	StateLost State = "lost"
)

// Resolution is a screen size in pixels.
type Resolution struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// Network is the egress policy of a sandbox (API.md "network"). Egress is
// "none", "all" or "" with Allow set to a CIDR allow-list.
type Network struct {
	Egress string   `json:"egress,omitempty"`
	Allow  []string `json:"allow,omitempty"`
}

// CreateRequest is the body of POST /v1/sandboxes, already decoded and
// validated by the API layer; zero values mean "daemon default".
type CreateRequest struct {
	Template           string            `json:"template,omitempty"`
	Backend            string            `json:"backend,omitempty"`
	Resolution         Resolution        `json:"resolution"`
	DPI                int               `json:"dpi,omitempty"`
	VCPUs              int               `json:"vcpus,omitempty"`
	MemoryMB           int               `json:"memory_mb,omitempty"`
	TimeoutSeconds     int               `json:"timeout_seconds,omitempty"`
	IdleTimeoutSeconds int               `json:"idle_timeout_seconds,omitempty"`
	StartURL           string            `json:"start_url,omitempty"`
	Env                map[string]string `json:"env,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	Network            Network           `json:"network"`
	// Volumes are attached to the sandbox for its life; each must be the
	// owner's and free.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// AutoPause makes the sandbox's lifetime and idle timers pause it
	// instead of destroying it, where its backend can pause.
	AutoPause bool `json:"auto_pause,omitempty"`
	// FromSnapshot starts the sandbox from a stored snapshot of Owner
	// (its ID or name) instead of booting it: it has the snapshot's
	// shape, programs and files, and an identity of its own.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Owner is who asks: KeyOwner of the API key, "" without keys. The
	// per-owner quotas (Config.MaxPerOwner, OwnerCreateRate) apply to it.
	// Set by the API layers, never from a request body.
	Owner string `json:"owner,omitempty"`
}

// KeyOwner names the owner of sandboxes created with an API key: a digest,
// so that records and logs never hold the key itself.
func KeyOwner(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return "key-" + hex.EncodeToString(sum[:8])
}

// Sandbox is the API view of one sandbox (API.md "Sandbox object").
type Sandbox struct {
	ID           string            `json:"id"`
	State        State             `json:"state"`
	Template     string            `json:"template"`
	Backend      string            `json:"backend"`
	Isolation    string            `json:"isolation"`
	Resolution   Resolution        `json:"resolution"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	LastActiveAt time.Time         `json:"last_active_at"`
	Metadata     map[string]string `json:"metadata"`
	IP           string            `json:"ip,omitempty"`
	Volumes      []VolumeMount     `json:"volumes,omitempty"`
	// Desktop is false for a headless sandbox: its image has no X server,
	// so only commands and files work. It is nil until the agent has said
	// (a sandbox still starting, or one that failed to), and omitted then.
	// Records from before the field existed read as true (every sandbox
	// had a desktop then).
	Desktop *bool  `json:"desktop,omitempty"`
	Error   string `json:"error,omitempty"`
	// PausedAt is when a paused sandbox paused, and PausedBytes what it
	// takes on the host's disk (memory image and disk); zero otherwise.
	PausedAt    time.Time `json:"paused_at,omitzero"`
	PausedBytes int64     `json:"paused_bytes,omitempty"`
	// AutoPause is the create's auto_pause: its timers pause it.
	AutoPause bool `json:"auto_pause,omitempty"`
	// FromSnapshot is the snapshot the sandbox was started from, if any.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Node is the cluster node the sandbox runs on; empty on a single
	// host.
	Node string `json:"node,omitempty"`
}

// Filter selects sandboxes in List; zero fields match everything.
type Filter struct {
	State    State
	Metadata map[string]string
}

// BackendInfo describes one backend in GET /v1/info.
type BackendInfo struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Isolation string `json:"isolation"`
	Reason    string `json:"reason,omitempty"`
	// Capabilities are what sandboxes of the backend can do beyond the
	// desktop API, on this host.
	Capabilities BackendCapabilities `json:"capabilities"`
	// Runtime is the program the backend runs sandboxes with (runsc,
	// runc), where it has one.
	Runtime *RuntimeInfo `json:"runtime,omitempty"`
}

// RuntimeInfo names a backend's runtime program and its version.
type RuntimeInfo struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Version is what the program says of itself; empty when it did not
	// run.
	Version string `json:"version,omitempty"`
}

// BackendCapabilities are the optional features of a backend.
type BackendCapabilities struct {
	Volumes bool `json:"volumes"`
	Pause   bool `json:"pause"`
	// PauseReason says why sandboxes cannot pause, when they cannot.
	PauseReason string `json:"pause_reason,omitempty"`
	// Snapshot is whether sandboxes can be snapshotted; SnapshotReason says why not, when they cannot.
	Snapshot       bool   `json:"snapshot"`
	SnapshotReason string `json:"snapshot_reason,omitempty"`
}

// Capacity is the daemon's sandbox capacity.
type Capacity struct {
	MaxSandboxes int `json:"max_sandboxes"`
	Running      int `json:"running"`
}

// HasDesktop reports whether the sandbox is known to have a desktop.
func (s Sandbox) HasDesktop() bool { return s.Desktop != nil && *s.Desktop }

// Headless reports whether the sandbox is known to have no desktop.
func (s Sandbox) Headless() bool { return s.Desktop != nil && !*s.Desktop }
