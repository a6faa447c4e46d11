package api

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// recOf is a fake recording and the key it belongs to.
type recOf struct {
	sandbox.Recording
	owner string
}

// fakeVideo is the body of every fake recording's file.
const fakeVideo = "\x1a\x45\xdf\xa3 not really a webm"

func (m *fakeManager) StartRecording(_ context.Context, id, owner string, req sandbox.RecordingRequest) (sandbox.Recording, error) {
	req, err := req.Normalize()
	if err != nil {
		return sandbox.Recording{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	switch {
	case !ok:
		return sandbox.Recording{}, errdefs.NotFound("sandbox %s not found", id)
	case sb.State != sandbox.StateRunning:
		return sandbox.Recording{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	if m.recordings == nil {
		m.recordings = map[string]recOf{}
	}
	for _, r := range m.recordings {
		if r.SandboxID == id && r.State == sandbox.RecordingActive {
			return sandbox.Recording{}, errdefs.Conflict("sandbox %s is being recorded already", id)
		}
	}
	r := sandbox.Recording{ID: fmt.Sprintf("%026d", len(m.recordings)), SandboxID: id, State: sandbox.RecordingActive,
		Format: req.Format, FPS: req.FPS, Scale: req.Scale, Width: 1024, Height: 768, StartedAt: sb.CreatedAt, Frames: 1}
	r.ID = strings.Map(func(c rune) rune { return 'a' + (c - '0') }, r.ID) // the ID alphabet
	m.recordings[r.ID] = recOf{r, owner}
	return r, nil
}

func (m *fakeManager) findRec(owner, id string) (recOf, error) {
	r, ok := m.recordings[id]
	if !ok || r.owner != owner {
		return recOf{}, errdefs.NotFound("recording %s not found", id)
	}
	return r, nil
}

func (m *fakeManager) StopRecording(_ context.Context, owner, sandboxID, id string) (sandbox.Recording, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.findRec(owner, id)
	if err != nil {
		return sandbox.Recording{}, err
	}
	if sandboxID != "" && r.SandboxID != sandboxID {
		return sandbox.Recording{}, errdefs.NotFound("recording %s not found", id)
	}
	if r.State == sandbox.RecordingActive {
		at := r.StartedAt.Add(6 * time.Second)
		r.State, r.StoppedAt, r.DurationMS, r.SizeBytes, r.StopReason = sandbox.RecordingStopped, &at, 6000, int64(len(fakeVideo)), sandbox.StopRequested
		m.recordings[id] = r
	}
	return r.Recording, nil
}

func (m *fakeManager) ListRecordings(_ context.Context, owner, sandboxID string) []sandbox.Recording {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []sandbox.Recording
	for _, r := range m.recordings {
		if r.owner == owner && (sandboxID == "" || r.SandboxID == sandboxID) {
			out = append(out, r.Recording)
		}
	}
	return out
}

func (m *fakeManager) GetRecording(_ context.Context, owner, id string) (sandbox.Recording, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.findRec(owner, id)
	return r.Recording, err
}

func (m *fakeManager) OpenRecording(_ context.Context, owner, id string) (sandbox.Recording, *os.File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.findRec(owner, id)
	if err != nil {
		return sandbox.Recording{}, nil, err
	}
	if r.State == sandbox.RecordingActive {
		return r.Recording, nil, errdefs.Conflict("recording %s is in progress", id)
	}
	f, err := os.CreateTemp("", "fake-recording-*")
	if err != nil {
		return r.Recording, nil, err
	}
	os.Remove(f.Name()) // open files stay readable
	if _, err := f.WriteString(fakeVideo); err != nil {
		f.Close()
		return r.Recording, nil, err
	}
	return r.Recording, f, nil
}

func (m *fakeManager) DeleteRecording(_ context.Context, owner, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.findRec(owner, id); err != nil {
		return err
	}
	delete(m.recordings, id)
	return nil
}

// TestRecordingsAPI checks the wire side of recordings: bodies are strict
// and checked, IDs in paths are checked before the manager is asked, each
// key sees only its own recordings, and the file is served with ranges.
func TestRecordingsAPI(t *testing.T) {
	e := newTestEnv(t, Config{CreateRate: rate.Inf})
	base := "/v1/sandboxes/" + runningID + "/recordings"

	for _, tc := range []struct {
		name, body string
	}{
		{"fps zero is not a value", `{"fps": 31}`},
		{"negative fps", `{"fps": -1}`},
		{"scale above one", `{"scale": 1.5}`},
		{"scale too small", `{"scale": 0.05}`},
		{"negative scale", `{"scale": -0.5}`},
		{"unknown format", `{"format": "gif"}`},
		{"unknown field", `{"fsp": 5}`},
		{"wrong type", `{"fps": "5"}`},
		{"not an object", `[]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do("POST", base, strings.NewReader(tc.body)), 400, codeInvalid)
		})
	}
	wantError(t, e.do("POST", "/v1/sandboxes/nope!/recordings", nil), 404, codeNotFound)
	wantError(t, e.do("POST", "/v1/sandboxes/"+stoppedID+"/recordings", nil), 409, codeConflict)

	w := e.do("POST", base, nil)
	rec := decode[sandbox.Recording](t, w, 201)
	if rec.FPS != 5 || rec.Scale != 1 || rec.Format != "webm" || rec.State != "recording" || w.Header().Get("Location") != "/v1/recordings/"+rec.ID {
		t.Errorf("started %+v at %q; want the defaults fps 5, scale 1, webm", rec, w.Header().Get("Location"))
	}
	wantError(t, e.do("POST", base, strings.NewReader(`{"fps": 10, "format": "mp4"}`)), 409, codeConflict)
	wantError(t, e.do("GET", "/v1/recordings/"+rec.ID+"/file", nil), 409, codeConflict)

	// Another key sees nothing of it.
	wantError(t, e.do("GET", "/v1/recordings/"+rec.ID, nil, "X-API-Key", "other-key"), 404, codeNotFound)
	wantError(t, e.do("POST", base+"/"+rec.ID+"/stop", nil, "X-API-Key", "other-key"), 404, codeNotFound)
	wantError(t, e.do("GET", "/v1/recordings/"+rec.ID+"/file", nil, "X-API-Key", "other-key"), 404, codeNotFound)
	wantError(t, e.do("DELETE", "/v1/recordings/"+rec.ID, nil, "X-API-Key", "other-key"), 404, codeNotFound)
	if got := e.do("GET", "/v1/recordings", nil, "X-API-Key", "other-key").Body.String(); !strings.Contains(got, `"recordings":[]`) {
		t.Errorf("another key's list is %s, want an empty array", got)
	}

	wantError(t, e.do("POST", base+"/"+rec.ID+"/stop", strings.NewReader(`{"now": true}`)), 400, codeInvalid)
	wantError(t, e.do("POST", "/v1/sandboxes/"+headlessID+"/recordings/"+rec.ID+"/stop", nil), 404, codeNotFound)
	stopped := decode[sandbox.Recording](t, e.do("POST", base+"/"+rec.ID+"/stop", nil), 200)
	if stopped.State != "stopped" || stopped.StoppedAt == nil {
		t.Errorf("stopped: %+v", stopped)
	}

	for _, path := range []string{base, "/v1/recordings", "/v1/recordings?sandbox_id=" + runningID} {
		list := decode[struct{ Recordings []sandbox.Recording }](t, e.do("GET", path, nil), 200)
		if len(list.Recordings) != 1 || list.Recordings[0].ID != rec.ID {
			t.Errorf("%s: %+v", path, list)
		}
	}
	for _, q := range []string{"sandbox_id=Bad!", "sandbox_id=a&sandbox_id=b"} {
		wantError(t, e.do("GET", "/v1/recordings?"+q, nil), 400, codeInvalid)
	}

	w = e.do("GET", "/v1/recordings/"+rec.ID+"/file", nil)
	if body, _ := io.ReadAll(w.Body); w.Code != 200 || string(body) != fakeVideo || w.Header().Get("Content-Type") != "video/webm" {
		t.Errorf("file: %d %q %q", w.Code, w.Header().Get("Content-Type"), body)
	}
	w = e.do("GET", "/v1/recordings/"+rec.ID+"/file", nil, "Range", "bytes=0-3")
	if w.Code != 206 || w.Body.String() != fakeVideo[:4] {
		t.Errorf("range: %d %q", w.Code, w.Body.String())
	}

	for _, bad := range []string{"ABC", "short", strings.Repeat("a", 27), "aaaaaaaaaaaaaaaaaaaaaaaaa1"} {
		wantError(t, e.do("GET", "/v1/recordings/"+bad, nil), 404, codeNotFound)
		wantError(t, e.do("DELETE", "/v1/recordings/"+bad, nil), 404, codeNotFound)
	}
	if w := e.do("DELETE", "/v1/recordings/"+rec.ID, nil); w.Code != 204 {
		t.Errorf("delete: %d %s", w.Code, w.Body.String())
	}
	wantError(t, e.do("GET", "/v1/recordings/"+rec.ID, nil), 404, codeNotFound)
}
