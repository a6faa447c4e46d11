package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// Snapshot is a running sandbox saved as it was — memory, programs, the
// page on its screen, files — by this API key. Sandboxes start from it
// (CreateRequest.FromSnapshot) any number of times, until DeleteSnapshot,
// whatever became of the sandbox it was taken of.
type Snapshot struct {
	ID string `json:"id"`
	// Name is the optional name it was given; calls may use it instead
	// of the ID.
	Name string `json:"name,omitempty"`
	// SandboxID is the sandbox it was taken of.
	SandboxID  string     `json:"sandbox_id"`
	Template   string     `json:"template"`
	Backend    string     `json:"backend"`
	Resolution Resolution `json:"resolution"`
	VCPUs      int        `json:"vcpus,omitempty"`
	MemoryMB   int        `json:"memory_mb,omitempty"`
	// SizeBytes is the host disk it takes.
	SizeBytes int64             `json:"size_bytes"`
	CreatedAt time.Time         `json:"created_at"`
	Metadata  map[string]string `json:"metadata"`
}

// SnapshotOptions are the optional parts of CreateSnapshot.
type SnapshotOptions struct {
	// Name names the snapshot, uniquely among this key's.
	Name     string            `json:"name,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

var errEmptySnapshot = errors.New("client: empty snapshot id or name")

func snapshotPath(ref string) string { return "/v1/snapshots/" + url.PathEscape(ref) }

// CreateSnapshot saves the running sandbox id as a snapshot of this key;
// the sandbox runs on, stopped for the time the copy takes. A backend
// that cannot snapshot answers CodeNotSupported; a sandbox not running or
// holding volumes, or a name in use, CodeConflict. It is not retried.
func (c *Client) CreateSnapshot(ctx context.Context, id string, opts SnapshotOptions) (Snapshot, error) {
	if err := checkID(id); err != nil {
		return Snapshot{}, err
	}
	body, n, err := jsonBody(opts)
	if err != nil {
		return Snapshot{}, err
	}
	var s Snapshot
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "snapshots"), body: body, contentLen: n, contentType: "application/json"}, &s)
	return s, err
}

// ListSnapshots returns this key's snapshots, oldest first; with a
// sandbox id, only those taken of it.
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]Snapshot, error) {
	var q url.Values
	if sandboxID != "" {
		q = url.Values{"sandbox_id": {sandboxID}}
	}
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/snapshots", query: q, retry: true}, &out)
	return out.Snapshots, err
}

// GetSnapshot returns one snapshot by ID or name; an unknown one (or
// another key's) yields an error for which IsNotFound is true.
func (c *Client) GetSnapshot(ctx context.Context, ref string) (Snapshot, error) {
	if ref == "" {
		return Snapshot{}, errEmptySnapshot
	}
	var s Snapshot
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: snapshotPath(ref), retry: true}, &s)
	return s, err
}

// DeleteSnapshot removes a snapshot and its files; the sandboxes started
// from it run on. While a sandbox is starting from it, the error is one
// for which IsConflict is true.
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) error {
	if ref == "" {
		return errEmptySnapshot
	}
	return c.doJSON(ctx, &request{method: http.MethodDelete, path: snapshotPath(ref), retry: true}, nil)
}
