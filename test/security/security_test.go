// Package security is cubicle's security suite (`make security`; also part
// of `make test`). It runs a real cubicled with real gVisor sandboxes and
// attacks it from outside: every route of the native and E2B APIs (taken
// from the route tables that register them, so a new route cannot be
// forgotten) without a key, with wrong keys and with keys in the wrong
// place; live-view and envd tokens used where they do not belong; path
// traversal in sandbox IDs, template names and file paths; malformed and
// oversized bodies. Then it checks that nothing was created or touched,
// that the daemon still serves, and that no key or token reached its log.
// The sandbox-side attacks (a sandbox reaching the daemon's API, the
// host's other ports, another sandbox, the cloud metadata address) need
// sandbox networking and run in test/e2e TestNetwork, inside a network
// namespace that test makes; `make security` runs it too.
package security

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/cluster/etcdtest"
	"github.com/cubicle-dev/cubicle/internal/e2b"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// tally counts attacks per kind, for the figures the suite logs.
type tally map[string]int

func (t tally) String() string {
	keys := make([]string, 0, len(t))
	total := 0
	for k, n := range t {
		keys = append(keys, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(keys)
	return fmt.Sprintf("%d attacks, all refused: %s", total, strings.Join(keys, ", "))
}

type env struct {
	t       *testing.T
	d       *harness.Daemon
	dataDir string
	c       *client.Client
	key     string
	sb      client.Sandbox
	other   string // a second sandbox (E2B, secure)
	token   string // envd access token of other
	secret  []string
	logs    []string // every daemon's log (two in cluster mode)
}

func imageDir() string {
	if d := os.Getenv("CUBICLE_IMAGE_DIR"); d != "" {
		return d
	}
	return "/var/lib/cubicle/images"
}

func setup(t *testing.T) *env { return setupNodes(t, false) }

// setupNodes starts the daemon the suite attacks: one, or in cluster mode
// two nodes on a real etcd, where the suite talks to node a and both
// sandboxes are placed on node b (it has room for ten, a for one), so that
// every sandbox request is one node passing it to another.
func setupNodes(t *testing.T, cluster bool) *env {
	t.Helper()
	needs.Root(t)
	needs.Runtime(t, "runsc")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	// An E2B-format key: the native API and E2B's control plane both take it.
	key := "e2b_5ec0e1d4c0ffee5ec0e1d4c0ffee5ec0e1d4c0ff"
	// The key may have two live sandboxes: the two this suite makes.
	common := []string{"--key-max-sandboxes", "2"}
	names := []string{"single"}
	var etcd *etcdtest.Cluster
	if cluster {
		etcd = etcdtest.Start(t, 1)
		names = []string{"a", "b"}
	}
	e := &env{t: t, key: key}
	var daemons []*harness.Daemon
	var dirs []string
	t.Cleanup(func() {
		if e.c != nil {
			if sbs, err := e.c.List(context.Background(), client.ListOptions{}); err == nil {
				for _, sb := range sbs {
					e.c.Destroy(context.Background(), sb.ID)
				}
			}
		}
		for _, d := range daemons {
			d.Stop()
			if t.Failed() {
				log, _ := os.ReadFile(d.Log)
				lines := strings.Split(string(log), "\n")
				t.Logf("cubicled log (tail):\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		}
		for _, dir := range dirs {
			os.RemoveAll(dir)
		}
	})
	for _, name := range names {
		dataDir, err := os.MkdirTemp("", "cubicle-security-")
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dataDir)
		args := common
		if cluster {
			slots := map[string]string{"a": "1", "b": "10"}[name]
			args = append(slices.Clone(common), "--cluster-etcd", strings.Join(etcd.Endpoints(), ","), "--node-name", name, "--max-sandboxes", slots)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		d, err := harness.Start(ctx, harness.Options{DataDir: dataDir, ImageDir: imageDir(), APIKey: key,
			Env: []string{"CUBICLE_LOG_LEVEL=debug"}, Args: args})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		daemons = append(daemons, d)
		e.logs = append(e.logs, d.Log)
	}
	// The suite talks to the first; sandboxes live on the last.
	e.d, e.dataDir = daemons[0], dirs[len(dirs)-1]
	c := client.New(e.d.URL, client.WithAPIKey(key), client.WithTimeout(3*time.Minute))
	e.c = c
	if cluster {
		deadline := time.Now().Add(time.Minute)
		for {
			info, err := c.Info(context.Background())
			if err == nil && info.Cluster != nil && len(info.Cluster.Nodes) == 2 && info.Cluster.Degraded == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster did not form: %+v, %v", info.Cluster, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var err error
	e.sb, err = c.Create(context.Background(), client.CreateRequest{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	// A second sandbox, made through E2B's API with secure: true, so that
	// it has an envd access token.
	var created struct {
		SandboxID        string `json:"sandboxID"`
		EnvdAccessToken  string `json:"envdAccessToken"`
		TrafficAccessTok string `json:"trafficAccessToken"`
	}
	resp := e.do("POST", "/sandboxes", `{"templateID":"desktop","secure":true,"timeout":300}`, "X-API-Key", key)
	if resp.code != http.StatusCreated || json.Unmarshal(resp.body, &created) != nil || created.EnvdAccessToken == "" {
		t.Fatalf("E2B create: %d %s", resp.code, resp.body)
	}
	e.other, e.token = created.SandboxID, created.EnvdAccessToken
	if cluster {
		for _, id := range []string{e.sb.ID, e.other} {
			if sb, err := c.Get(context.Background(), id); err != nil || sb.Node != "b" {
				t.Fatalf("sandbox %s is on %q (%v); the cluster suite wants both on b", id, sb.Node, err)
			}
		}
	}
	e.secret = []string{key, created.EnvdAccessToken}
	if created.TrafficAccessTok != "" {
		e.secret = append(e.secret, created.TrafficAccessTok)
	}
	return e
}

// noRedirects shows the daemon's own answer: a redirect is not followed.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

type answer struct {
	code int
	body []byte
	hdr  http.Header
}

// do sends one request; headers are name, value pairs.
func (e *env) do(method, path, body string, headers ...string) answer {
	e.t.Helper()
	return e.doHost("", method, path, body, headers...)
}

func (e *env) doHost(host, method, path, body string, headers ...string) answer {
	e.t.Helper()
	req, err := http.NewRequest(method, e.d.URL+path, strings.NewReader(body))
	if err != nil {
		// Some attacks are not even valid URLs for Go's client: send raw.
		req, err = http.NewRequest(method, e.d.URL+"/", strings.NewReader(body))
		if err != nil {
			e.t.Fatal(err)
		}
		req.URL.Opaque = path
	}
	if host != "" {
		req.Host = host
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] != "" {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return answer{code: resp.StatusCode, body: b, hdr: resp.Header}
}

// routes is every route the daemon serves, from the tables that register
// them: the native API's and E2B's control plane.
func routes(t *testing.T) (native []api.RouteInfo, e2bRoutes []e2b.Route) {
	native = api.New(api.Config{}, nil, nil, nil).Routes()
	e2bRoutes = e2b.New(e2b.Config{TokenKey: []byte("x")}, nil, nil).Routes()
	if len(native) < 20 || len(e2bRoutes) < 10 {
		t.Fatalf("route tables: %d native, %d E2B routes; the suite would cover too little", len(native), len(e2bRoutes))
	}
	return native, e2bRoutes
}

// concrete fills a pattern's {id} with a real sandbox, its {name} with a
// volume and its {snapshot} and {templateID} with a snapshot that do not
// exist.
func concrete(pattern, id string) (method, path string) {
	method, path, _ = strings.Cut(pattern, " ")
	path = strings.ReplaceAll(path, "{$}", "")
	path = strings.ReplaceAll(path, "{name}", "no-such-volume")
	path = strings.ReplaceAll(path, "{snapshot}", "no-such-snapshot")
	path = strings.ReplaceAll(path, "{templateID}", "no-such-snapshot")
	return method, strings.ReplaceAll(path, "{id}", id)
}

// missingID is a well-formed sandbox ID that names no sandbox.
const missingID = "zzzzzzzzzzzzzzzzzzzzzzzzzz"

// controlBody is a request body no route acts on: an unknown template
// for the creates, unknown fields for the rest.
const controlBody = `{"template":"no-such-template","templateID":"no-such-template"}`

// badKeys are the ways a caller without the key might try.
func badKeys(key string) [][]string {
	return [][]string{
		{},
		{"X-API-Key", "wrong"},
		{"X-API-Key", key[:len(key)-1]},
		{"X-API-Key", key + "0"},
		{"X-API-Key", key[:8]},
		{"X-API-Key", strings.ToUpper(key)},
		{"Authorization", "Bearer wrong"},
		{"Authorization", "Basic " + key},
		{"Authorization", key},
		{"Cookie", "api_key=" + key},
		{"X-Api-Key-Wrong", key},
	}
}

func TestSecurity(t *testing.T) { securitySuite(t, setup(t)) }

// TestSecurityCluster is the same suite against node a of a two-node
// cluster whose sandboxes are on node b: whatever a client sends to a,
// the request that b gets must be no more authenticated than the client
// was (the forwarding header grants nothing), and neither node's log may
// hold a secret.
func TestSecurityCluster(t *testing.T) { securitySuite(t, setupNodes(t, true)) }

func securitySuite(t *testing.T, e *env) {
	native, e2bRoutes := routes(t)
	n := tally{}
	before := e.inventory()

	t.Run("auth on every route", func(t *testing.T) {
		for _, rt := range native {
			method, path := concrete(rt.Pattern, e.sb.ID)
			for _, h := range badKeys(e.key) {
				a := e.do(method, path, "{}", h...)
				if rt.Auth == "open" {
					if a.code == http.StatusUnauthorized {
						t.Errorf("%s (open) with %v: 401", rt.Pattern, h)
					}
					continue
				}
				n["native route without a valid key"]++
				// The viewer page answers a person: an HTML page, 401 all the same.
				page := strings.HasPrefix(a.hdr.Get("Content-Type"), "text/html")
				if a.code != http.StatusUnauthorized || !(page || isNativeError(a.body, "unauthorized")) {
					t.Errorf("%s with %v: %d %.200s, want 401 unauthorized", rt.Pattern, h, a.code, a.body)
				}
			}
			// The key in the query string is not a key either.
			if rt.Auth != "open" {
				n["native route with the key in the URL"]++
				if a := e.do(method, path+"?api_key="+e.key+"&token="+e.key, "{}"); a.code != http.StatusUnauthorized {
					t.Errorf("%s with the key in the query: %d", rt.Pattern, a.code)
				}
			}
			// Control: the right key gets past authentication (on a sandbox
			// that does not exist, so that nothing is destroyed or made).
			_, cpath := concrete(rt.Pattern, missingID)
			if a := e.do(method, cpath, controlBody, "X-API-Key", e.key); a.code == http.StatusUnauthorized {
				t.Errorf("%s with the right key: 401", rt.Pattern)
			}
		}
		for _, rt := range e2bRoutes {
			method, path := concrete(rt.Pattern, e.other)
			for _, h := range badKeys(e.key) {
				a := e.do(method, path, "{}", h...)
				if rt.Open {
					continue
				}
				n["E2B route without a valid key"]++
				if a.code != http.StatusUnauthorized || !bytes.Contains(a.body, []byte(`"code":401`)) {
					t.Errorf("E2B %s with %v: %d %.200s, want 401 in E2B's shape", rt.Pattern, h, a.code, a.body)
				}
			}
			_, cpath := concrete(rt.Pattern, missingID)
			if a := e.do(method, cpath, controlBody, "X-API-Key", e.key); a.code == http.StatusUnauthorized {
				t.Errorf("E2B %s with the right key: 401", rt.Pattern)
			}
		}
		// Unknown paths need a key too: nobody probes for endpoints.
		for _, p := range []string{"/v1/nope", "/v1/sandboxes/" + e.sb.ID + "/nope", "/admin", "/debug/pprof/", "/.env"} {
			n["unknown path"]++
			if a := e.do("GET", p, ""); a.code != http.StatusUnauthorized && a.code != http.StatusNotFound {
				t.Errorf("GET %s without a key: %d", p, a.code)
			} else if a.code == http.StatusNotFound && strings.HasPrefix(p, "/v1/") {
				t.Errorf("GET %s without a key: 404 tells a stranger what exists; want 401", p)
			}
		}
	})

	t.Run("live-view tokens", func(t *testing.T) {
		v, err := e.c.View(context.Background(), e.sb.ID, client.ViewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(v.URL)
		tok := u.Query().Get("token")
		if tok == "" {
			t.Fatalf("view URL %s has no token", v.URL)
		}
		e.secret = append(e.secret, tok)
		other, err := e.c.View(context.Background(), e.other, client.ViewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ou, _ := url.Parse(other.URL)
		otherTok := ou.Query().Get("token")
		e.secret = append(e.secret, otherTok)
		tampered := []byte(tok)
		tampered[len(tampered)/2] ^= 1
		for _, c := range []struct {
			name, path string
			headers    []string
			want       int
		}{
			{"token as an API key", "/v1/sandboxes/" + e.sb.ID, []string{"X-API-Key", tok}, 401},
			{"token as a bearer key", "/v1/sandboxes", []string{"Authorization", "Bearer " + tok}, 401},
			{"token on a REST route", "/v1/sandboxes/" + e.sb.ID + "/screenshot?token=" + tok, nil, 401},
			{"token for exec", "/v1/sandboxes/" + e.sb.ID + "/files/list?path=/&token=" + tok, nil, 401},
			{"another sandbox's token", "/view/" + e.sb.ID + "?token=" + otherTok, nil, 403},
			{"another sandbox's token, WebSocket", "/v1/sandboxes/" + e.sb.ID + "/vnc?token=" + otherTok, nil, 403},
			{"tampered token", "/v1/sandboxes/" + e.sb.ID + "/vnc?token=" + string(tampered), nil, 401},
			{"truncated token", "/v1/sandboxes/" + e.sb.ID + "/vnc?token=" + tok[:len(tok)-4], nil, 401},
			{"garbage token", "/view/" + e.sb.ID + "?token=%00%ff..%2f", nil, 401},
		} {
			n["live-view token misuse"]++
			if a := e.do("GET", c.path, "", c.headers...); a.code != c.want {
				t.Errorf("%s: %d %.200s, want %d", c.name, a.code, a.body, c.want)
			} else if a.hdr.Get("Upgrade") != "" {
				t.Errorf("%s: the connection was upgraded", c.name)
			}
		}
	})

	t.Run("envd access tokens", func(t *testing.T) {
		host := "49983-" + e.other + ".e2b.test"
		rpc := "/process.Process/List"
		for _, c := range []struct {
			name    string
			host    string
			headers []string
		}{
			{"no token", "", []string{"E2b-Sandbox-Id", e.other, "E2b-Sandbox-Port", "49983"}},
			{"wrong token", "", []string{"E2b-Sandbox-Id", e.other, "E2b-Sandbox-Port", "49983", "X-Access-Token", "wrong"}},
			{"API key as token", "", []string{"E2b-Sandbox-Id", e.other, "E2b-Sandbox-Port", "49983", "X-Access-Token", e.key}},
			{"its token on another sandbox", "", []string{"E2b-Sandbox-Id", e.sb.ID, "E2b-Sandbox-Port", "49983", "X-Access-Token", e.token}},
			{"host routing, no token", host, nil},
		} {
			n["envd token misuse"]++
			a := e.doHost(c.host, "POST", rpc, "{}", append(c.headers, "Content-Type", "application/json")...)
			if a.code != http.StatusUnauthorized && a.code != http.StatusForbidden {
				t.Errorf("%s: %d %.200s, want 401 or 403", c.name, a.code, a.body)
			}
		}
		// Control: the right token works.
		a := e.doHost("", "POST", rpc, "{}", "E2b-Sandbox-Id", e.other, "E2b-Sandbox-Port", "49983", "X-Access-Token", e.token)
		if a.code != http.StatusOK {
			t.Errorf("the sandbox's own token: %d %.200s, want 200", a.code, a.body)
		}
	})

	t.Run("path traversal and hostile IDs", func(t *testing.T) {
		ids := []string{"..", "%2e%2e", "..%2f..%2fetc", "%2e%2e%2f%2e%2e%2fetc%2fpasswd", "a%00b", strings.Repeat("a", 5000),
			"%ff%fe", "*", e.sb.ID + "%2f..", "..%5c..%5c"}
		for _, id := range ids {
			for _, p := range []string{"/v1/sandboxes/" + id, "/v1/sandboxes/" + id + "/screenshot", "/sandboxes/" + id, "/view/" + id} {
				n["hostile sandbox ID"]++
				a := e.do("GET", p, "", "X-API-Key", e.key)
				if a.code >= 500 || a.code < 300 {
					t.Errorf("GET %s: %d %.200s, want a 4xx (or a redirect to the cleaned path)", p, a.code, a.body)
				}
			}
		}
		for _, tmpl := range []string{"../../etc", "/etc/passwd", "desktop/../../x", "..", "desktop\x00", strings.Repeat("t", 3000)} {
			n["hostile template or image name"]++
			body, _ := json.Marshal(map[string]any{"templateID": tmpl})
			if a := e.do("POST", "/sandboxes", string(body), "X-API-Key", e.key); a.code < 400 || a.code >= 500 {
				t.Errorf("E2B create with template %q: %d %.200s, want a 4xx", tmpl, a.code, a.body)
			}
			body, _ = json.Marshal(map[string]any{"template": tmpl})
			if a := e.do("POST", "/v1/sandboxes", string(body), "X-API-Key", e.key); a.code < 400 || a.code >= 500 {
				t.Errorf("create with template %q: %d %.200s, want a 4xx", tmpl, a.code, a.body)
			}
		}
	})

	// The file APIs act inside the sandbox: no path, .. or symlink reads,
	// writes, deletes or lists a file of the host (files_test.go).
	t.Run("file API escapes", func(t *testing.T) {
		nativeCs := e.canaries(t, e.sb.ID, e.sandboxStateDir(t, e.sb.ID))
		e2bCs := e.canaries(t, e.other, e.sandboxStateDir(t, e.other))
		e.fileEscapes(t, e.nativeDoor(e.sb.ID), nativeCs, n)
		e.fileEscapes(t, e.e2bDoor(), e2bCs, n)
		checkCanaries(t, nativeCs)
		checkCanaries(t, e2bCs)
		// The daemon's own log, a host file no sandbox has.
		logHead, err := os.ReadFile(e.d.Log)
		if err != nil || len(logHead) < 64 {
			t.Fatalf("daemon log: %d bytes, %v", len(logHead), err)
		}
		for _, d := range []door{e.nativeDoor(e.sb.ID), e.e2bDoor()} {
			for _, p := range []string{e.d.Log, links + "/root" + e.d.Log, links + "/up" + e.d.Log} {
				n["file API escape: read"]++
				// (Through links/root this runsc answers "is a directory": see canaries.)
				code, body := d.read(p)
				if code < 400 || code >= 500 || (p == e.d.Log && code != http.StatusNotFound) || bytes.Contains(body, logHead[:64]) {
					t.Errorf("%s: read %s (the daemon's log on the host): %d %.200q, want a refusal (404 for the plain path)", d.name, p, code, body)
				}
			}
		}
	})

	// From inside a sandbox: another sandbox's agent is nowhere to be
	// found, and its own agent refuses a process of the sandbox that has
	// no token (the agent runs as root; a user process must not reach it).
	t.Run("agent channels from inside a sandbox", func(t *testing.T) {
		const probe = `
import socket, sys
def ask(path, req):
    try:
        s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(path)
        s.sendall(req); return s.recv(64).split(b"\r\n")[0].decode()
    except OSError as e:
        return "refused: %s" % e.strerror
rpc = b"POST /process.Process/Start HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
print("agent:", ask("/run/cubicle/agent.sock", rpc))
print("typing socket, other path:", ask("/run/cubicle-input/type.sock", b"GET /process.Process/Start HTTP/1.1\r\nHost: a\r\n\r\n"))
`
		for _, user := range []string{"user", "root"} {
			n["agent socket without a token"]++
			res, err := e.c.Exec(context.Background(), e.sb.ID, client.ExecRequest{Argv: []string{"python3", "-c", probe}, User: user})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("probe as %s: %+v %v", user, res, err)
			}
			for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
				name, status, _ := strings.Cut(line, ": ")
				ok := strings.HasPrefix(status, "refused") || strings.Contains(status, " 401 ") || strings.Contains(status, " 403 ") ||
					(strings.HasPrefix(name, "typing") && (strings.Contains(status, " 404 ") || strings.Contains(status, " 405 ")))
				if !ok {
					t.Errorf("as %s, %s answered %q", user, name, status)
				}
			}
		}
		n["another sandbox's files"]++
		// (ls cannot stat /run/cubicle under this runsc: EINVAL; python can list it.)
		res, err := e.c.Exec(context.Background(), e.sb.ID, client.ExecRequest{Command: `python3 -c 'import os; print(*os.listdir("/run/cubicle"))'; ` +
			"find /run /tmp /var /opt /home /root /etc -xdev -name '*" + e.other + "*' 2>/dev/null; grep -rl " + e.other + " /run /etc 2>/dev/null; true"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(res.Stdout, e.other) {
			t.Errorf("a sandbox sees a sandbox's name:\n%s", res.Stdout)
		}
		if got := strings.Fields(res.Stdout); !slices.Equal(got, []string{"agent.sock"}) {
			t.Errorf("/run/cubicle in the sandbox holds %v, want only its own agent.sock", got)
		}
	})

	t.Run("malformed and oversized bodies", func(t *testing.T) {
		huge := `{"env":{"A":"` + strings.Repeat("x", 12<<20) + `"}}`
		deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
		bodies := map[string]string{
			"not JSON": "{nope", "array": "[1,2]", "null": "null", "number": "7",
			"unknown fields": `{"zzz":1,"yyy":{"a":[]}}`, "wrong types": `{"timeout_seconds":"x","command":7,"actions":{}}`,
			"12 MiB": huge, "100000 nested arrays": deep, "invalid UTF-8": "{\"command\":\"\xff\xfe\"}",
		}
		for _, rt := range native {
			method, path := concrete(rt.Pattern, e.sb.ID)
			if method != "POST" && method != "PUT" {
				continue
			}
			for name, b := range bodies {
				if method == "PUT" && name != "12 MiB" {
					continue // a file upload takes any bytes
				}
				n["malformed or oversized body"]++
				a := e.do(method, path, b, "X-API-Key", e.key)
				if a.code >= 500 {
					t.Errorf("%s with a %s body: %d %.200s, want a 4xx", rt.Pattern, name, a.code, a.body)
				}
				if a.code < 400 && name != "12 MiB" {
					t.Errorf("%s with a %s body: %d, want a 4xx", rt.Pattern, name, a.code)
				}
			}
		}
		e2bMalformed(t, e, e2bRoutes, n)
	})

	t.Run("per-key quota", func(t *testing.T) {
		n["create beyond the key's quota"] += 2
		if a := e.do("POST", "/v1/sandboxes", "{}", "X-API-Key", e.key); a.code != http.StatusTooManyRequests || !isNativeError(a.body, "capacity_exhausted") {
			t.Errorf("a third sandbox for the key: %d %.200s, want 429 capacity_exhausted", a.code, a.body)
		}
		if a := e.do("POST", "/v2/sandboxes", `{"templateID":"desktop"}`, "X-API-Key", e.key); a.code != http.StatusTooManyRequests {
			t.Errorf("a third sandbox for the key through E2B's API: %d %.200s, want 429", a.code, a.body)
		}
	})

	t.Run("volumes", func(t *testing.T) {
		// Names that try to leave the key's volume directory, and mount
		// paths that would cover what the sandbox or the host needs: each
		// refused with its error, and nothing made (the inventory below).
		for _, name := range []string{"..", "../x", "%2e%2e", "a/b", "A", ".hidden", "x%00y", strings.Repeat("v", 64)} {
			n["volume with a bad name"]++
			if a := e.do("POST", "/v1/volumes", `{"name":"`+name+`","size_mb":64}`, "X-API-Key", e.key); a.code != http.StatusBadRequest || !isNativeError(a.body, "invalid_argument") {
				t.Errorf("create volume %q: %d %.200s, want 400 invalid_argument", name, a.code, a.body)
			}
			for _, m := range []string{"GET", "DELETE"} {
				// 307: the router's redirect of a path with dot segments
				// to its clean form, which names no volume.
				if a := e.do(m, "/v1/volumes/"+name, "", "X-API-Key", e.key); a.code != http.StatusNotFound && a.code != http.StatusTemporaryRedirect {
					t.Errorf("%s volume %q: %d %.200s, want 404 (or the router's 307 to the clean path)", m, name, a.code, a.body)
				}
			}
		}
		for _, path := range []string{"/", "/proc", "/proc/1", "/sys", "/dev", "/etc", "/run/cubicle", "/tmp/x", "/home/../etc", "relative", "/usr/lib"} {
			n["sandbox with a volume at a forbidden path"]++
			body := `{"volumes":[{"name":"v","path":"` + path + `"}]}`
			time.Sleep(250 * time.Millisecond) // under the daemon's create rate, which is checked first
			if a := e.do("POST", "/v1/sandboxes", body, "X-API-Key", e.key); a.code != http.StatusBadRequest || !isNativeError(a.body, "invalid_argument") {
				t.Errorf("volume at %q: %d %.200s, want 400 invalid_argument", path, a.code, a.body)
			}
		}
		n["sandbox with a volume that does not exist"]++
		time.Sleep(250 * time.Millisecond)
		if a := e.do("POST", "/v1/sandboxes", `{"volumes":[{"name":"nope","path":"/data"}]}`, "X-API-Key", e.key); a.code != http.StatusNotFound && a.code != http.StatusTooManyRequests {
			t.Errorf("a missing volume: %d %.200s, want 404 (or the key's quota first)", a.code, a.body)
		}
	})

	t.Run("key comparison timing", func(t *testing.T) { n["wrong key, timed"] += keyTiming(t, e) })

	// Nothing was created, destroyed or left behind by all that; the
	// daemon still answers; both sandboxes still work.
	after := e.inventory()
	if !slices.Equal(before, after) {
		t.Errorf("sandboxes before the attacks %v, after %v", before, after)
	}
	if a := e.do("GET", "/healthz", ""); a.code != http.StatusOK {
		t.Errorf("healthz after the attacks: %d", a.code)
	}
	if res, err := e.c.Exec(context.Background(), e.sb.ID, client.ExecRequest{Command: "echo alive"}); err != nil || res.Stdout != "alive\n" {
		t.Errorf("exec after the attacks: %+v %v", res, err)
	}

	// No key or token in any daemon's log, whole or as a long prefix.
	for _, path := range e.logs {
		log, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range e.secret {
			for _, part := range []string{s, s[:min(len(s), 16)]} {
				n["secret in the log"]++
				if bytes.Contains(log, []byte(part)) {
					t.Errorf("the daemon's log %s contains a secret (%d bytes of one)", path, len(part))
				}
			}
		}
	}
	t.Logf("routes tested: %d native + %d E2B; %s", len(native), len(e2bRoutes), n)
}

// inventory lists the daemon's sandboxes as "id state".
func (e *env) inventory() []string {
	e.t.Helper()
	sbs, err := e.c.List(context.Background(), client.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID+" "+sb.State)
	}
	vols, err := e.c.ListVolumes(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, v := range vols {
		out = append(out, "volume "+v.Name+" "+v.AttachedTo)
	}
	sort.Strings(out)
	return out
}

func isNativeError(body []byte, code string) bool {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &e) == nil && e.Error.Code == code && e.Error.Message != ""
}

// keyTiming measures how long the daemon takes to refuse a
// wrong key that shares nothing with the real one and one that shares all
// but its last character. Keys are compared as SHA-256 digests in constant
// time, so the two should not differ beyond noise; the figures are logged
// (timings are not asserted: machines are noisy) and a gross difference
// (3×) fails.
func keyTiming(t *testing.T, e *env) (n int) {
	measure := func(key string) time.Duration {
		var ds []time.Duration
		for range 400 {
			t0 := time.Now()
			a := e.do("GET", "/v1/sandboxes", "", "X-API-Key", key)
			ds = append(ds, time.Since(t0))
			if a.code != http.StatusUnauthorized {
				t.Fatalf("wrong key: %d", a.code)
			}
			n++
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	far := "x" + strings.Repeat("z", len(e.key)-1)
	near := e.key[:len(e.key)-1] + "0"
	// Interleave to spread drift over both.
	var farM, nearM []time.Duration
	for range 5 {
		farM = append(farM, measure(far))
		nearM = append(nearM, measure(near))
	}
	slices.Sort(farM)
	slices.Sort(nearM)
	f, nr := farM[2], nearM[2]
	t.Logf("median time to refuse a wrong key: sharing no prefix %v, sharing all but the last byte %v (ratio %.3f)", f, nr, float64(nr)/float64(f))
	if nr > 3*f || f > 3*nr {
		t.Errorf("refusing keys takes %v vs %v depending on the shared prefix", f, nr)
	}
	return n
}
