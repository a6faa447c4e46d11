package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Recording is a video of a sandbox's screen made by this API key. It
// outlives its sandbox until ExpiresAt.
type Recording struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	// State is "recording", "stopped" (the file is complete) or
	// "failed" (see Error).
	State  string  `json:"state"`
	Format string  `json:"format"` // "webm" or "mp4"
	FPS    int     `json:"fps"`
	Scale  float64 `json:"scale"`
	Width  int     `json:"width"`
	Height int     `json:"height"`
	// StartedAt and StoppedAt bound the recording; StoppedAt is nil
	// while it runs.
	StartedAt  time.Time  `json:"started_at"`
	StoppedAt  *time.Time `json:"stopped_at,omitempty"`
	DurationMS int64      `json:"duration_ms"`
	// Frames counts the frames encoded: one per change of the screen,
	// and one at the stop.
	Frames    int   `json:"frames"`
	SizeBytes int64 `json:"size_bytes"`
	// StopReason is why it stopped: requested, sandbox_stopped,
	// daemon_stopped, max_duration or encoder_failed.
	StopReason string     `json:"stop_reason,omitempty"`
	Error      string     `json:"error,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
}

// RecordingOptions are the optional settings of StartRecording.
type RecordingOptions struct {
	// FPS is the most frames a second, 1 to 30 (default 5); a frame is
	// taken only when the screen changed.
	FPS int `json:"fps,omitempty"`
	// Scale is the video's size relative to the screen, 0.1 to 1
	// (default 1).
	Scale float64 `json:"scale,omitempty"`
	// Format is "webm" (default, VP8) or "mp4" (H.264).
	Format string `json:"format,omitempty"`
}

var errEmptyRecording = errors.New("client: empty recording id")

func recordingPath(id string, rest ...string) string {
	p := "/v1/recordings/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// StartRecording starts recording the screen of the running sandbox id.
// A sandbox being recorded already answers an error for which IsConflict
// is true. It is not retried.
func (c *Client) StartRecording(ctx context.Context, id string, opts RecordingOptions) (Recording, error) {
	if err := checkID(id); err != nil {
		return Recording{}, err
	}
	body, n, err := jsonBody(opts)
	if err != nil {
		return Recording{}, err
	}
	var r Recording
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "recordings"), body: body, contentLen: n, contentType: "application/json"}, &r)
	return r, err
}

// StopRecording stops recording rid of sandbox id and returns it once its
// file is complete. Stopping a stopped recording returns it as it is.
func (c *Client) StopRecording(ctx context.Context, id, rid string) (Recording, error) {
	if err := checkID(id); err != nil {
		return Recording{}, err
	}
	if rid == "" {
		return Recording{}, errEmptyRecording
	}
	var r Recording
	err := c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "recordings", rid, "stop"), retry: true}, &r)
	return r, err
}

// ListRecordings returns this key's recordings, oldest first; with a
// sandbox id, only those of it (also after the sandbox is gone).
func (c *Client) ListRecordings(ctx context.Context, sandboxID string) ([]Recording, error) {
	var q url.Values
	if sandboxID != "" {
		q = url.Values{"sandbox_id": {sandboxID}}
	}
	var out struct {
		Recordings []Recording `json:"recordings"`
	}
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/recordings", query: q, retry: true}, &out)
	return out.Recordings, err
}

// GetRecording returns one recording; an unknown one (or another key's)
// yields an error for which IsNotFound is true.
func (c *Client) GetRecording(ctx context.Context, rid string) (Recording, error) {
	if rid == "" {
		return Recording{}, errEmptyRecording
	}
	var r Recording
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: recordingPath(rid), retry: true}, &r)
	return r, err
}

// DownloadRecording returns the video of a stopped recording; the caller
// closes it. One still recording yields an error for which IsConflict is
// true.
func (c *Client) DownloadRecording(ctx context.Context, rid string) (io.ReadCloser, error) {
	if rid == "" {
		return nil, errEmptyRecording
	}
	r := &request{method: http.MethodGet, path: recordingPath(rid, "file"), accept: "video/webm, video/mp4", retry: true}
	ctx, cancel := c.withTimeout(ctx, r)
	resp, err := c.send(ctx, r)
	if err != nil {
		cancel()
		return nil, err
	}
	return &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}, nil
}

// DeleteRecording removes a recording and its file, stopping it first if
// it runs.
func (c *Client) DeleteRecording(ctx context.Context, rid string) error {
	if rid == "" {
		return errEmptyRecording
	}
	return c.doJSON(ctx, &request{method: http.MethodDelete, path: recordingPath(rid), retry: true}, nil)
}
