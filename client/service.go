package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Backend describes one sandbox backend of the daemon.
type Backend struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Isolation is vm, gvisor or namespace.
	Isolation string `json:"isolation"`
	// Reason says why the backend is unavailable.
	Reason string `json:"reason,omitempty"`
	// Capabilities are what its sandboxes can do on this host.
	Capabilities Capabilities `json:"capabilities"`
	// Runtime is the program it runs sandboxes with (runsc for gvisor,
	// runc), when it has one.
	Runtime *Runtime `json:"runtime,omitempty"`
}

// Runtime names a backend's runtime program and the version it reports.
type Runtime struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Version string `json:"version,omitempty"`
}

// Capabilities are a backend's optional features.
type Capabilities struct {
	Volumes bool `json:"volumes"`
	// Pause is set when its sandboxes can pause and resume here;
	// PauseReason says why not otherwise.
	Pause       bool   `json:"pause"`
	PauseReason string `json:"pause_reason,omitempty"`
	// Snapshot is set when its sandboxes can be snapshotted and started
	// from snapshots here; SnapshotReason says why not otherwise.
	Snapshot       bool   `json:"snapshot"`
	SnapshotReason string `json:"snapshot_reason,omitempty"`
}

// Capacity is how many sandboxes the daemon runs and may run.
type Capacity struct {
	MaxSandboxes int `json:"max_sandboxes"`
	Running      int `json:"running"`
}

// Info describes the daemon (GET /v1/info).
type Info struct {
	Version        string    `json:"version"`
	Backends       []Backend `json:"backends"`
	DefaultBackend string    `json:"default_backend"`
	Capacity       Capacity  `json:"capacity"`
	Pools          []Pool    `json:"pools"`
	// Cluster is the answering node's view of its cluster; nil on a
	// single host.
	Cluster *Cluster `json:"cluster,omitempty"`
}

// Cluster is a node's view of its cluster (cubicled --cluster-etcd).
type Cluster struct {
	// Node is the answering node's name.
	Node string `json:"node"`
	// Degraded says why the node cannot reach the cluster's store (then
	// it serves its own sandboxes and creates on itself only).
	Degraded string `json:"degraded,omitempty"`
	Draining bool   `json:"draining"`
	// Nodes are the live members.
	Nodes []ClusterNode `json:"nodes"`
}

// ClusterNode is one live member of a cluster and its load.
type ClusterNode struct {
	Name         string         `json:"name"`
	URL          string         `json:"url"`
	Version      string         `json:"version"`
	Started      time.Time      `json:"started"`
	Updated      time.Time      `json:"updated"`
	Backends     []string       `json:"backends"`
	MaxSandboxes int            `json:"max_sandboxes"`
	Live         int            `json:"live"`
	FreeMemoryMB int64          `json:"free_memory_mb"`
	Pools        map[string]int `json:"pools,omitempty"`
	Draining     bool           `json:"draining,omitempty"`
}

// Pool is one warm pool of the daemon (cubicled --pool): Ready of its
// Size desktops are booted and waiting for a create of Template at
// Width×Height on Backend.
type Pool struct {
	Pool     string `json:"pool"`
	Backend  string `json:"backend"`
	Template string `json:"template"`
	Width    int    `json:"width"`
	Height   int    `json:"height"`
	Size     int    `json:"size"`
	Ready    int    `json:"ready"`
}

// Info returns the daemon's version, backends and capacity.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var out Info
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/info", retry: true}, &out)
	return out, err
}

// Health returns nil when the daemon answers GET /healthz with status "ok".
// It needs no API key.
func (c *Client) Health(ctx context.Context) error {
	var out struct {
		Status string `json:"status"`
	}
	if err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/healthz", retry: true}, &out); err != nil {
		return err
	}
	if out.Status != "ok" {
		return fmt.Errorf("daemon health: status %q", out.Status)
	}
	return nil
}

// ViewRequest asks for a live-view URL.
type ViewRequest struct {
	// TTLSeconds is how long the URL works (0: daemon default).
	TTLSeconds int `json:"ttl_seconds,omitempty"`
	// ViewOnly lets the viewer watch but not control the desktop.
	ViewOnly bool `json:"view_only"`
}

// View is a live-view URL: a noVNC page that needs no API key until it
// expires.
type View struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
	// ViewOnly is whether the link forbids input.
	ViewOnly bool `json:"view_only"`
}

// UnmarshalJSON decodes a View, taking an empty expires_at for the zero
// time.
func (v *View) UnmarshalJSON(b []byte) error {
	type plain View
	var w struct {
		*plain
		ExpiresAt optTime `json:"expires_at"`
	}
	w.plain = (*plain)(v)
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	v.ExpiresAt = time.Time(w.ExpiresAt)
	return nil
}

// View mints a URL for watching (or, without ViewOnly, controlling) the
// sandbox's desktop in a browser. It is never retried.
func (c *Client) View(ctx context.Context, id string, req ViewRequest) (View, error) {
	if err := checkID(id); err != nil {
		return View{}, err
	}
	body, n, err := jsonBody(req)
	if err != nil {
		return View{}, err
	}
	var out View
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "view"), body: body, contentLen: n, contentType: "application/json"}, &out)
	return out, err
}
