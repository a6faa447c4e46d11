package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/computer"
)

// fakeBackend is a daemon in memory: it records the calls and answers the
// computer endpoint with a screenshot of the display size asked for.
type fakeBackend struct {
	mu      sync.Mutex
	calls   []string
	bodies  []map[string]any
	files   map[string][]byte
	delay   time.Duration // every call takes this long
	onCall  func()        // if set, every call runs it (unlocked) first
	created int
	clip    string
}

func newFake() *fakeBackend { return &fakeBackend{files: map[string][]byte{}} }

func (f *fakeBackend) record(call string) {
	f.mu.Lock()
	f.calls = append(f.calls, call)
	f.mu.Unlock()
	if f.onCall != nil {
		f.onCall()
	}
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
}

func (f *fakeBackend) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeBackend) Create(_ context.Context, req client.CreateRequest, _ ...client.CreateOption) (client.Sandbox, error) {
	f.record("create " + req.Template)
	f.mu.Lock()
	f.created++
	id := fmt.Sprintf("sb%d", f.created)
	f.mu.Unlock()
	return client.Sandbox{ID: id, State: client.StateRunning, Template: "desktop", Resolution: client.Resolution{Width: 1920, Height: 1080}}, nil
}

func (f *fakeBackend) List(context.Context, client.ListOptions) ([]client.Sandbox, error) {
	f.record("list")
	return []client.Sandbox{{ID: "sb1", State: client.StateRunning}}, nil
}

func (f *fakeBackend) Destroy(_ context.Context, id string) error {
	f.record("destroy " + id)
	if id != "sb1" {
		return &client.APIError{Status: 404, Code: client.CodeNotFound, Message: "sandbox " + id + " not found"}
	}
	return nil
}

func (f *fakeBackend) SetTimeout(_ context.Context, id string, s int) (client.Sandbox, error) {
	f.record(fmt.Sprintf("timeout %s %d", id, s))
	return client.Sandbox{ID: id, State: client.StateRunning, ExpiresAt: time.Now().Add(time.Duration(s) * time.Second)}, nil
}

func (f *fakeBackend) View(_ context.Context, id string, req client.ViewRequest) (client.View, error) {
	f.record("view " + id)
	return client.View{URL: "http://daemon/view/" + id + "?token=t", ViewOnly: req.ViewOnly}, nil
}

// ComputerAnthropic answers as the daemon's endpoint does: a 400 with the
// tool_result for a coordinate outside 1024×576, a picture otherwise.
func (f *fakeBackend) ComputerAnthropic(_ context.Context, id string, body any) (json.RawMessage, error) {
	b, _ := json.Marshal(body)
	var req map[string]any
	_ = json.Unmarshal(b, &req)
	f.mu.Lock()
	f.bodies = append(f.bodies, req)
	f.mu.Unlock()
	in := req["input"].(map[string]any)
	f.record("computer " + id + " " + in["action"].(string))
	if c, ok := in["coordinate"].([]any); ok && c[0].(float64) >= 1024 {
		msg := fmt.Sprintf("coordinate (%v, %v) is outside the screen: x must be 0..1023 and y 0..575", c[0], c[1])
		res := computer.AnthropicResult{Type: "tool_result", IsError: true, Content: []computer.AnthropicContent{{Type: "text", Text: "not executed: " + msg}}}
		eb, _ := json.Marshal(map[string]any{"error": map[string]any{"code": "invalid_argument", "message": msg}, "tool_result": res})
		return nil, &client.APIError{Status: 400, Code: client.CodeInvalidArgument, Message: msg, Body: eb}
	}
	if in["action"] == "cursor_position" {
		return json.Marshal(computer.AnthropicResult{Type: "tool_result", Content: []computer.AnthropicContent{{Type: "text", Text: "X=10,Y=20"}}})
	}
	w, h := 1024, 576
	if tool, ok := req["tool"].(map[string]any); ok && tool["display_width_px"] != nil {
		w, h = int(tool["display_width_px"].(float64)), int(tool["display_height_px"].(float64))
	}
	return json.Marshal(computer.AnthropicResult{Type: "tool_result", Content: []computer.AnthropicContent{{Type: "image",
		Source: &computer.AnthropicImageSource{Type: "base64", MediaType: "image/png", Data: encodeBase64(pngOf(w, h))}}}})
}

func (f *fakeBackend) Exec(_ context.Context, id string, req client.ExecRequest) (client.ExecResult, error) {
	f.record("exec " + id + " " + req.Command)
	return client.ExecResult{ExitCode: 3, Stdout: "out:" + req.Stdin, Stderr: "err"}, nil
}

func (f *fakeBackend) Upload(_ context.Context, id, path string, r io.Reader) (client.FileInfo, error) {
	f.record("upload " + id + " " + path)
	b, _ := io.ReadAll(r)
	f.mu.Lock()
	f.files[path] = b
	f.mu.Unlock()
	return client.FileInfo{Path: path, Size: int64(len(b))}, nil
}

func (f *fakeBackend) Download(_ context.Context, id, path string) (io.ReadCloser, error) {
	f.record("download " + id + " " + path)
	f.mu.Lock()
	b, ok := f.files[path]
	f.mu.Unlock()
	if !ok {
		return nil, &client.APIError{Status: http.StatusNotFound, Code: client.CodeNotFound, Message: "no such file: " + path}
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (f *fakeBackend) ClipboardGet(_ context.Context, id string) (string, error) {
	f.record("clipboard_get " + id)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clip, nil
}

// ClipboardSet refuses what the daemon refuses: more than 64 KiB.
func (f *fakeBackend) ClipboardSet(_ context.Context, id, text string) error {
	f.record("clipboard_set " + id)
	if len(text) > 64<<10 {
		return &client.APIError{Status: 400, Code: client.CodeInvalidArgument, Message: fmt.Sprintf("action 0: text is %d bytes (at most 65536)", len(text))}
	}
	f.mu.Lock()
	f.clip = text
	f.mu.Unlock()
	return nil
}

func pngOf(w, h int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	img.Set(0, 0, color.RGBA{255, 0, 0, 255})
	var buf bytes.Buffer
	_ = png.Encode(&buf, img)
	return buf.Bytes()
}
