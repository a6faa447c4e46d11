package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// Exact key sets of E2B's schemas as this server sends them.
var (
	sandboxKeys = []string{"alias", "clientID", "domain", "envdAccessToken", "envdVersion",
		"sandboxID", "templateID", "trafficAccessToken"}
	listedKeys = []string{"alias", "clientID", "cpuCount", "diskSizeMB", "endAt", "envdVersion",
		"memoryMB", "metadata", "sandboxID", "startedAt", "state", "templateID"}
	detailKeys = []string{"alias", "clientID", "cpuCount", "diskSizeMB", "domain", "endAt",
		"envdAccessToken", "envdVersion", "lifecycle", "memoryMB", "metadata", "sandboxID",
		"startedAt", "state", "templateID"}
	errorKeys = []string{"code", "message"}
)

// decodeObject decodes a JSON object answer.
func decodeObject(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("answer %q is not a JSON object: %v", body, err)
	}
	return m
}

// decodeArray decodes a JSON array-of-objects answer.
func decodeArray(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var a []map[string]any
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("answer %q is not a JSON array: %v", body, err)
	}
	return a
}

// checkError checks an error answer: status, E2B's shape, code equal to
// the status and a message containing want.
func checkError(t *testing.T, status int, body []byte, wantStatus int, want string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status %d, want %d (body %s)", status, wantStatus, body)
	}
	m := decodeObject(t, body)
	if diff := cmp.Diff(errorKeys, keys(m)); diff != "" {
		t.Errorf("error keys (-want +got):\n%s", diff)
	}
	if code, _ := m["code"].(float64); int(code) != wantStatus {
		t.Errorf("code %v, want %d", m["code"], wantStatus)
	}
	if msg, _ := m["message"].(string); msg == "" || !strings.Contains(msg, want) {
		t.Errorf("message %q, want it to contain %q", msg, want)
	}
}

func running(id string) sandbox.Sandbox {
	return sandbox.Sandbox{ID: id, State: sandbox.StateRunning, Template: "desktop", Backend: "gvisor",
		CreatedAt: t0.Add(-time.Minute), ExpiresAt: t0.Add(time.Hour)}
}

func TestAuth(t *testing.T) {
	tests := []struct {
		name    string
		noKeys  bool
		method  string
		path    string
		headers map[string]string
		want    int
	}{
		{"X-API-KEY as the JS SDK spells it", false, "GET", "/sandboxes/sb1", map[string]string{"X-API-KEY": testKey}, 200},
		{"X-API-Key", false, "GET", "/sandboxes/sb1", map[string]string{"X-API-Key": testKey}, 200},
		{"lower-case header name", false, "GET", "/sandboxes/sb1", map[string]string{"x-api-key": testKey}, 200},
		{"second configured key", false, "GET", "/sandboxes/sb1", map[string]string{"X-API-Key": "other-key"}, 200},
		{"bearer", false, "GET", "/sandboxes/sb1", map[string]string{"Authorization": "Bearer " + testKey}, 200},
		{"bearer lower case", false, "GET", "/sandboxes/sb1", map[string]string{"Authorization": "bearer " + testKey}, 200},
		{"missing", false, "GET", "/sandboxes/sb1", map[string]string{}, 401},
		{"wrong", false, "GET", "/sandboxes/sb1", map[string]string{"X-API-Key": "e2b_ffff"}, 401},
		{"prefix of a key", false, "GET", "/sandboxes/sb1", map[string]string{"X-API-Key": testKey[:len(testKey)-1]}, 401},
		{"key plus more", false, "GET", "/sandboxes/sb1", map[string]string{"X-API-Key": testKey + "0"}, 401},
		{"wrong bearer", false, "GET", "/sandboxes/sb1", map[string]string{"Authorization": "Bearer nope"}, 401},
		{"basic is not bearer", false, "GET", "/sandboxes/sb1", map[string]string{"Authorization": "Basic " + testKey}, 401},
		{"empty bearer", false, "GET", "/sandboxes/sb1", map[string]string{"Authorization": "Bearer "}, 401},
		{"wrong key on create", false, "POST", "/v2/sandboxes", map[string]string{"X-API-Key": "x"}, 401},
		{"wrong key on list", false, "GET", "/v2/sandboxes", map[string]string{"X-API-Key": "x"}, 401},
		{"wrong key on kill", false, "DELETE", "/sandboxes/sb1", map[string]string{"X-API-Key": "x"}, 401},
		{"health needs no key", false, "GET", "/health", map[string]string{}, 204},
		{"health with a wrong key", false, "GET", "/health", map[string]string{"X-API-Key": "x"}, 204},
		{"no keys configured: auth off", true, "GET", "/sandboxes/sb1", map[string]string{}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, func(c *Config) {
				if tt.noKeys {
					c.APIKeys = nil
				}
			})
			f.add(running("sb1"))
			rec := do(t, s, tt.method, tt.path, "", tt.headers)
			if tt.want == 401 {
				checkError(t, rec.Code, rec.Body.Bytes(), 401, "API key")
				if len(f.created) != 0 || len(f.destroyed) != 0 {
					t.Errorf("an unauthorized request reached the manager")
				}
				return
			}
			if rec.Code != tt.want {
				t.Fatalf("status %d, want %d (body %s)", rec.Code, tt.want, rec.Body)
			}
		})
	}
}

func TestCreate(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		body       string
		wantStatus int
		wantMsg    string                                  // for errors
		check      func(*testing.T, sandbox.CreateRequest) // for successes
		template   string
	}{
		{
			name: "v2 minimal", path: "/v2/sandboxes", body: `{"templateID":"desktop"}`, wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				want := sandbox.CreateRequest{Template: "desktop", TimeoutSeconds: 300, IdleTimeoutSeconds: idleNever, Owner: sandbox.KeyOwner(testKey)}
				if diff := cmp.Diff(want, req); diff != "" {
					t.Errorf("create request (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "v1 default timeout is 15", path: "/sandboxes", body: `{"templateID":"base"}`, wantStatus: 201, template: "base",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if req.TimeoutSeconds != 15 || req.Template != "base" {
					t.Errorf("got %+v, want template base, timeout 15", req)
				}
			},
		},
		{
			name: "what @e2b/desktop sends", path: "/v2/sandboxes",
			body:       `{"templateID":"desktop","metadata":{"run":"42"},"envVars":{"DISPLAY":":0","_X1":"y"},"timeout":600,"secure":true,"allow_internet_access":false}`,
			wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				want := sandbox.CreateRequest{Template: "desktop", TimeoutSeconds: 600, IdleTimeoutSeconds: idleNever,
					Env: map[string]string{"DISPLAY": ":0", "_X1": "y"}, Metadata: map[string]string{"run": "42"},
					Network: sandbox.Network{Egress: "none"}, Owner: sandbox.KeyOwner(testKey)}
				if diff := cmp.Diff(want, req); diff != "" {
					t.Errorf("create request (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "unknown and ignored fields are accepted", path: "/v2/sandboxes",
			body: `{"templateID":"desktop","secure":false,"autoPause":false,"autoPauseMemory":true,"autoResume":{"enabled":false},
				"mcp":{"x":1},"iam":{"tokens":{}},"network":{"allowPublicTraffic":false,"maskRequestHost":"h","rules":{},"egressProxy":null},
				"volumeMounts":[],"brandNewField":{"a":[1,2,3]}}`,
			wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if diff := cmp.Diff(sandbox.Network{}, req.Network); diff != "" {
					t.Errorf("network, want the daemon default (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "template alias maps to a cubicle template", path: "/v2/sandboxes", body: `{"templateID":"k0wmnzir0zuzye6dndlw"}`,
			wantStatus: 201, template: "k0wmnzir0zuzye6dndlw",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if req.Template != "desktop" {
					t.Errorf("template %q, want desktop", req.Template)
				}
			},
		},
		{
			name: "timeout 0 is the shortest, not the longest", path: "/v2/sandboxes", body: `{"templateID":"desktop","timeout":0}`,
			wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if req.TimeoutSeconds != 1 {
					t.Errorf("timeout %d, want 1", req.TimeoutSeconds)
				}
			},
		},
		{
			name: "internet explicitly on", path: "/v2/sandboxes", body: `{"templateID":"desktop","allow_internet_access":true}`,
			wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if diff := cmp.Diff(sandbox.Network{Egress: "all"}, req.Network); diff != "" {
					t.Errorf("network (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "deny all but some CIDRs", path: "/v2/sandboxes",
			body:       `{"templateID":"desktop","network":{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1","10.1.2.3/8"]}}`,
			wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				want := sandbox.Network{Allow: []string{"1.1.1.1/32", "10.0.0.0/8"}}
				if diff := cmp.Diff(want, req.Network); diff != "" {
					t.Errorf("network (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "allowOut alone changes nothing", path: "/v2/sandboxes",
			body: `{"templateID":"desktop","network":{"allowOut":["example.com"]}}`, wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if req.Network.Egress != "" || req.Network.Allow != nil {
					t.Errorf("network %+v, want the daemon default", req.Network)
				}
			},
		},
		{
			name: "timeout past the longest life is capped", path: "/v2/sandboxes", body: `{"templateID":"desktop","timeout":2000000000}`,
			wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if req.TimeoutSeconds != sandbox.MaxTimeoutSeconds {
					t.Errorf("timeout %d, want the shared maximum %d", req.TimeoutSeconds, sandbox.MaxTimeoutSeconds)
				}
			},
		},
		{name: "missing templateID", path: "/v2/sandboxes", body: `{"timeout":30}`, wantStatus: 400, wantMsg: "templateID is required"},
		{name: "empty templateID", path: "/sandboxes", body: `{"templateID":""}`, wantStatus: 400, wantMsg: "templateID is required"},
		{name: "empty body", path: "/v2/sandboxes", body: ``, wantStatus: 400, wantMsg: "empty body"},
		{name: "unknown template lists the known ones", path: "/v2/sandboxes", body: `{"templateID":"No Such"}`, wantStatus: 400,
			wantMsg: `unknown template "No Such"; known templates: desktop, k0wmnzir0zuzye6dndlw (or one of your snapshots)`},
		{name: "malformed JSON", path: "/v2/sandboxes", body: `{"templateID":`, wantStatus: 400, wantMsg: "invalid JSON body"},
		{name: "null", path: "/v2/sandboxes", body: `null`, wantStatus: 400, wantMsg: "expected a JSON object, not null"},
		{name: "invalid UTF-8", path: "/v2/sandboxes", body: "{\"templateID\":\"desktop\",\"envVars\":{\"A\":\"x\xffy\"}}", wantStatus: 400, wantMsg: "not valid UTF-8"},
		{name: "not an object", path: "/v2/sandboxes", body: `[1,2]`, wantStatus: 400, wantMsg: "expected a JSON object"},
		{name: "trailing data", path: "/v2/sandboxes", body: `{"templateID":"desktop"} {}`, wantStatus: 400, wantMsg: "after the JSON value"},
		{name: "templateID of the wrong type", path: "/v2/sandboxes", body: `{"templateID":5}`, wantStatus: 400, wantMsg: `"templateID" has the wrong type`},
		{name: "negative timeout", path: "/v2/sandboxes", body: `{"templateID":"desktop","timeout":-1}`, wantStatus: 400, wantMsg: "timeout must be"},
		{name: "timeout past int32", path: "/v2/sandboxes", body: `{"templateID":"desktop","timeout":2147483648}`, wantStatus: 400, wantMsg: "timeout must be"},
		{name: "fractional timeout", path: "/v2/sandboxes", body: `{"templateID":"desktop","timeout":1.5}`, wantStatus: 400, wantMsg: `"timeout" has the wrong type`},
		{name: "env name with a dash", path: "/v2/sandboxes", body: `{"templateID":"desktop","envVars":{"MY-VAR":"1"}}`, wantStatus: 400, wantMsg: `"MY-VAR" is not a valid variable name`},
		{name: "env name starting with a digit", path: "/v2/sandboxes", body: `{"templateID":"desktop","envVars":{"1X":"1"}}`, wantStatus: 400, wantMsg: "not a valid variable name"},
		{name: "empty env name", path: "/v2/sandboxes", body: `{"templateID":"desktop","envVars":{"":"1"}}`, wantStatus: 400, wantMsg: "not a valid variable name"},
		{name: "env value with NUL", path: "/v2/sandboxes", body: `{"templateID":"desktop","envVars":{"A":"x\u0000y"}}`, wantStatus: 400, wantMsg: "NUL byte"},
		{name: "env value not a string", path: "/v2/sandboxes", body: `{"templateID":"desktop","envVars":{"A":1}}`, wantStatus: 400, wantMsg: "wrong type"},
		{name: "empty metadata key", path: "/v2/sandboxes", body: `{"templateID":"desktop","metadata":{"":"v"}}`, wantStatus: 400, wantMsg: "not a valid key"},
		{name: "autoResume", path: "/v2/sandboxes", body: `{"templateID":"desktop","autoPause":true,"autoResume":{"enabled":true}}`, wantStatus: 400, wantMsg: "autoResume is not supported"},
		{
			name: "autoPause", path: "/v2/sandboxes", body: `{"templateID":"desktop","autoPause":true}`,
			wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if !req.AutoPause {
					t.Error("autoPause: true did not reach the manager as AutoPause")
				}
			},
		},
		{
			name: "volume mounts", path: "/v2/sandboxes", body: `{"templateID":"desktop","volumeMounts":[{"name":"profile","path":"/home/user"}]}`,
			wantStatus: 201, template: "desktop",
			check: func(t *testing.T, req sandbox.CreateRequest) {
				if len(req.Volumes) != 1 || req.Volumes[0] != (sandbox.VolumeMount{Name: "profile", Path: "/home/user"}) {
					t.Errorf("volumes %+v, want profile at /home/user", req.Volumes)
				}
			},
		},
		{name: "volume mount without a path", path: "/v2/sandboxes", body: `{"templateID":"desktop","volumeMounts":[{"name":"v"}]}`, wantStatus: 400, wantMsg: "volumeMounts[0] must be"},
		{name: "volume mount at a forbidden path", path: "/v2/sandboxes", body: `{"templateID":"desktop","volumeMounts":[{"name":"v","path":"/proc"}]}`, wantStatus: 400, wantMsg: "volumeMounts[0].path"},
		{name: "volume mount with a bad name", path: "/v2/sandboxes", body: `{"templateID":"desktop","volumeMounts":[{"name":"../v","path":"/data"}]}`, wantStatus: 400, wantMsg: "volumeMounts[0].name"},
		{name: "egress proxy", path: "/v2/sandboxes", body: `{"templateID":"desktop","network":{"egressProxy":{"address":"p:1080"}}}`, wantStatus: 400, wantMsg: "egressProxy"},
		{name: "partial deny list", path: "/v2/sandboxes", body: `{"templateID":"desktop","network":{"denyOut":["8.8.8.8"]}}`, wantStatus: 400, wantMsg: "can only deny all traffic"},
		{name: "domain allowed under deny-all", path: "/v2/sandboxes", body: `{"templateID":"desktop","allow_internet_access":false,"network":{"allowOut":["example.com"]}}`, wantStatus: 400, wantMsg: "not by domain name"},
		// The rules every API shares (sandbox.ValidateCreate), named as
		// E2B's body names the fields.
		{name: "too many envVars", path: "/v2/sandboxes", body: `{"templateID":"desktop","envVars":` + jsonPairs(257, "v") + `}`, wantStatus: 400, wantMsg: "envVars has 257 variables (at most 256)"},
		{name: "envVars value too long", path: "/v2/sandboxes", body: `{"templateID":"desktop","envVars":{"A":"` + strings.Repeat("v", 32<<10+1) + `"}}`, wantStatus: 400, wantMsg: "envVars: the value of A is longer than 32768 bytes"},
		{name: "too many metadata keys", path: "/v2/sandboxes", body: `{"templateID":"desktop","metadata":` + jsonPairs(65, "v") + `}`, wantStatus: 400, wantMsg: "metadata has 65 keys (at most 64)"},
		{name: "metadata value too long", path: "/v2/sandboxes", body: `{"templateID":"desktop","metadata":{"k":"` + strings.Repeat("v", 1025) + `"}}`, wantStatus: 400, wantMsg: `metadata: the value of "k" is longer than 1024 bytes`},
		{name: "metadata key with a control character", path: "/v2/sandboxes", body: `{"templateID":"desktop","metadata":{"a\nb":"v"}}`, wantStatus: 400, wantMsg: `metadata: "a\nb" is not a valid key`},
		{name: "allowOut too long", path: "/v2/sandboxes", body: `{"templateID":"desktop","network":{"denyOut":["0.0.0.0/0"],"allowOut":` + jsonCIDRs(257) + `}}`, wantStatus: 400, wantMsg: "network.allowOut has 257 entries (at most 256)"},
		{name: "allowOut entry not a CIDR", path: "/v2/sandboxes", body: `{"templateID":"desktop","network":{"denyOut":["0.0.0.0/0"],"allowOut":["10.0.0.0/8","10.0.0.0/33"]}}`, wantStatus: 400, wantMsg: `network.allowOut[1]: "10.0.0.0/33" is not an IP address or CIDR`},
		{name: "body too large", path: "/v2/sandboxes", body: `{"templateID":"desktop","x":"` + strings.Repeat("a", maxBodyBytes) + `"}`, wantStatus: 413, wantMsg: "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, func(c *Config) {
				c.Templates = map[string]string{"desktop": "desktop", "k0wmnzir0zuzye6dndlw": "desktop"}
				if tt.path == "/sandboxes" {
					c.Templates["base"] = "base"
				}
			})
			rec := do(t, s, "POST", tt.path, tt.body, nil)
			if tt.wantStatus != 201 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.wantStatus, tt.wantMsg)
				if len(f.created) != 0 {
					t.Errorf("a refused create reached the manager: %+v", f.created)
				}
				return
			}
			if rec.Code != 201 {
				t.Fatalf("status %d, want 201 (body %s)", rec.Code, rec.Body)
			}
			if len(f.created) != 1 {
				t.Fatalf("manager saw %d creates, want 1", len(f.created))
			}
			tt.check(t, f.created[0])
			m := decodeObject(t, rec.Body.Bytes())
			if diff := cmp.Diff(sandboxKeys, keys(m)); diff != "" {
				t.Errorf("Sandbox keys (-want +got):\n%s", diff)
			}
			id, _ := m["sandboxID"].(string)
			want := map[string]any{
				"templateID": tt.template, "alias": tt.template, "sandboxID": id, "clientID": "cubicle",
				"envdVersion": "0.5.7", "envdAccessToken": AccessToken(testTokenKey, id),
				"trafficAccessToken": nil, "domain": nil,
			}
			if diff := cmp.Diff(want, m); diff != "" {
				t.Errorf("Sandbox (-want +got):\n%s", diff)
			}
			if id == "" || !AccessTokenOK(testTokenKey, id, m["envdAccessToken"].(string)) {
				t.Errorf("envdAccessToken does not check out for %q", id)
			}
		})
	}
}

func TestCreateConfig(t *testing.T) {
	s, f := newTestServer(t, func(c *Config) {
		c.Domain = "cubicle.test"
		c.EnvdVersion = "0.6.13"
		c.Backend = "runc"
	})
	rec := do(t, s, "POST", "/v2/sandboxes", `{"templateID":"desktop"}`, nil)
	if rec.Code != 201 {
		t.Fatalf("status %d (body %s)", rec.Code, rec.Body)
	}
	m := decodeObject(t, rec.Body.Bytes())
	if m["domain"] != "cubicle.test" || m["envdVersion"] != "0.6.13" {
		t.Errorf("domain %v, envdVersion %v; want cubicle.test, 0.6.13", m["domain"], m["envdVersion"])
	}
	if got := f.created[0].Backend; got != "runc" {
		t.Errorf("backend %q, want runc", got)
	}
}

func TestCreateErrors(t *testing.T) {
	tests := []struct {
		err     error
		status  int
		wantMsg string
	}{
		{errdefs.NotFound("template image desktop not found"), 404, "template image desktop not found"},
		{errdefs.Invalid("bad thing"), 400, "bad thing"},
		{errdefs.Conflict("in the way"), 409, "in the way"},
		{errdefs.New(errdefs.ErrCapacity, "all 16 sandbox slots are in use"), 429, "all 16 sandbox slots"},
		{fmt.Errorf("wrapped: %w", errdefs.ErrCapacity), 429, "no capacity"},
		{errdefs.New(errdefs.ErrRateLimited, "slow down"), 429, "slow down"},
		{errdefs.New(errdefs.ErrUnavailable, "backend gvisor is unavailable"), 503, "backend gvisor is unavailable"},
		{errdefs.New(errdefs.ErrTimeout, "create interrupted"), 504, "create interrupted"},
		{errors.New("disk /var/lib/cubicle on fire"), 500, "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			s, f := newTestServer(t, nil)
			f.createErr = tt.err
			rec := do(t, s, "POST", "/v2/sandboxes", `{"templateID":"desktop"}`, nil)
			checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.wantMsg)
			if strings.Contains(rec.Body.String(), "/var/lib") {
				t.Errorf("internal detail leaked: %s", rec.Body)
			}
		})
	}
}

func TestGet(t *testing.T) {
	starting := running("sbstarting")
	starting.State = sandbox.StateStarting
	stopped := running("sbstopped")
	stopped.State = sandbox.StateStopped
	failed := running("sbfailed")
	failed.State = sandbox.StateFailed
	forever := running("sbforever")
	forever.ExpiresAt = time.Time{}
	forever.Backend = "qemu"
	forever.Metadata = map[string]string{"k": "v"}
	tests := []struct {
		name    string
		id      string
		status  int
		check   func(*testing.T, map[string]any)
		wantMsg string
	}{
		{name: "running", id: "sb1", status: 200, check: func(t *testing.T, m map[string]any) {
			want := map[string]any{
				"templateID": "desktop", "alias": "desktop", "sandboxID": "sb1", "clientID": "cubicle",
				"startedAt": "2026-08-01T11:59:00Z", "endAt": "2026-08-01T13:00:00Z",
				"cpuCount": 2.0, "memoryMB": 2048.0, "diskSizeMB": 0.0, "metadata": map[string]any{},
				"state": "running", "envdVersion": "0.5.7", "envdAccessToken": AccessToken(testTokenKey, "sb1"),
				"domain": nil, "lifecycle": map[string]any{"autoResume": false, "onTimeout": "kill"},
			}
			if diff := cmp.Diff(want, m); diff != "" {
				t.Errorf("SandboxDetail (-want +got):\n%s", diff)
			}
		}},
		{name: "starting shows as running", id: "sbstarting", status: 200, check: func(t *testing.T, m map[string]any) {
			if m["state"] != "running" {
				t.Errorf("state %v, want running", m["state"])
			}
		}},
		{name: "no expiry, qemu, metadata", id: "sbforever", status: 200, check: func(t *testing.T, m map[string]any) {
			if m["endAt"] != "9999-12-31T23:59:59Z" || m["memoryMB"] != 1024.0 {
				t.Errorf("endAt %v, memoryMB %v", m["endAt"], m["memoryMB"])
			}
			if diff := cmp.Diff(map[string]any{"k": "v"}, m["metadata"]); diff != "" {
				t.Errorf("metadata (-want +got):\n%s", diff)
			}
		}},
		{name: "stopped is gone", id: "sbstopped", status: 404, wantMsg: `sandbox "sbstopped" not found`},
		{name: "failed is gone", id: "sbfailed", status: 404, wantMsg: "not found"},
		{name: "unknown", id: "nope", status: 404, wantMsg: `sandbox "nope" not found`},
		{name: "not an id", id: "a.b", status: 404, wantMsg: "not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			for _, sb := range []sandbox.Sandbox{running("sb1"), starting, stopped, failed, forever} {
				f.add(sb)
			}
			rec := do(t, s, "GET", "/sandboxes/"+tt.id, "", nil)
			if tt.status != 200 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.wantMsg)
				return
			}
			if rec.Code != 200 {
				t.Fatalf("status %d (body %s)", rec.Code, rec.Body)
			}
			m := decodeObject(t, rec.Body.Bytes())
			if diff := cmp.Diff(detailKeys, keys(m)); diff != "" {
				t.Errorf("SandboxDetail keys (-want +got):\n%s", diff)
			}
			tt.check(t, m)
		})
	}
}

func TestGetManagerError(t *testing.T) {
	s, f := newTestServer(t, nil)
	f.getErr = errors.New("store broken at /var/lib")
	rec := do(t, s, "GET", "/sandboxes/sb1", "", nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 500, "internal error")
}

func TestKill(t *testing.T) {
	tests := []struct {
		name   string
		id     string
		status int
	}{
		{"running", "sb1", 204},
		{"already stopped: the SDK's kill() returns false", "sbstopped", 404},
		{"unknown", "nope", 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			f.add(running("sb1"))
			stopped := running("sbstopped")
			stopped.State = sandbox.StateStopped
			f.add(stopped)
			rec := do(t, s, "DELETE", "/sandboxes/"+tt.id, "", nil)
			if tt.status != 204 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, "not found")
				if len(f.destroyed) != 0 {
					t.Errorf("destroyed %v", f.destroyed)
				}
				return
			}
			if rec.Code != 204 || rec.Body.Len() != 0 {
				t.Fatalf("status %d body %q, want 204 and no body", rec.Code, rec.Body)
			}
			if diff := cmp.Diff([]string{tt.id}, f.destroyed); diff != "" {
				t.Errorf("destroyed (-want +got):\n%s", diff)
			}
			// A second kill finds it gone.
			rec = do(t, s, "DELETE", "/sandboxes/"+tt.id, "", nil)
			checkError(t, rec.Code, rec.Body.Bytes(), 404, "not found")
		})
	}
}

func TestSetTimeout(t *testing.T) {
	tests := []struct {
		name     string
		id, body string
		status   int
		want     int // seconds passed to the manager
		wantMsg  string
	}{
		{name: "extend", id: "sb1", body: `{"timeout":3600}`, status: 204, want: 3600},
		{name: "0 means expire now", id: "sb1", body: `{"timeout":0}`, status: 204, want: 1},
		{name: "unknown fields", id: "sb1", body: `{"timeout":60,"x":true}`, status: 204, want: 60},
		{name: "no body", id: "sb1", body: ``, status: 400, wantMsg: "empty body"},
		{name: "no timeout", id: "sb1", body: `{}`, status: 400, wantMsg: "timeout is required"},
		{name: "negative", id: "sb1", body: `{"timeout":-5}`, status: 400, wantMsg: "timeout must be"},
		{name: "string", id: "sb1", body: `{"timeout":"60"}`, status: 400, wantMsg: "wrong type"},
		{name: "unknown", id: "nope", body: `{"timeout":60}`, status: 404, wantMsg: "not found"},
		{name: "stopped", id: "sbstopped", body: `{"timeout":60}`, status: 404, wantMsg: "not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			f.add(running("sb1"))
			stopped := running("sbstopped")
			stopped.State = sandbox.StateStopped
			f.add(stopped)
			rec := do(t, s, "POST", "/sandboxes/"+tt.id+"/timeout", tt.body, nil)
			if tt.status != 204 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.wantMsg)
				if len(f.timeouts) != 0 {
					t.Errorf("manager saw timeouts %v", f.timeouts)
				}
				return
			}
			if rec.Code != 204 || rec.Body.Len() != 0 {
				t.Fatalf("status %d body %q, want 204 and no body", rec.Code, rec.Body)
			}
			if diff := cmp.Diff([]int{tt.want}, f.timeouts); diff != "" {
				t.Errorf("timeouts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConnect(t *testing.T) {
	// sb1 expires at t0+1h (see running).
	tests := []struct {
		name    string
		path    string
		id      string
		body    string
		status  int
		want    []int // seconds passed to the manager
		wantMsg string
	}{
		{name: "v1 longer timeout extends", path: "/sandboxes/%s/connect", id: "sb1", body: `{"timeout":7200}`, status: 200, want: []int{7200}},
		{name: "v1 shorter timeout keeps the expiry", path: "/sandboxes/%s/connect", id: "sb1", body: `{"timeout":60}`, status: 200},
		{name: "v1 timeout 0 keeps the expiry", path: "/sandboxes/%s/connect", id: "sb1", body: `{"timeout":0}`, status: 200},
		{name: "v1 needs a timeout", path: "/sandboxes/%s/connect", id: "sb1", body: `{}`, status: 400, wantMsg: "timeout is required"},
		{name: "v1 needs a body", path: "/sandboxes/%s/connect", id: "sb1", body: ``, status: 400, wantMsg: "empty body"},
		{name: "v2 without body: 300 s keeps an hour", path: "/v2/sandboxes/%s/connect", id: "sb1", body: ``, status: 200},
		{name: "v2 with memory and timeout", path: "/v2/sandboxes/%s/connect", id: "sb1", body: `{"timeout":4000,"memory":false}`, status: 200, want: []int{4000}},
		{name: "v2 soon-expiring sandbox gets the default", path: "/v2/sandboxes/%s/connect", id: "sbsoon", body: `{}`, status: 200, want: []int{300}},
		{name: "v2 bad body", path: "/v2/sandboxes/%s/connect", id: "sb1", body: `{"timeout":`, status: 400, wantMsg: "invalid JSON"},
		{name: "unknown", path: "/v2/sandboxes/%s/connect", id: "nope", body: ``, status: 404, wantMsg: "not found"},
		{name: "stopped cannot be resumed", path: "/sandboxes/%s/connect", id: "sbstopped", body: `{"timeout":60}`, status: 404, wantMsg: "not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			f.add(running("sb1"))
			soon := running("sbsoon")
			soon.ExpiresAt = t0.Add(10 * time.Second)
			f.add(soon)
			stopped := running("sbstopped")
			stopped.State = sandbox.StateStopped
			f.add(stopped)
			rec := do(t, s, "POST", fmt.Sprintf(tt.path, tt.id), tt.body, nil)
			if tt.status != 200 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.wantMsg)
				return
			}
			if rec.Code != 200 {
				t.Fatalf("status %d (body %s)", rec.Code, rec.Body)
			}
			m := decodeObject(t, rec.Body.Bytes())
			if diff := cmp.Diff(sandboxKeys, keys(m)); diff != "" {
				t.Errorf("Sandbox keys (-want +got):\n%s", diff)
			}
			if m["sandboxID"] != tt.id || m["envdAccessToken"] != AccessToken(testTokenKey, tt.id) || m["templateID"] != "desktop" {
				t.Errorf("answer %v", m)
			}
			if diff := cmp.Diff(tt.want, f.timeouts); diff != "" {
				t.Errorf("timeouts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPauseResumeMetricsLogs(t *testing.T) {
	tests := []struct {
		name, method, path string
		status             int
		wantBody           string // for successes: the exact JSON
		wantMsg            string // for errors
	}{
		{name: "pause unknown", method: "POST", path: "/sandboxes/nope/pause", status: 404, wantMsg: "not found"},
		{name: "resume of a running sandbox", method: "POST", path: "/sandboxes/sb1/resume", status: 409, wantMsg: "already running"},
		{name: "resume unknown", method: "POST", path: "/sandboxes/nope/resume", status: 404, wantMsg: "not found"},
		{name: "metrics", method: "GET", path: "/sandboxes/sb1/metrics?start=1&end=2", status: 200, wantBody: `[]`},
		{name: "metrics bad start", method: "GET", path: "/sandboxes/sb1/metrics?start=-1", status: 400, wantMsg: "start must be"},
		{name: "metrics unknown", method: "GET", path: "/sandboxes/nope/metrics", status: 404, wantMsg: "not found"},
		{name: "logs v1", method: "GET", path: "/sandboxes/sb1/logs", status: 200, wantBody: `{"logs":[],"logEntries":[]}`},
		{name: "logs v2", method: "GET", path: "/v2/sandboxes/sb1/logs?limit=10&direction=forward", status: 200, wantBody: `{"logs":[]}`},
		{name: "logs v2 unknown", method: "GET", path: "/v2/sandboxes/nope/logs", status: 404, wantMsg: "not found"},
		// Kept while cubicle lists the sandbox, as E2B keeps a killed one's.
		{name: "logs of a stopped sandbox", method: "GET", path: "/sandboxes/sbstopped/logs", status: 200, wantBody: `{"logs":[],"logEntries":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			f.add(running("sb1"))
			stopped := running("sbstopped")
			stopped.State = sandbox.StateStopped
			f.add(stopped)
			rec := do(t, s, tt.method, tt.path, "", nil)
			if tt.status != 200 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.wantMsg)
				return
			}
			if rec.Code != 200 {
				t.Fatalf("status %d (body %s)", rec.Code, rec.Body)
			}
			if got := strings.TrimSpace(rec.Body.String()); got != tt.wantBody {
				t.Errorf("body %s, want %s", got, tt.wantBody)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

// TestPause checks pause, the deprecated resume and connect against the
// states a sandbox can be in, with E2B's statuses: 204 for a pause, 409
// for a pause of a paused sandbox (the SDK's pause() then returns
// false), 201 for a resume or a connect that resumed, 200 for a connect
// to a running one, 501 where the backend cannot pause.
func TestPause(t *testing.T) {
	tests := []struct {
		name, method, path, body string
		state                    sandbox.State
		pauseErr                 error
		status                   int
		wantMsg                  string
		wantState                sandbox.State // of sb1 afterwards
		wantResumed              []int
	}{
		{name: "pause", method: "POST", path: "/sandboxes/sb1/pause", state: sandbox.StateRunning, status: 204, wantState: sandbox.StatePaused},
		{name: "pause with memory", method: "POST", path: "/sandboxes/sb1/pause", body: `{"memory":true}`, state: sandbox.StateRunning, status: 204, wantState: sandbox.StatePaused},
		{name: "pause bad body", method: "POST", path: "/sandboxes/sb1/pause", body: `{"memory":"yes"}`, state: sandbox.StateRunning, status: 400, wantMsg: "memory", wantState: sandbox.StateRunning},
		{name: "pause paused", method: "POST", path: "/sandboxes/sb1/pause", state: sandbox.StatePaused, status: 409, wantMsg: "already paused", wantState: sandbox.StatePaused},
		{name: "pause unsupported", method: "POST", path: "/sandboxes/sb1/pause", state: sandbox.StateRunning,
			pauseErr: errdefs.New(errdefs.ErrNotSupported, "the firecracker backend cannot pause sandboxes"), status: 501, wantMsg: "cannot pause", wantState: sandbox.StateRunning},
		{name: "resume paused", method: "POST", path: "/sandboxes/sb1/resume", body: `{"timeout":60}`, state: sandbox.StatePaused, status: 201, wantState: sandbox.StateRunning, wantResumed: []int{60}},
		{name: "resume paused, no body", method: "POST", path: "/sandboxes/sb1/resume", state: sandbox.StatePaused, status: 201, wantState: sandbox.StateRunning, wantResumed: []int{15}},
		{name: "connect paused", method: "POST", path: "/sandboxes/sb1/connect", body: `{"timeout":120}`, state: sandbox.StatePaused, status: 201, wantState: sandbox.StateRunning, wantResumed: []int{120}},
		{name: "connect v2 paused", method: "POST", path: "/v2/sandboxes/sb1/connect", state: sandbox.StatePaused, status: 201, wantState: sandbox.StateRunning, wantResumed: []int{300}},
		{name: "connect running", method: "POST", path: "/sandboxes/sb1/connect", body: `{"timeout":120}`, state: sandbox.StateRunning, status: 200, wantState: sandbox.StateRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			sb := running("sb1")
			sb.State = tt.state
			f.add(sb)
			f.pauseErr = tt.pauseErr
			rec := do(t, s, tt.method, tt.path, tt.body, nil)
			if tt.status >= 400 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.wantMsg)
			} else if rec.Code != tt.status {
				t.Fatalf("status %d, want %d (body %s)", rec.Code, tt.status, rec.Body)
			}
			if tt.status == 201 || tt.status == 200 {
				if m := decodeObject(t, rec.Body.Bytes()); m["sandboxID"] != "sb1" {
					t.Errorf("body %v, want the Sandbox sb1", m)
				}
			}
			got, _ := f.Get(context.Background(), "sb1")
			if got.State != tt.wantState {
				t.Errorf("sb1 is %s afterwards, want %s", got.State, tt.wantState)
			}
			if diff := cmp.Diff(tt.wantResumed, f.resumed); diff != "" {
				t.Errorf("Resume calls (-want +got):\n%s", diff)
			}
		})
	}
	// A paused sandbox is listed and shown as paused, and filtered so.
	s, f := newTestServer(t, nil)
	f.add(running("sbrun"))
	p := running("sbpaused")
	p.State = sandbox.StatePaused
	f.add(p)
	for query, want := range map[string]string{"state=paused": "sbpaused", "state=running": "sbrun"} {
		rec := do(t, s, "GET", "/v2/sandboxes?"+query, "", nil)
		items := decodeArray(t, rec.Body.Bytes())
		if len(items) != 1 || items[0]["sandboxID"] != want {
			t.Errorf("list %s: %v, want only %s", query, items, want)
		}
	}
	rec := do(t, s, "GET", "/sandboxes/sbpaused", "", nil)
	if m := decodeObject(t, rec.Body.Bytes()); m["state"] != "paused" {
		t.Errorf("get of a paused sandbox: state %v, want paused", m["state"])
	}
}

func TestUnmatched(t *testing.T) {
	s, _ := newTestServer(t, nil)
	rec := do(t, s, "GET", "/nothing/here", "", nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 404, "no such endpoint")
	rec = do(t, s, "PUT", "/sandboxes/sb1", "", nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 405, "not allowed")
	if allow := rec.Header().Get("Allow"); !strings.Contains(allow, "DELETE") || !strings.Contains(allow, "GET") {
		t.Errorf("Allow %q, want GET and DELETE", allow)
	}
}

func TestPanicIsA500(t *testing.T) {
	s, f := newTestServer(t, nil)
	f.panicOnGet = true
	rec := do(t, s, "GET", "/sandboxes/sb1", "", nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 500, "internal error")
}

func TestRoutes(t *testing.T) {
	s, f := newTestServer(t, nil)
	f.add(running("sb1"))
	want := []string{
		"GET /health", "POST /sandboxes", "POST /v2/sandboxes", "GET /sandboxes", "GET /v2/sandboxes",
		"GET /sandboxes/{id}", "DELETE /sandboxes/{id}", "POST /sandboxes/{id}/timeout",
		"POST /sandboxes/{id}/connect", "POST /v2/sandboxes/{id}/connect", "POST /sandboxes/{id}/pause",
		"POST /sandboxes/{id}/resume", "POST /sandboxes/{id}/fork",
		"POST /sandboxes/{id}/snapshots", "GET /snapshots", "DELETE /templates/{templateID}", "GET /sandboxes/{id}/metrics", "GET /sandboxes/{id}/logs",
		"GET /v2/sandboxes/{id}/logs",
	}
	var got []string
	mux := http.NewServeMux()
	for _, r := range s.Routes() {
		got = append(got, r.Pattern)
		if r.Open != (r.Pattern == "GET /health") {
			t.Errorf("%s: Open %v", r.Pattern, r.Open)
		}
		mux.HandleFunc(r.Pattern, r.Handler)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("patterns (-want +got):\n%s", diff)
	}
	// Routes mounted on a bare mux still check the key.
	rec := do(t, mux, "GET", "/sandboxes/sb1", "", map[string]string{"X-API-Key": "wrong"})
	checkError(t, rec.Code, rec.Body.Bytes(), 401, "API key")
	rec = do(t, mux, "GET", "/sandboxes/sb1", "", nil)
	if rec.Code != 200 {
		t.Errorf("status %d with the key, want 200", rec.Code)
	}
}

func TestDefaults(t *testing.T) {
	s := New(Config{}, newFakeManager(), nil)
	if diff := cmp.Diff(map[string]string{"desktop": "desktop", "base": "base"}, s.templates); diff != "" {
		t.Errorf("default templates (-want +got):\n%s", diff)
	}
	if s.cfg.EnvdVersion != DefaultEnvdVersion {
		t.Errorf("envd version %q", s.cfg.EnvdVersion)
	}
}

func TestTemplateNames(t *testing.T) {
	s := New(Config{Templates: map[string]string{"zz": "desktop", "aa": "desktop", "desktop": "desktop", "b2": "base", "b1": "base"}},
		newFakeManager(), nil)
	for _, tt := range []struct{ tmpl, want string }{
		{"desktop", "desktop"}, // the identical name wins
		{"base", "b1"},         // else the first in sort order
		{"other", "other"},     // templates no name maps to show as they are
	} {
		if got := s.e2bTemplate(tt.tmpl); got != tt.want {
			t.Errorf("e2bTemplate(%q) = %q, want %q", tt.tmpl, got, tt.want)
		}
	}
}

// jsonPairs returns a JSON object of n keys K0, K1, ... with value v.
func jsonPairs(n int, v string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("%q:%q", fmt.Sprintf("K%d", i), v)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// jsonCIDRs returns a JSON array of n distinct /24 CIDRs.
func jsonCIDRs(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"10.%d.%d.0/24"`, i/256, i%256)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// errReader fails every read, like a client that broke off mid-body.
type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestBrokenBody(t *testing.T) {
	s, f := newTestServer(t, nil)
	req := httptest.NewRequest("POST", "/v2/sandboxes", errReader{})
	req.Header.Set("X-API-Key", testKey)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	checkError(t, rec.Code, rec.Body.Bytes(), 400, "could not read the request body")
	if len(f.created) != 0 {
		t.Errorf("manager saw a create")
	}
}

func TestOwnsPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/health": true, "/sandboxes": true, "/sandboxes/abc/timeout": true, "/v2/sandboxes": true,
		"/v2/sandboxes/abc/logs": true, "/v1/sandboxes": false, "/healthz": false, "/sandboxesx": false, "/": false,
		"/snapshots": true, "/templates/snap1": true, "/v1/snapshots": false, "/snapshotsx": false, "/templates": false,
	} {
		if got := OwnsPath(p); got != want {
			t.Errorf("OwnsPath(%q) = %v, want %v", p, got, want)
		}
	}
	// Every route's path is owned: the daemon gives the control plane
	// only the requests OwnsPath claims.
	s, _ := newTestServer(t, nil)
	for _, r := range s.Routes() {
		_, p, _ := strings.Cut(r.Pattern, " ")
		p = strings.NewReplacer("{id}", "abc", "{templateID}", "snap1").Replace(p)
		if !OwnsPath(p) {
			t.Errorf("route %s: OwnsPath(%q) is false", r.Pattern, p)
		}
	}
}

// TestFork checks E2B's fork: {timeout, count} in, 201 with one
// {"sandbox": …} per fork (each with its own envd token) out; what
// cubicle refuses is refused whole, in E2B's error shape.
func TestFork(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		state      sandbox.State
		forkErr    error
		status     int
		wantMsg    string
		wantForks  int
		wantCalls  []int
		wantExpiry time.Duration // of each fork, from the fake's clock
	}{
		{name: "default", status: 201, wantForks: 1, wantCalls: []int{1}},
		{name: "three with a timeout", body: `{"count":3,"timeout":120}`, status: 201, wantForks: 3, wantCalls: []int{3}, wantExpiry: 120 * time.Second},
		{name: "count 0", body: `{"count":0}`, status: 400, wantMsg: "count must be"},
		{name: "count past E2B's 100", body: `{"count":101}`, status: 400, wantMsg: "count must be"},
		{name: "count past cubicle's 10", body: `{"count":11}`, status: 400, wantMsg: "at most 10"},
		{name: "count a string", body: `{"count":"2"}`, status: 400, wantMsg: "count"},
		{name: "negative timeout", body: `{"timeout":-1}`, status: 400, wantMsg: "timeout"},
		{name: "an unknown member is E2B's newer field", body: `{"count":2,"copies":9}`, status: 201, wantForks: 2, wantCalls: []int{2}},
		{name: "not supported", forkErr: errdefs.New(errdefs.ErrNotSupported, "the gvisor backend cannot fork sandboxes yet; qemu can"), status: 501, wantMsg: "cannot fork", wantCalls: []int{1}},
		{name: "paused", state: sandbox.StatePaused, status: 409, wantMsg: "paused", wantCalls: []int{1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			sb := running("sb1")
			if tt.state != "" {
				sb.State = tt.state
			}
			f.add(sb)
			f.forkErr = tt.forkErr
			rec := do(t, s, "POST", "/sandboxes/sb1/fork", tt.body, nil)
			if !slices.Equal(f.forks, tt.wantCalls) {
				t.Errorf("Fork called with %v, want %v", f.forks, tt.wantCalls)
			}
			if tt.status != 201 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.wantMsg)
				return
			}
			if rec.Code != 201 {
				t.Fatalf("status %d (body %s)", rec.Code, rec.Body)
			}
			var out []struct {
				Sandbox *struct {
					SandboxID       string `json:"sandboxID"`
					EnvdAccessToken string `json:"envdAccessToken"`
					EndAt           string `json:"endAt"`
				} `json:"sandbox"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			if len(out) != tt.wantForks {
				t.Fatalf("%d results, want %d: %s", len(out), tt.wantForks, rec.Body)
			}
			tokens := map[string]bool{AccessToken(testTokenKey, "sb1"): true}
			for _, r := range out {
				if r.Sandbox == nil || r.Sandbox.SandboxID == "sb1" || tokens[r.Sandbox.EnvdAccessToken] {
					t.Errorf("result %+v: want a fork with an envd token of its own", r.Sandbox)
					continue
				}
				tokens[r.Sandbox.EnvdAccessToken] = true
				if r.Sandbox.EnvdAccessToken != AccessToken(testTokenKey, r.Sandbox.SandboxID) {
					t.Errorf("fork %s carries a token not its own", r.Sandbox.SandboxID)
				}
			}
			if tt.wantExpiry > 0 && !slices.Equal(f.timeouts, []int{120, 120, 120}) {
				t.Errorf("timeouts set %v, want 120 s on each fork", f.timeouts)
			}
		})
	}
}
