package api

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

func TestParseCreateRequest(t *testing.T) {
	for _, c := range []struct {
		name string
		body string
		want sandbox.CreateRequest
		err  string // substring of the error message; "" = valid
	}{
		{name: "empty object", body: `{}`},
		{name: "full", body: `{"template":"desktop","backend":"gvisor","resolution":{"width":1280,"height":800},
			"dpi":96,"vcpus":2,"memory_mb":2048,"timeout_seconds":3600,"idle_timeout_seconds":1800,
			"start_url":"https://example.org/x?y=1","env":{"K":"V","_a1":""},"metadata":{"k":"v"},"network":{"egress":"none"}}`,
			want: sandbox.CreateRequest{Template: "desktop", Backend: "gvisor", Resolution: sandbox.Resolution{Width: 1280, Height: 800},
				DPI: 96, VCPUs: 2, MemoryMB: 2048, TimeoutSeconds: 3600, IdleTimeoutSeconds: 1800,
				StartURL: "https://example.org/x?y=1", Env: map[string]string{"K": "V", "_a1": ""},
				Metadata: map[string]string{"k": "v"}, Network: sandbox.Network{Egress: "none"}}},
		{name: "egress all", body: `{"network":{"egress":"all"}}`, want: sandbox.CreateRequest{Network: sandbox.Network{Egress: "all"}}},
		{name: "egress allow", body: `{"network":{"egress":{"allow":["10.0.0.0/8","192.168.1.7/24","1.2.3.4","2001:db8::/32"]}}}`,
			want: sandbox.CreateRequest{Network: sandbox.Network{Allow: []string{"10.0.0.0/8", "192.168.1.0/24", "1.2.3.4/32", "2001:db8::/32"}}}},
		{name: "egress allow entries trimmed", body: `{"network":{"egress":{"allow":[" 10.1.0.0/16 "]}}}`,
			want: sandbox.CreateRequest{Network: sandbox.Network{Allow: []string{"10.1.0.0/16"}}}},
		{name: "network null", body: `{"network":null}`},
		{name: "egress null", body: `{"network":{"egress":null}}`},
		{name: "about url", body: `{"start_url":"about:blank"}`, want: sandbox.CreateRequest{StartURL: "about:blank"}},
		{name: "file url", body: `{"start_url":"file:///tmp/x.html"}`, want: sandbox.CreateRequest{StartURL: "file:///tmp/x.html"}},
		{name: "zero resolution is default", body: `{"resolution":{"width":0,"height":0}}`},
		{name: "bounds low", body: `{"resolution":{"width":320,"height":200},"dpi":50,"vcpus":1,"memory_mb":256}`,
			want: sandbox.CreateRequest{Resolution: sandbox.Resolution{Width: 320, Height: 200}, DPI: 50, VCPUs: 1, MemoryMB: 256}},
		{name: "bounds high", body: `{"resolution":{"width":7680,"height":4320},"dpi":600,"vcpus":64,"memory_mb":262144}`,
			want: sandbox.CreateRequest{Resolution: sandbox.Resolution{Width: 7680, Height: 4320}, DPI: 600, VCPUs: 64, MemoryMB: 262144}},

		{name: "malformed", body: `{"template":`, err: "invalid JSON"},
		{name: "empty body", body: ``, err: "empty body"},
		{name: "null", body: `null`, err: "not null"},
		{name: "invalid UTF-8", body: "{\"template\":\"desk\xfftop\"}", err: "UTF-8"},
		{name: "not an object", body: `[]`, err: "wrong type"},
		{name: "trailing data", body: `{} {}`, err: "unexpected data"},
		{name: "unknown field", body: `{"templat":"desktop"}`, err: `unknown field "templat"`},
		{name: "unknown nested field", body: `{"resolution":{"width":1024,"height":768,"depth":24}}`, err: "unknown field"},
		{name: "wrong type", body: `{"vcpus":"2"}`, err: `"vcpus"`},
		{name: "float", body: `{"vcpus":1.5}`, err: `"vcpus"`},
		{name: "bad template", body: `{"template":"../etc"}`, err: "template"},
		{name: "bad backend", body: `{"backend":"docker"}`, err: "backend"},
		{name: "width low", body: `{"resolution":{"width":319,"height":768}}`, err: "resolution"},
		{name: "height high", body: `{"resolution":{"width":1024,"height":4321}}`, err: "resolution"},
		{name: "half resolution", body: `{"resolution":{"width":1024}}`, err: "resolution"},
		{name: "dpi", body: `{"dpi":49}`, err: "dpi"},
		{name: "vcpus", body: `{"vcpus":65}`, err: "vcpus"},
		{name: "negative vcpus", body: `{"vcpus":-1}`, err: "vcpus"},
		{name: "memory", body: `{"memory_mb":255}`, err: "memory_mb"},
		{name: "negative timeout", body: `{"timeout_seconds":-1}`, err: "timeout_seconds"},
		{name: "negative idle", body: `{"idle_timeout_seconds":-5}`, err: "idle_timeout_seconds"},
		{name: "huge timeout", body: `{"timeout_seconds":99999999999}`, err: "timeout_seconds"},
		{name: "javascript url", body: `{"start_url":"javascript:alert(1)"}`, err: "start_url"},
		{name: "data url", body: `{"start_url":"data:text/html,x"}`, err: "start_url"},
		{name: "hostless url", body: `{"start_url":"http:///x"}`, err: "start_url"},
		{name: "relative url", body: `{"start_url":"example.org"}`, err: "start_url"},
		{name: "bad env key", body: `{"env":{"1A":"x"}}`, err: "env"},
		{name: "env key with =", body: `{"env":{"A=B":"x"}}`, err: "env"},
		{name: "env NUL", body: `{"env":{"A":"x\u0000y"}}`, err: "NUL"},
		{name: "empty metadata key", body: `{"metadata":{"":"x"}}`, err: "metadata"},
		{name: "long metadata value", body: `{"metadata":{"k":"` + strings.Repeat("v", 1025) + `"}}`, err: "metadata"},
		{name: "bad egress", body: `{"network":{"egress":"some"}}`, err: "egress"},
		{name: "bad egress type", body: `{"network":{"egress":5}}`, err: "egress"},
		{name: "bad cidr", body: `{"network":{"egress":{"allow":["10.0.0.0/33"]}}}`, err: "CIDR"},
		{name: "domain in allow", body: `{"network":{"egress":{"allow":["example.com"]}}}`, err: `network.egress.allow[0]: "example.com" is not an IP address or CIDR (cubicle filters egress by address, not by domain name)`},
		{name: "too many allow entries", body: `{"network":{"egress":{"allow":[` + strings.Repeat(`"10.0.0.0/8",`, 256) + `"10.0.0.0/8"]}}}`, err: "network.egress.allow has 257 entries (at most 256)"},
		{name: "empty egress", body: `{"network":{"egress":""}}`, err: `network.egress must be "none", "all"`},
		{name: "empty allow", body: `{"network":{"egress":{"allow":[]}}}`, err: "at least one"},
		{name: "unknown egress field", body: `{"network":{"egress":{"deny":["1.2.3.4/32"]}}}`, err: "unknown field"},
		{name: "unknown network field", body: `{"network":{"egress":"none","ingress":"all"}}`, err: "unknown field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseCreateRequest([]byte(c.body))
			if c.err != "" {
				if err == nil {
					t.Fatalf("no error, want one containing %q", c.err)
				}
				he := classify(err)
				if he.status != http.StatusBadRequest || he.code != codeInvalid {
					t.Errorf("error %v maps to %d %s, want 400 invalid_argument", err, he.status, he.code)
				}
				if !strings.Contains(he.msg, c.err) {
					t.Errorf("message %q does not contain %q", he.msg, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("error %v", err)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
		})
	}
}

func TestCreateSandbox(t *testing.T) {
	e := newTestEnv(t, Config{})
	w := e.do("POST", "/v1/sandboxes", strings.NewReader(`{"template":"desktop","metadata":{"a":"b"}}`))
	sb := decode[sandbox.Sandbox](t, w, http.StatusCreated)
	if sb.ID != "sbnew" || sb.State != sandbox.StateRunning {
		t.Errorf("sandbox = %+v", sb)
	}
	if loc := w.Header().Get("Location"); loc != "/v1/sandboxes/sbnew" {
		t.Errorf("Location = %q", loc)
	}
	if !e.mgr.lastWait || e.mgr.lastCreate.Template != "desktop" {
		t.Errorf("manager got %+v wait=%v", e.mgr.lastCreate, e.mgr.lastWait)
	}
	// The sandbox belongs to the caller's key (for per-key quotas), never
	// to an owner the body names.
	if got, want := e.mgr.lastCreate.Owner, sandbox.KeyOwner(testKey); got != want || got == "" {
		t.Errorf("owner = %q, want %q", got, want)
	}
	wantError(t, e.do("POST", "/v1/sandboxes", strings.NewReader(`{"owner":"someone-else"}`)), 400, codeInvalid)

	sb = decode[sandbox.Sandbox](t, e.do("POST", "/v1/sandboxes?wait=false", strings.NewReader(`{}`)), http.StatusCreated)
	if e.mgr.lastWait || sb.State != sandbox.StateStarting {
		t.Errorf("wait=false: wait=%v state=%s", e.mgr.lastWait, sb.State)
	}
	wantError(t, e.do("POST", "/v1/sandboxes?wait=maybe", strings.NewReader(`{}`)), 400, codeInvalid)
	wantError(t, e.do("POST", "/v1/sandboxes", strings.NewReader(`{"bogus":1}`)), 400, codeInvalid)
	wantError(t, e.do("POST", "/v1/sandboxes", strings.NewReader(`{"vcpus":1000}`)), 400, codeInvalid)
}

func TestOversizeBody(t *testing.T) {
	e := newTestEnv(t, Config{MaxBodyBytes: 1000, CreateRate: rate.Inf})
	big := `{"metadata":{"k":"` + strings.Repeat("v", 2000) + `"}}`
	wantError(t, e.do("POST", "/v1/sandboxes", strings.NewReader(big)), 413, codePayloadTooLarge)
	// Without a Content-Length the limit still holds.
	r := strings.NewReader(big)
	w := e.do("POST", "/v1/sandboxes", struct{ *strings.Reader }{r})
	wantError(t, w, 413, codePayloadTooLarge)
	wantError(t, e.do("POST", "/v1/sandboxes/"+runningID+"/actions",
		strings.NewReader(`{"type":"type","text":"`+strings.Repeat("a", 2000)+`"}`)), 413, codePayloadTooLarge)
	wantError(t, e.do("POST", "/v1/sandboxes/"+runningID+"/exec",
		strings.NewReader(`{"command":"`+strings.Repeat("a", 2000)+`"}`)), 413, codePayloadTooLarge)
}

func TestCreateRateLimit(t *testing.T) {
	e := newTestEnv(t, Config{CreateRate: 0.001, CreateBurst: 2})
	for i := range 2 {
		if w := e.do("POST", "/v1/sandboxes", strings.NewReader(`{}`)); w.Code != http.StatusCreated {
			t.Fatalf("create %d: %d", i, w.Code)
		}
	}
	w := e.do("POST", "/v1/sandboxes", strings.NewReader(`{}`))
	wantError(t, w, http.StatusTooManyRequests, codeRateLimited)
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	// Other routes are not limited.
	if w := e.do("GET", "/v1/sandboxes", nil); w.Code != 200 {
		t.Errorf("list: %d", w.Code)
	}
}

func TestListSandboxes(t *testing.T) {
	e := newTestEnv(t, Config{})
	got := decode[struct {
		Sandboxes []sandbox.Sandbox `json:"sandboxes"`
	}](t, e.do("GET", "/v1/sandboxes", nil), 200)
	if len(got.Sandboxes) != 2 {
		t.Errorf("got %d sandboxes", len(got.Sandboxes))
	}

	w := e.do("GET", "/v1/sandboxes?state=stopped&metadata.team=a&metadata.x.y=z", nil)
	if w.Code != 200 {
		t.Fatalf("status %d", w.Code)
	}
	want := sandbox.Filter{State: sandbox.StateStopped, Metadata: map[string]string{"team": "a", "x.y": "z"}}
	if d := cmp.Diff(want, e.mgr.lastFilter); d != "" {
		t.Errorf("filter (-want +got):\n%s", d)
	}

	// An empty list is [], not null.
	w = e.do("GET", "/v1/sandboxes?state=failed", nil)
	if !strings.Contains(w.Body.String(), `"sandboxes":[]`) {
		t.Errorf("empty list body %s", w.Body.String())
	}
	wantError(t, e.do("GET", "/v1/sandboxes?state=sleeping", nil), 400, codeInvalid)
	wantError(t, e.do("GET", "/v1/sandboxes?metadata.=x", nil), 400, codeInvalid)
}

func TestGetDeleteTimeout(t *testing.T) {
	e := newTestEnv(t, Config{})
	sb := decode[sandbox.Sandbox](t, e.do("GET", "/v1/sandboxes/"+runningID, nil), 200)
	if sb.ID != runningID {
		t.Errorf("id %q", sb.ID)
	}
	wantError(t, e.do("GET", "/v1/sandboxes/nosuch", nil), 404, codeNotFound)

	w := e.do("DELETE", "/v1/sandboxes/"+runningID, nil)
	if w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Errorf("delete: %d %q", w.Code, w.Body.String())
	}
	wantError(t, e.do("DELETE", "/v1/sandboxes/nosuch", nil), 404, codeNotFound)

	decode[sandbox.Sandbox](t, e.do("POST", "/v1/sandboxes/"+runningID+"/timeout", strings.NewReader(`{"timeout_seconds":600}`)), 200)
	if e.mgr.lastTO != 600 {
		t.Errorf("timeout = %d", e.mgr.lastTO)
	}
	for _, body := range []string{`{}`, `{"timeout_seconds":-1}`, `{"timeout_seconds":"1"}`, `{"timeout":1}`, ``} {
		wantError(t, e.do("POST", "/v1/sandboxes/"+runningID+"/timeout", strings.NewReader(body)), 400, codeInvalid)
	}
	wantError(t, e.do("POST", "/v1/sandboxes/nosuch/timeout", strings.NewReader(`{"timeout_seconds":1}`)), 404, codeNotFound)
}

// brokenReader fails every read, like a client that broke off mid-body.
type brokenReader struct{}

func (brokenReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// TestBrokenBody: a body the client broke off is its fault, a 400, not a
// daemon error (E2B's control plane answers the same; see internal/e2b).
func TestBrokenBody(t *testing.T) {
	e := newTestEnv(t, Config{CreateRate: rate.Inf})
	for _, path := range []string{"/v1/sandboxes", "/v1/sandboxes/" + runningID + "/exec", "/v1/sandboxes/" + runningID + "/actions"} {
		w := e.do("POST", path, brokenReader{})
		if got := wantError(t, w, http.StatusBadRequest, codeInvalid); got.Message != "could not read the request body" {
			t.Errorf("POST %s: message %q", path, got.Message)
		}
	}
	if e.mgr.lastCreate.Template != "" || e.mgr.lastWait {
		t.Errorf("a broken create reached the manager: %+v", e.mgr.lastCreate)
	}
}
