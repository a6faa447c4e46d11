package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// routePath turns a route pattern into a method and a concrete path.
func routePath(pattern string) (method, p string) {
	method, p, _ = strings.Cut(pattern, " ")
	p = strings.ReplaceAll(p, "{$}", "")
	return method, strings.ReplaceAll(p, "{id}", runningID)
}

func TestAuth(t *testing.T) {
	for _, metricsKey := range []bool{false, true} {
		t.Run(fmt.Sprintf("MetricsAuth=%v", metricsKey), func(t *testing.T) {
			e := newTestEnv(t, Config{MetricsAuth: metricsKey})
			for _, rt := range e.srv.routes() {
				method, p := routePath(rt.pattern)
				want := authKey
				switch rt.pattern {
				case "GET /healthz", "GET /{$}", "GET /static/":
					want = authOpen
				case "GET /metrics":
					want = metricsAuth(metricsKey)
				case "GET /v1/sandboxes/{id}/vnc", "GET /view/{id}", "GET /v1/sandboxes/{id}/cdp",
					"GET /v1/sandboxes/{id}/cdp/json/version", "GET /v1/sandboxes/{id}/cdp/json/version/":
					want = authKeyOrTok // refused below like a key route
				}
				if rt.auth != want {
					t.Errorf("%s: auth = %v, want %v", rt.pattern, rt.auth, want)
				}
				open := rt.auth == authOpen
				for _, c := range []struct {
					name    string
					headers []string
				}{
					{"missing", []string{"X-API-Key", ""}},
					{"wrong", []string{"X-API-Key", "nope"}},
					{"wrong bearer", []string{"X-API-Key", "", "Authorization", "Bearer nope"}},
					{"prefix of key", []string{"X-API-Key", testKey[:5]}},
					{"key with suffix", []string{"X-API-Key", testKey + "x"}},
					{"basic scheme", []string{"X-API-Key", "", "Authorization", "Basic " + testKey}},
				} {
					w := e.do(method, p, strings.NewReader("{}"), c.headers...)
					if open {
						if w.Code == http.StatusUnauthorized {
							t.Errorf("%s %s (%s key): 401 on an open route", method, p, c.name)
						}
						continue
					}
					if w.Code != http.StatusUnauthorized {
						t.Errorf("%s %s (%s key): status %d, want 401", method, p, c.name, w.Code)
						continue
					}
					if got := errorOf(t, w).Code; got != codeUnauthorized {
						t.Errorf("%s %s: code %q, want unauthorized", method, p, got)
					}
				}
				for _, headers := range [][]string{
					{"X-API-Key", testKey},
					{"X-API-Key", "other-key"},
					{"X-API-Key", "", "Authorization", "Bearer " + testKey},
					{"X-API-Key", "", "Authorization", "bearer " + testKey},
				} {
					if w := e.do(method, p, strings.NewReader("{}"), headers...); w.Code == http.StatusUnauthorized {
						t.Errorf("%s %s with %v: 401", method, p, headers)
					}
				}
			}
			// Unknown routes need a key too: no probing for endpoints.
			if w := e.do("GET", "/v1/nope", nil, "X-API-Key", ""); w.Code != http.StatusUnauthorized {
				t.Errorf("unknown route without key: %d, want 401", w.Code)
			}
			if strings.Contains(e.logs.String(), testKey) || strings.Contains(e.logs.String(), testKey[:8]) {
				t.Error("an API key reached the log")
			}
		})
	}
}

func TestNoKeysMeansNoAuth(t *testing.T) {
	e := newTestEnv(t, Config{APIKeys: []string{}})
	if w := e.do("GET", "/v1/info", nil, "X-API-Key", ""); w.Code != http.StatusOK {
		t.Errorf("status %d, want 200", w.Code)
	}
}

func TestServiceEndpoints(t *testing.T) {
	e := newTestEnv(t, Config{Version: "1.2.3"})

	w := e.do("GET", "/healthz", nil, "X-API-Key", "")
	if got := decode[map[string]string](t, w, 200); got["status"] != "ok" {
		t.Errorf("healthz = %v", got)
	}

	info := decode[infoResponse](t, e.do("GET", "/v1/info", nil), 200)
	if info.Version != "1.2.3" || info.DefaultBackend != "runc" || len(info.Backends) != 1 ||
		info.Capacity != (sandbox.Capacity{MaxSandboxes: 10, Running: 1}) {
		t.Errorf("info = %+v", info)
	}

	e.do("GET", "/v1/sandboxes/"+runningID, nil)
	w = e.do("GET", "/metrics", nil, "X-API-Key", "")
	if w.Code != 200 || !strings.Contains(w.Body.String(), "cubicle_http_requests_total") {
		t.Errorf("metrics: %d %.200s", w.Code, w.Body.String())
	}
	if got := testutil.ToFloat64(e.metrics.HTTPRequests.WithLabelValues("GET /v1/sandboxes/{id}", "200")); got != 1 {
		t.Errorf("request counter = %v, want 1", got)
	}
	if !strings.Contains(e.logs.String(), `"sandbox":"`+runningID+`"`) {
		t.Errorf("request log has no sandbox id: %s", e.logs.String())
	}
}

func TestOpenAPICoversRoutes(t *testing.T) {
	e := newTestEnv(t, Config{})
	w := e.do("GET", "/v1/openapi.json", nil)
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(decode[json.RawMessage](t, w, 200), &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi = %q, want 3.x", doc.OpenAPI)
	}
	documented, served := 0, 0
	for _, rt := range e.srv.routes() {
		if rt.page {
			continue
		}
		served++
		method, p, _ := strings.Cut(rt.pattern, " ")
		ops, ok := doc.Paths[p]
		if !ok {
			t.Errorf("path %s is not in the OpenAPI document", p)
			continue
		}
		if _, ok := ops[strings.ToLower(method)]; !ok {
			t.Errorf("%s %s is not in the OpenAPI document", method, p)
		}
	}
	// And nothing is documented that is not served.
	for p, ops := range doc.Paths {
		for m := range ops {
			if m == "parameters" {
				continue
			}
			documented++
			pattern := strings.ToUpper(m) + " " + p
			found := false
			for _, rt := range e.srv.routes() {
				found = found || rt.pattern == pattern
			}
			if !found {
				t.Errorf("%s is documented but not served", pattern)
			}
		}
	}
	if documented != served {
		t.Errorf("documented %d operations, serving %d", documented, served)
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	e := newTestEnv(t, Config{})
	wantError(t, e.do("GET", "/v1/nope", nil), 404, codeNotFound)
	// Without pages and view tokens configured, the dashboard and live
	// view answer 404.
	wantError(t, e.do("GET", "/", nil), 404, codeNotFound)
	wantError(t, e.do("POST", "/v1/sandboxes/"+runningID+"/view", strings.NewReader("{}")), 404, codeNotFound)
	w := e.do("PATCH", "/v1/sandboxes/"+runningID, nil)
	wantError(t, w, 405, codeMethodNotAllowed)
	if allow := w.Header().Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "DELETE") {
		t.Errorf("Allow = %q", allow)
	}
}

func TestPanicRecovery(t *testing.T) {
	e := newTestEnv(t, Config{})
	w := e.do("GET", "/v1/sandboxes/panic", nil)
	got := wantError(t, w, 500, codeInternal)
	if strings.Contains(w.Body.String(), "secret") || strings.Contains(w.Body.String(), "goroutine") {
		t.Errorf("panic details leaked: %s", w.Body.String())
	}
	if got.Message != "internal error" {
		t.Errorf("message = %q", got.Message)
	}
	if !strings.Contains(e.logs.String(), "secret detail") {
		t.Error("the panic was not logged")
	}
}

func TestErrorMapping(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		code   string
		msg    string // "" = don't check
	}{
		{errdefs.NotFound("sandbox x not found"), 404, codeNotFound, "sandbox x not found"},
		{fmt.Errorf("get: %w", errdefs.ErrNotFound), 404, codeNotFound, "not found"},
		{errdefs.Invalid("bad"), 400, codeInvalid, "bad"},
		{errdefs.Conflict("sandbox is stopped"), 409, codeConflict, "sandbox is stopped"},
		{fmt.Errorf("x: %w", errdefs.ErrUnavailable), 503, codeUnavailable, ""},
		{fmt.Errorf("x: %w", errdefs.ErrCapacity), 503, codeCapacity, ""},
		{fmt.Errorf("x: %w", errdefs.ErrRateLimited), 429, codeRateLimited, ""},
		{fmt.Errorf("x: %w", errdefs.ErrTimeout), 504, codeTimeout, ""},
		{fmt.Errorf("snapshot: %w", errdefs.ErrNotSupported), 409, codeNotSupported, ""},
		{fmt.Errorf("x: %w", errdefs.ErrPayloadTooLarge), 413, codePayloadTooLarge, ""},
		{fmt.Errorf("x: %w", errdefs.ErrUnauthorized), 401, codeUnauthorized, ""},
		{&http.MaxBytesError{Limit: 10}, 413, codePayloadTooLarge, ""},
		{&action.Error{Index: 2, Msg: "unknown action type"}, 400, codeInvalid, ""},
		{&agentclient.StatusError{Code: 404, Message: "no such file"}, 404, codeNotFound, "no such file"},
		{&agentclient.StatusError{Code: 400, Message: "bad path"}, 400, codeInvalid, "bad path"},
		{&agentclient.StatusError{Code: 403, Message: ""}, 403, codePermissionDenied, "permission denied"},
		{&agentclient.StatusError{Code: 500, Message: "disk /dev/vda1 broke"}, 500, codeInternal, "internal error"},
		{connect.NewError(connect.CodeInvalidArgument, errors.New("coordinates off screen")), 400, codeInvalid, "coordinates off screen"},
		{fmt.Errorf("rpc: %w", connect.NewError(connect.CodeNotFound, errors.New("no such dir"))), 404, codeNotFound, "no such dir"},
		{connect.NewError(connect.CodeDeadlineExceeded, errors.New("slow")), 504, codeTimeout, ""},
		{connect.NewError(connect.CodeUnavailable, errors.New("dial unix /run/x.sock: refused")), 503, codeUnavailable, "the sandbox's agent is unavailable"},
		// The agent's own answer: it is there, its desktop is not.
		{connect.NewWireError(connect.CodeUnavailable, errors.New("the desktop is restarting; retry")), 503, codeUnavailable, "the desktop is restarting; retry"},
		{connect.NewError(connect.CodeUnimplemented, errors.New("old agent")), 409, codeNotSupported, ""},
		{connect.NewError(connect.CodePermissionDenied, errors.New("denied")), 403, codePermissionDenied, "denied"},
		{connect.NewError(connect.CodeAlreadyExists, errors.New("exists")), 409, codeConflict, "exists"},
		{connect.NewError(connect.CodeInternal, errors.New("/host/path broke")), 500, codeInternal, "internal error"},
		{context.DeadlineExceeded, 504, codeTimeout, ""},
		// Canceled while the client still waits: the agent's stream was cut.
		{connect.NewError(connect.CodeCanceled, errors.New("stream reset")), 503, codeUnavailable, "the sandbox's agent went away during the request; retry"},
		{fmt.Errorf("act: %w", context.Canceled), 503, codeUnavailable, ""},
		{connect.NewError(connect.CodeInternal, fmt.Errorf("protocol error: incomplete envelope: %w", io.ErrUnexpectedEOF)), 503, codeUnavailable, agentGone},
		{errors.New("open /var/lib/cubicle/secret: denied"), 500, codeInternal, "internal error"},
	} {
		t.Run(fmt.Sprintf("%T %v", c.err, c.err), func(t *testing.T) {
			// Through the HTTP path: the manager fails with c.err.
			e := newTestEnv(t, Config{})
			e.mgr.err = c.err
			w := e.do("GET", "/v1/sandboxes/"+runningID, nil)
			got := wantError(t, w, c.status, c.code)
			if c.msg != "" && got.Message != c.msg {
				t.Errorf("message = %q, want %q", got.Message, c.msg)
			}
			if got.Message == "" {
				t.Error("empty message")
			}
			if c.status >= 500 && !strings.Contains(e.logs.String(), "request failed") {
				t.Error("server error not logged")
			}
		})
	}
}

func TestConnectionLost(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("box x: dial agent: %w", refused), true},
		{connect.NewError(connect.CodeUnavailable, refused), true},
		{connect.NewError(connect.CodeInternal, fmt.Errorf("protocol error: incomplete envelope: %w", io.ErrUnexpectedEOF)), true},
		{connect.NewError(connect.CodeCanceled, context.Canceled), true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		// Answers of a live agent: no reason to wait for a death.
		{connect.NewError(connect.CodeUnavailable, errors.New("the desktop is restarting; retry")), false},
		{&agentclient.StatusError{Code: 500, Message: "disk broke"}, false},
		{errors.New("internal"), false},
	} {
		if got := connectionLost(c.err); got != c.want {
			t.Errorf("connectionLost(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestClientGone: a request its own client canceled is logged as 499, not
// as a failure of the daemon.
func TestClientGone(t *testing.T) {
	e := newTestEnv(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, "GET", "/v1/sandboxes/"+runningID+"/screenshot", nil)
	w := httptest.NewRecorder()
	e.srv.writeError(w, r, connect.NewError(connect.CodeCanceled, context.Canceled))
	wantError(t, w, statusClientClosed, codeCanceled)
}

func TestNotRunningAndUnknownSandbox(t *testing.T) {
	e := newTestEnv(t, Config{})
	for _, c := range []struct {
		method, path, body string
	}{
		{"GET", "/screenshot", ""},
		{"POST", "/actions", `{"type":"screen_size"}`},
		{"POST", "/exec", `{"command":"echo hi"}`},
		{"PUT", "/files?path=/a", "x"},
		{"GET", "/files?path=/a", ""},
		{"DELETE", "/files?path=/a", ""},
		{"GET", "/files/list?path=/", ""},
	} {
		t.Run(c.method+c.path, func(t *testing.T) {
			wantError(t, e.do(c.method, "/v1/sandboxes/"+stoppedID+c.path, strings.NewReader(c.body)), 409, codeConflict)
			wantError(t, e.do(c.method, "/v1/sandboxes/nosuch"+c.path, strings.NewReader(c.body)), 404, codeNotFound)
			wantError(t, e.do(c.method, "/v1/sandboxes/bad%21id"+c.path, strings.NewReader(c.body)), 404, codeNotFound)
		})
	}
}

// TestMounts checks that a mount gets its requests before the native routes
// and without the native API-key check, and is counted under its name.
func TestMounts(t *testing.T) {
	mount := Mount{
		Name:   "dataplane",
		Claims: func(r *http.Request) bool { return r.Header.Get("E2b-Sandbox-Id") != "" },
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusTeapot)
		}),
	}
	e := newTestEnv(t, Config{Mounts: []Mount{mount}})
	if w := e.do("GET", "/v1/info", nil, "X-API-Key", "", "E2b-Sandbox-Id", "x"); w.Code != http.StatusTeapot {
		t.Errorf("claimed request: %d, want 418 from the mount", w.Code)
	}
	if w := e.do("GET", "/v1/info", nil, "X-API-Key", ""); w.Code != http.StatusUnauthorized {
		t.Errorf("unclaimed request without key: %d, want 401", w.Code)
	}
	if got := testutil.ToFloat64(e.metrics.HTTPRequests.WithLabelValues("dataplane", "418")); got != 1 {
		t.Errorf("dataplane requests counted %v, want 1", got)
	}
}
