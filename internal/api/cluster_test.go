package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/cluster"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// fakeCluster is node "a" of a cluster whose node "b" is an httptest
// server: it holds sandbox sbremote, and sblost is of a node that left.
type fakeCluster struct {
	b        string // node b's URL
	degraded string
	draining bool
	puts     []cluster.Entry
	mu       sync.Mutex
}

func (f *fakeCluster) Name() string { return "a" }
func (f *fakeCluster) Locate(_ context.Context, id string, _ bool) (cluster.Location, bool, error) {
	switch id {
	case "sbremote":
		return cluster.Location{Entry: cluster.Entry{ID: id, Node: "b", State: "running"}, Alive: true, URL: f.b}, true, nil
	case "sblost":
		return cluster.Location{Entry: cluster.Entry{ID: id, Node: "gone", State: "running",
			Sandbox: json.RawMessage(`{"id":"sblost","state":"running","metadata":{"k":"v"}}`)}}, true, nil
	}
	return cluster.Location{}, false, nil
}
func (f *fakeCluster) Place(string) ([]cluster.Node, error) {
	return []cluster.Node{{Name: "b", URL: f.b}}, nil
}
func (f *fakeCluster) Nodes() []cluster.Node {
	return []cluster.Node{{Name: "a"}, {Name: "b", URL: f.b}}
}
func (f *fakeCluster) Node(name string) (cluster.Node, bool) {
	if name == "a" || name == "b" {
		return cluster.Node{Name: name}, true
	}
	return cluster.Node{}, false
}
func (f *fakeCluster) Degraded() string { return f.degraded }
func (f *fakeCluster) Draining() bool   { return f.draining }
func (f *fakeCluster) Put(_ context.Context, e cluster.Entry) error {
	f.mu.Lock()
	f.puts = append(f.puts, e)
	f.mu.Unlock()
	return nil
}
func (f *fakeCluster) Remove(context.Context, string) error { return nil }
func (f *fakeCluster) Sync(context.Context) error           { return nil }
func (f *fakeCluster) Entries(keep func(cluster.Entry) bool) []cluster.Entry {
	var out []cluster.Entry
	for _, id := range []string{"sbremote", "sblost"} {
		l, _, _ := f.Locate(context.Background(), id, true)
		if keep == nil || keep(l.Entry) {
			out = append(out, l.Entry)
		}
	}
	return out
}
func (f *fakeCluster) LeaseTTL() time.Duration { return 10 * time.Second }

// nodeB records what reaches node b.
type nodeB struct {
	mu   sync.Mutex
	reqs []*http.Request
	body []string
}

func (n *nodeB) handler(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	n.mu.Lock()
	n.reqs = append(n.reqs, r)
	n.body = append(n.body, string(b))
	n.mu.Unlock()
	if r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes" {
		w.Header().Set("Location", "/v1/sandboxes/sbnew")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"sbnew","state":"running","node":"b"}`)
		return
	}
	io.WriteString(w, "from b: "+r.URL.Path)
}

func (n *nodeB) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.reqs)
}

func TestClusterProxy(t *testing.T) {
	b := &nodeB{}
	bsrv := httptest.NewServer(http.HandlerFunc(b.handler))
	defer bsrv.Close()
	fc := &fakeCluster{b: bsrv.URL}
	e := newTestEnv(t, Config{Cluster: fc})

	// Another node's sandbox is served by it, with the client's own key
	// and the header that stops it from passing the request on again.
	w := e.do("GET", "/v1/sandboxes/sbremote/screenshot?format=png", nil)
	if w.Code != 200 || w.Body.String() != "from b: /v1/sandboxes/sbremote/screenshot" {
		t.Fatalf("proxied screenshot: %d %q", w.Code, w.Body.String())
	}
	got := b.reqs[0]
	if got.Header.Get("X-API-Key") != testKey || got.Header.Get(forwardedHeader) != "a" || got.URL.RawQuery != "format=png" {
		t.Fatalf("node b got key %q, forwarded-by %q, query %q", got.Header.Get("X-API-Key"), got.Header.Get(forwardedHeader), got.URL.RawQuery)
	}

	// The header grants nothing: without a key the request is refused
	// here, and never reaches b.
	for _, h := range [][]string{
		{"X-API-Key", ""},
		{"X-API-Key", "", forwardedHeader, "b"},
		{"X-API-Key", "nope", forwardedHeader, "a"},
	} {
		w := e.do("GET", "/v1/sandboxes/sbremote/screenshot", nil, h...)
		if w.Code != http.StatusUnauthorized {
			t.Errorf("%v: %d, want 401", h, w.Code)
		}
	}
	// A client's own forwarded header only keeps the request here.
	w = e.do("GET", "/v1/sandboxes/sbremote/screenshot", nil, forwardedHeader, "b")
	if w.Code != http.StatusNotFound {
		t.Errorf("forged forwarded header: %d, want this node's 404", w.Code)
	}
	if n := b.count(); n != 1 {
		t.Fatalf("node b got %d requests, want only the first", n)
	}

	// A sandbox of a node that left is lost, with the reason.
	w = e.do("GET", "/v1/sandboxes/sblost", nil)
	var sb struct{ ID, State, Node, Error string }
	json.Unmarshal(w.Body.Bytes(), &sb)
	if w.Code != 200 || sb.State != "lost" || sb.Node != "gone" || !strings.Contains(sb.Error, "node gone") {
		t.Errorf("lost sandbox: %d %s", w.Code, w.Body.String())
	}
	w = e.do("POST", "/v1/sandboxes/sblost/exec", strings.NewReader(`{"command":"true"}`))
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "lost") {
		t.Errorf("exec in a lost sandbox: %d %s", w.Code, w.Body.String())
	}
	// Without a key (a view-token route) nothing says it exists.
	w = e.do("GET", "/v1/sandboxes/sblost/vnc", nil, "X-API-Key", "")
	if w.Code == http.StatusConflict || strings.Contains(w.Body.String(), "gone") {
		t.Errorf("live view of a lost sandbox without a key: %d %s", w.Code, w.Body.String())
	}
	w = e.do("GET", "/v1/sandboxes?state=lost", nil)
	if !strings.Contains(w.Body.String(), `"sblost"`) || strings.Contains(w.Body.String(), runningID) {
		t.Errorf("list of lost sandboxes: %s", w.Body.String())
	}

	// A create is placed on b and answered by it.
	w = e.do("POST", "/v1/sandboxes", strings.NewReader(`{"backend":"gvisor"}`))
	if w.Code != http.StatusCreated || w.Header().Get("Location") != "/v1/sandboxes/sbnew" || !strings.Contains(w.Body.String(), `"node":"b"`) {
		t.Fatalf("placed create: %d %v %s", w.Code, w.Header(), w.Body.String())
	}
	if last := b.body[len(b.body)-1]; last != `{"backend":"gvisor"}` {
		t.Errorf("node b got the create body %q", last)
	}

	// A draining node refuses a create passed to it, even when the
	// client sent the forwarded header itself.
	fc.draining = true
	w = e.do("POST", "/v1/sandboxes", strings.NewReader(`{}`), forwardedHeader, "b")
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "draining") {
		t.Errorf("create forwarded to a draining node: %d %s", w.Code, w.Body.String())
	}
	fc.draining = false

	// Degraded: still 200, saying so.
	fc.degraded = "no quorum"
	w = e.do("GET", "/healthz", nil)
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"degraded"`) || !strings.Contains(w.Body.String(), "no quorum") {
		t.Errorf("degraded health: %d %s", w.Code, w.Body.String())
	}
}

// TestClusterMountRefuse checks that what the cluster refuses for a
// mount (a lost sandbox) is answered in the mount's own shape.
func TestClusterMountRefuse(t *testing.T) {
	fc := &fakeCluster{b: "http://127.0.0.1:1"}
	e := newTestEnv(t, Config{Cluster: fc, Mounts: []Mount{{
		Name:    "m",
		Claims:  func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/m/") },
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the mount itself") }),
		Sandbox: func(r *http.Request) string { return strings.TrimPrefix(r.URL.Path, "/m/") },
		Refuse: func(w http.ResponseWriter, r *http.Request, err error) {
			status := 500
			if errors.Is(err, errdefs.ErrConflict) {
				status = http.StatusConflict
			}
			w.WriteHeader(status)
			io.WriteString(w, "mount-shaped: "+err.Error())
		},
	}}})
	w := e.do("GET", "/m/sblost", nil)
	if w.Code != http.StatusConflict || !strings.HasPrefix(w.Body.String(), "mount-shaped: ") || !strings.Contains(w.Body.String(), "node gone") {
		t.Errorf("a mount's request about a lost sandbox: %d %s", w.Code, w.Body.String())
	}
	// Node b does not answer: a volume that is not here may be there,
	// which is not a 404; nor is a create that names it made here.
	w = e.do("GET", "/v1/volumes/elsewhere", nil)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "node(s) b did not answer") {
		t.Errorf("a volume while node b does not answer: %d %s", w.Code, w.Body.String())
	}
	w = e.do("POST", "/v1/sandboxes", strings.NewReader(`{"volumes":[{"name":"elsewhere","path":"/mnt/v"}]}`))
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("a create naming a volume while node b does not answer: %d %s", w.Code, w.Body.String())
	}
}

// TestClusterItems checks that a volume, snapshot or recording this node
// does not hold is looked for on the others and the request passed to the
// one that has it, with the client's key, and that one it holds is its own.
func TestClusterItems(t *testing.T) {
	b := &nodeB{}
	bsrv := httptest.NewServer(http.HandlerFunc(b.handler))
	defer bsrv.Close()
	e := newTestEnv(t, Config{Cluster: &fakeCluster{b: bsrv.URL}})
	for _, path := range []string{"/v1/volumes/elsewhere", "/v1/snapshots/elsewhere", "/v1/recordings/" + strings.Repeat("r", 26)} {
		before := b.count()
		w := e.do("GET", path, nil)
		if w.Code != 200 || w.Body.String() != "from b: "+path {
			t.Errorf("GET %s held by b: %d %q", path, w.Code, w.Body.String())
		}
		// Asked once, then passed there.
		if n := b.count() - before; n != 2 {
			t.Errorf("GET %s: b got %d requests, want 2", path, n)
		}
		b.mu.Lock()
		last := b.reqs[len(b.reqs)-1]
		b.mu.Unlock()
		if last.Header.Get("X-API-Key") != testKey || last.Header.Get(forwardedHeader) != "a" {
			t.Errorf("GET %s reached b with key %q, forwarded by %q", path, last.Header.Get("X-API-Key"), last.Header.Get(forwardedHeader))
		}
	}
	// A create that names b's snapshot, or b's volume, is made on b.
	for _, body := range []string{`{"from_snapshot":"elsewhere"}`, `{"volumes":[{"name":"elsewhere","path":"/mnt/v"}]}`} {
		w := e.do("POST", "/v1/sandboxes", strings.NewReader(body))
		b.mu.Lock()
		last, lastBody := b.reqs[len(b.reqs)-1], b.body[len(b.body)-1]
		b.mu.Unlock()
		if w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), `"node":"b"`) ||
			last.Method != http.MethodPost || last.URL.Path != "/v1/sandboxes" || lastBody != body {
			t.Errorf("create %s: %d %s; b last got %s %s %q", body, w.Code, w.Body.String(), last.Method, last.URL.Path, lastBody)
		}
	}
	// A sandbox of this node says so in every answer that shows it.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/" + runningID, ""},
		{"POST", "/v1/sandboxes/" + runningID + "/timeout", `{"timeout_seconds":600}`},
	} {
		w := e.do(c.method, c.path, strings.NewReader(c.body))
		if w.Code != 200 || !strings.Contains(w.Body.String(), `"node":"a"`) {
			t.Errorf("%s %s: %d %s; want node a", c.method, c.path, w.Code, w.Body.String())
		}
	}
	// Without a key, nothing is asked of the others.
	before := b.count()
	if w := e.do("GET", "/v1/volumes/elsewhere", nil, "X-API-Key", ""); w.Code != http.StatusUnauthorized || b.count() != before {
		t.Errorf("GET a volume without a key: %d, b asked %d times", w.Code, b.count()-before)
	}
}

// TestClusterProxyEarlyHeaders has the other node start its answer
// before it reads the body, as a Connect stream may, while the client's
// body is still arriving: the whole body must reach the node and the
// answer must finish.
func TestClusterProxyEarlyHeaders(t *testing.T) {
	bsrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Node b's own server must allow it too, or it is b that cuts.
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "start; ") // a stream's first event
		rc.Flush()
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("node b read the body: %v", err)
		}
		fmt.Fprintf(w, "echo: %s", b)
	}))
	defer bsrv.Close()
	e := newTestEnv(t, Config{Cluster: &fakeCluster{b: bsrv.URL}})
	asrv := httptest.NewServer(e.h)
	defer asrv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, "POST", asrv.URL+"/v1/sandboxes/sbremote/exec", pr)
	req.Header.Set("X-API-Key", testKey)
	req.ContentLength = int64(len("first,second"))
	go func() {
		io.WriteString(pw, "first,")
		time.Sleep(300 * time.Millisecond)
		io.WriteString(pw, "second")
		pw.Close()
	}()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("through node a: %v", err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != "start; echo: first,second" {
		t.Fatalf("answer %q (%v), want the whole body echoed", got, err)
	}
}

// TestClusterProxyEarlyAnswer sends a large body that the other node
// refuses before reading it all, then another request on the same
// connection: the rest of the first body must not be read as the second
// request.
func TestClusterProxyEarlyAnswer(t *testing.T) {
	bsrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			io.CopyN(io.Discard, r.Body, 1<<20)
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			return
		}
		io.WriteString(w, "from b")
	}))
	defer bsrv.Close()
	e := newTestEnv(t, Config{Cluster: &fakeCluster{b: bsrv.URL}})
	asrv := httptest.NewServer(e.h)
	defer asrv.Close()
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	for i := range 3 {
		req, _ := http.NewRequest("POST", asrv.URL+"/v1/sandboxes/sbremote/exec", strings.NewReader(strings.Repeat("x", 12<<20)))
		req.Header.Set("X-API-Key", testKey)
		resp, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Errorf("%d: 12 MiB: %d, want b's 413", i, resp.StatusCode)
			}
			// The rest of the body is on the connection: it must end.
			if !resp.Close {
				t.Errorf("%d: the answer to a body b did not read keeps the connection open", i)
			}
		}
		req, _ = http.NewRequest("GET", asrv.URL+"/v1/sandboxes/sbremote/screenshot", nil)
		req.Header.Set("X-API-Key", testKey)
		resp, err = client.Do(req)
		if err != nil {
			t.Fatalf("%d: the next request: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "from b" {
			t.Fatalf("%d: the next request: %d %q", i, resp.StatusCode, b)
		}
	}
}
