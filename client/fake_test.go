package client

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeDaemon is an in-memory stand-in for cubicled, faithful to API.md's
// paths, bodies and status codes, that records every request it sees.
type fakeDaemon struct {
	t   *testing.T
	key string

	mu        sync.Mutex
	sandboxes map[string]Sandbox
	files     map[string][]byte // "id:path" -> bytes
	reqs      []recorded
	nextID    int
	// fail, when set, may answer a request itself (return true).
	fail func(w http.ResponseWriter, r *http.Request, n int) bool
}

// recorded is one request the fake daemon received.
type recorded struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
}

func newFake(t *testing.T) (*fakeDaemon, *httptest.Server) {
	t.Helper()
	f := &fakeDaemon{t: t, key: "secret", sandboxes: map[string]Sandbox{}, files: map[string][]byte{}}
	srv := httptest.NewServer(f.handler())
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeDaemon) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

func (f *fakeDaemon) last() recorded {
	r := f.requests()
	if len(r) == 0 {
		f.t.Fatal("no request recorded")
	}
	return r[len(r)-1]
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func (f *fakeDaemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{
			"version": "v0.1.0", "default_backend": "gvisor",
			"backends": []map[string]any{
				{"name": "gvisor", "available": true, "isolation": "gvisor"},
				{"name": "firecracker", "available": false, "isolation": "vm", "reason": "no /dev/kvm"},
			},
			"capacity": map[string]int{"max_sandboxes": 10, "running": 1},
		})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeErr(w, 400, "invalid_argument", "bad json")
			return
		}
		f.mu.Lock()
		f.nextID++
		id := fmt.Sprintf("sb%04d", f.nextID)
		state := StateRunning
		if r.URL.Query().Get("wait") == "false" {
			state = StateStarting
		}
		now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		s := Sandbox{ID: id, State: state, Template: "desktop", Backend: "gvisor", Isolation: "gvisor",
			Resolution: Resolution{1024, 768}, CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActiveAt: now,
			Metadata: map[string]string{}}
		f.sandboxes[id] = s
		f.mu.Unlock()
		writeJSON(w, 201, s)
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		list := []Sandbox{}
		for _, s := range f.sandboxes {
			if st := r.URL.Query().Get("state"); st != "" && s.State != st {
				continue
			}
			list = append(list, s)
		}
		f.mu.Unlock()
		writeJSON(w, 200, map[string]any{"sandboxes": list})
	})
	withSandbox := func(h func(w http.ResponseWriter, r *http.Request, s Sandbox)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			s, ok := f.sandboxes[r.PathValue("id")]
			f.mu.Unlock()
			if !ok {
				writeErr(w, 404, "not_found", "sandbox "+r.PathValue("id")+" not found")
				return
			}
			h(w, r, s)
		}
	}
	mux.HandleFunc("GET /v1/sandboxes/{id}", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		writeJSON(w, 200, s)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		f.mu.Lock()
		delete(f.sandboxes, s.ID)
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		var req struct {
			TimeoutSeconds int `json:"timeout_seconds"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		s.ExpiresAt = s.CreatedAt.Add(time.Duration(req.TimeoutSeconds) * time.Second)
		f.mu.Lock()
		f.sandboxes[s.ID] = s
		f.mu.Unlock()
		writeJSON(w, 200, s)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/screenshot", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		if r.URL.Query().Get("format") == "jpeg" {
			w.Header().Set("Content-Type", "image/jpeg")
			_, _ = w.Write([]byte("\xff\xd8jpeg"))
			return
		}
		w.Header().Set("Content-Type", "image/png")
		_, _ = w.Write([]byte("\x89PNG fake"))
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/actions", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		var req struct {
			Actions []map[string]any `json:"actions"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeErr(w, 400, "invalid_argument", "bad json")
			return
		}
		results := []map[string]any{}
		for i, a := range req.Actions {
			res := map[string]any{"type": a["type"]}
			switch a["type"] {
			case "cursor_position":
				res["x"], res["y"] = 12, 34
			case "screen_size":
				res["width"], res["height"] = 1024, 768
			case "windows":
				res["windows"] = []map[string]any{{"id": 4194307, "title": "Chromium", "class": "chromium", "x": 0, "y": 0, "width": 1024, "height": 768, "focused": true}}
			case "screenshot":
				res["format"], res["width"], res["height"] = "png", 1024, 768
				res["data"] = base64.StdEncoding.EncodeToString([]byte("\x89PNG"))
			case "bogus":
				writeJSON(w, 400, map[string]any{"error": map[string]any{"code": "invalid_argument", "message": "unknown action type \"bogus\"", "index": i}})
				return
			}
			results = append(results, res)
		}
		writeJSON(w, 200, map[string]any{"results": results, "duration_ms": 5})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		var req ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeErr(w, 400, "invalid_argument", "bad json")
			return
		}
		if req.Background {
			writeJSON(w, 202, map[string]int{"pid": 4242})
			return
		}
		cmd := req.Command
		if cmd == "" {
			cmd = strings.Join(req.Argv, " ")
		}
		if r.Header.Get("Accept") == "application/x-ndjson" {
			w.Header().Set("Content-Type", "application/x-ndjson")
			fl := w.(http.Flusher)
			enc := json.NewEncoder(w)
			_ = enc.Encode(map[string]string{"stdout": "out: " + cmd + "\n"})
			fl.Flush()
			_ = enc.Encode(map[string]string{"stderr": "warn\n"})
			fl.Flush()
			_ = enc.Encode(map[string]int{"exit_code": 3})
			return
		}
		writeJSON(w, 200, map[string]any{"exit_code": 3, "stdout": "out: " + cmd + "\n", "stderr": "warn\n", "duration_ms": 7})
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		p := r.URL.Query().Get("path")
		f.mu.Lock()
		f.files[s.ID+":"+p] = b
		f.mu.Unlock()
		writeJSON(w, 200, map[string]any{"path": p, "size": len(b)})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		f.mu.Lock()
		b, ok := f.files[s.ID+":"+r.URL.Query().Get("path")]
		f.mu.Unlock()
		if !ok {
			writeErr(w, 404, "not_found", "no such file")
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(b)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		f.mu.Lock()
		delete(f.files, s.ID+":"+r.URL.Query().Get("path"))
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		writeJSON(w, 200, map[string]any{"entries": []map[string]any{
			{"name": "a.txt", "path": "/root/a.txt", "type": "file", "size": 3, "mode": 0o644, "modified_at": "2030-01-02T03:04:05Z"},
			{"name": "d", "path": "/root/d", "type": "dir", "size": 0, "mode": "0755", "modified_at": ""},
		}})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/view", withSandbox(func(w http.ResponseWriter, r *http.Request, s Sandbox) {
		writeJSON(w, 200, map[string]any{"url": "http://" + r.Host + "/view/" + s.ID + "?token=t0k", "expires_at": "2030-01-02T03:14:05Z"})
	}))

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body})
		n := len(f.reqs)
		fail := f.fail
		f.mu.Unlock()
		if fail != nil && fail(w, r, n) {
			return
		}
		if r.URL.Path != "/healthz" && r.Header.Get("X-API-Key") != f.key {
			writeErr(w, 401, "unauthorized", "missing or wrong API key")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// addSandbox puts a running sandbox with the given id into f.
func (f *fakeDaemon) addSandbox(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	f.sandboxes[id] = Sandbox{ID: id, State: StateRunning, Template: "desktop", Backend: "gvisor", Isolation: "gvisor",
		Resolution: Resolution{1024, 768}, CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActiveAt: now}
}
