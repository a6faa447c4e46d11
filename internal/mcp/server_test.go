package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cubicle-dev/cubicle/internal/computer"
)

// connect serves the tools on b and returns a go-sdk client session
// connected to them in memory.
func connect(t *testing.T, b Backend, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	srv := NewServer(func(*mcp.RequestExtra) Backend { return b }, Options{Version: "test"})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Wait() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestComputerToolsCoverAnthropic(t *testing.T) {
	for _, name := range computer.AnthropicActions() {
		if _, ok := computerActions[name]; !ok {
			t.Errorf("no tool for Anthropic's action %s", name)
		}
	}
	if len(computerActions) != len(computer.AnthropicActions()) {
		t.Errorf("%d action tools, %d actions", len(computerActions), len(computer.AnthropicActions()))
	}
}

// TestComputerSchemasMatchParser builds, for every action tool, an input
// with every parameter its schema offers and the required ones alone, and
// checks that internal/computer's parser takes both: a parameter the
// schema offers is one the endpoint accepts.
func TestComputerSchemasMatchParser(t *testing.T) {
	sample := map[string]any{
		"coordinate": []int{10, 10}, "start_coordinate": []int{1, 1}, "text": "ctrl", "repeat": 2,
		"scroll_direction": "down", "scroll_amount": 3, "duration": 1.5, "region": []int{0, 0, 10, 10},
	}
	for name, a := range computerActions {
		for _, set := range [][]string{keys(a.params), a.required} {
			in := map[string]any{"action": name}
			for _, p := range set {
				in[p] = sample[p]
			}
			body, _ := json.Marshal(map[string]any{"tool": map[string]any{"type": computer.AnthropicToolset}, "input": in})
			if _, err := computer.ParseAnthropic(body); err != nil {
				t.Errorf("%s with %v: %v", name, set, err)
			}
		}
	}
}

func keys(m map[string]map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestListTools(t *testing.T) {
	cs := connect(t, newFake(), nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		schema, _ := json.Marshal(tool.InputSchema)
		if tool.Name != "list_sandboxes" && tool.Name != "create_sandbox" && !bytes.Contains(schema, []byte(`"sandbox_id"`)) {
			t.Errorf("%s: schema %s has no sandbox_id", tool.Name, schema)
		}
	}
	want := append([]string{"create_sandbox", "list_sandboxes", "destroy_sandbox", "extend_sandbox", "view_sandbox",
		"run_command", "read_file", "write_file", "clipboard_get", "clipboard_set"}, computer.AnthropicActions()...)
	slices.Sort(names)
	slices.Sort(want)
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
}

func TestTools(t *testing.T) {
	f := newFake()
	cs := connect(t, f, nil)

	res := call(t, cs, "create_sandbox", map[string]any{"template": "desktop"})
	if res.IsError || !strings.Contains(text(res), `"sandbox_id": "sb1"`) {
		t.Fatalf("create_sandbox: %v %q", res.IsError, text(res))
	}
	if sc, _ := json.Marshal(res.StructuredContent); !bytes.Contains(sc, []byte(`"sandbox_id":"sb1"`)) {
		t.Errorf("create_sandbox structured: %s", sc)
	}

	// A screenshot is MCP image content: PNG bytes of the picture's size.
	res = call(t, cs, "screenshot", map[string]any{"sandbox_id": "sb1"})
	if res.IsError || len(res.Content) != 1 {
		t.Fatalf("screenshot: %+v", res)
	}
	im, ok := res.Content[0].(*mcp.ImageContent)
	if !ok || im.MIMEType != "image/png" {
		t.Fatalf("screenshot content: %#v", res.Content[0])
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(im.Data))
	if err != nil || cfg.Width != 1024 || cfg.Height != 576 {
		t.Errorf("screenshot PNG: %dx%d, %v; want 1024x576", cfg.Width, cfg.Height, err)
	}

	// The display size and the action's parameters reach the endpoint
	// as Anthropic's tool and input.
	res = call(t, cs, "left_click", map[string]any{"sandbox_id": "sb1", "coordinate": []int{5, 6}, "text": "shift",
		"display_width_px": 800, "display_height_px": 450})
	if res.IsError {
		t.Fatalf("left_click: %q", text(res))
	}
	f.mu.Lock()
	got := f.bodies[len(f.bodies)-1]
	f.mu.Unlock()
	want := map[string]any{
		"tool":  map[string]any{"type": computer.AnthropicToolset, "display_width_px": 800.0, "display_height_px": 450.0},
		"input": map[string]any{"action": "left_click", "coordinate": []any{5.0, 6.0}, "text": "shift"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("left_click request (-want +got):\n%s", diff)
	}

	if res = call(t, cs, "cursor_position", map[string]any{"sandbox_id": "sb1"}); text(res) != "X=10,Y=20" {
		t.Errorf("cursor_position: %q", text(res))
	}

	res = call(t, cs, "run_command", map[string]any{"sandbox_id": "sb1", "command": "echo hi", "stdin": "x"})
	if res.IsError || !strings.Contains(text(res), "exit code 3") || !strings.Contains(text(res), "out:x") {
		t.Errorf("run_command: %v %q", res.IsError, text(res))
	}

	res = call(t, cs, "write_file", map[string]any{"sandbox_id": "sb1", "path": "/tmp/a.txt", "content": "héllo"})
	if res.IsError || !strings.Contains(text(res), "wrote 6 bytes") {
		t.Errorf("write_file: %v %q", res.IsError, text(res))
	}
	if res = call(t, cs, "read_file", map[string]any{"sandbox_id": "sb1", "path": "/tmp/a.txt"}); text(res) != "héllo" {
		t.Errorf("read_file: %q", text(res))
	}
	call(t, cs, "write_file", map[string]any{"sandbox_id": "sb1", "path": "/tmp/b", "content": "AP8=", "encoding": "base64"})
	if res = call(t, cs, "read_file", map[string]any{"sandbox_id": "sb1", "path": "/tmp/b"}); !strings.Contains(text(res), "binary (2 bytes); base64:\nAP8=") {
		t.Errorf("read_file binary: %q", text(res))
	}

	// The clipboard: "" when empty, then what was set, exactly.
	res = call(t, cs, "clipboard_get", map[string]any{"sandbox_id": "sb1"})
	if sc, _ := json.Marshal(res.StructuredContent); res.IsError || string(sc) != `{"text":""}` {
		t.Errorf("clipboard_get of an empty clipboard: %v %s", res.IsError, sc)
	}
	if res = call(t, cs, "clipboard_set", map[string]any{"sandbox_id": "sb1", "text": "héllo ✓\n"}); res.IsError || !strings.Contains(text(res), "8 characters") {
		t.Errorf("clipboard_set: %v %q", res.IsError, text(res))
	}
	res = call(t, cs, "clipboard_get", map[string]any{"sandbox_id": "sb1"})
	if got, _ := res.StructuredContent.(map[string]any); res.IsError || got["text"] != "héllo ✓\n" {
		t.Errorf("clipboard_get: %v %#v", res.IsError, res.StructuredContent)
	}
	if !strings.Contains(text(res), `"text": "héllo ✓\n"`) {
		t.Errorf("clipboard_get text content: %q", text(res))
	}

	if res = call(t, cs, "view_sandbox", map[string]any{"sandbox_id": "sb1"}); !strings.Contains(text(res), "http://daemon/view/sb1") {
		t.Errorf("view_sandbox: %q", text(res))
	}
	if res = call(t, cs, "extend_sandbox", map[string]any{"sandbox_id": "sb1", "timeout_seconds": 600}); res.IsError {
		t.Errorf("extend_sandbox: %q", text(res))
	}
	if res = call(t, cs, "list_sandboxes", map[string]any{}); !strings.Contains(text(res), "sb1") {
		t.Errorf("list_sandboxes: %q", text(res))
	}
	if res = call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": "sb1"}); res.IsError {
		t.Errorf("destroy_sandbox: %q", text(res))
	}
	// The daemon's refusal is the model's to read.
	if res = call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": "nope"}); !res.IsError || !strings.Contains(text(res), "not found") {
		t.Errorf("destroy_sandbox nope: %v %q", res.IsError, text(res))
	}
}

// TestBadInput: every bad call is an isError result, and the ones the
// server can judge never reach the daemon.
func TestBadInput(t *testing.T) {
	f := newFake()
	cs := connect(t, f, nil)
	for _, c := range []struct {
		tool      string
		args      map[string]any
		want      string
		reachesIt bool // the daemon's endpoint judges it (nothing runs there either)
	}{
		{"left_click", map[string]any{"sandbox_id": "sb1", "coordinate": []int{5000, 10}}, "outside the screen", true},
		{"left_click", map[string]any{"coordinate": []int{5, 10}}, "sandbox_id", false},
		{"left_click", map[string]any{"sandbox_id": "sb1", "region": []int{0, 0, 1, 1}}, "does not take region", false},
		{"screenshot", map[string]any{"sandbox_id": "sb1", "action": "left_click"}, "leave action out", false},
		{"screenshot", map[string]any{"sandbox_id": "sb1", "display_width_px": "big"}, "integer", false},
		{"run_command", map[string]any{"sandbox_id": "sb1"}, "command", false},
		{"run_command", map[string]any{"sandbox_id": "sb1", "command": "ls", "colour": "red"}, "colour", false},
		{"run_command", map[string]any{"sandbox_id": "sb1", "command": "  "}, "empty", false},
		{"write_file", map[string]any{"sandbox_id": "sb1", "path": "/x", "content": "!!", "encoding": "base64"}, "base64", false},
		{"write_file", map[string]any{"sandbox_id": "sb1", "path": "/x", "content": "a", "encoding": "utf-16"}, "encoding", false},
		{"create_sandbox", map[string]any{"width": 100}, "together", false},
		{"extend_sandbox", map[string]any{"sandbox_id": "sb1", "timeout_seconds": -1}, "0 or more", false},
		{"clipboard_set", map[string]any{"sandbox_id": "sb1", "text": ""}, "text is empty", false},
		{"clipboard_set", map[string]any{"sandbox_id": "sb1"}, "text", false},
		{"clipboard_set", map[string]any{"text": "x"}, "sandbox_id", false},
		{"clipboard_set", map[string]any{"sandbox_id": "sb1", "text": strings.Repeat("x", 64<<10+1)}, "at most 65536", true},
		{"clipboard_get", map[string]any{"sandbox_id": "sb1", "text": "x"}, "text", false},
	} {
		before := len(f.Calls())
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Errorf("%s %v: protocol error %v, want an isError result", c.tool, c.args, err)
			continue
		}
		if !res.IsError || !strings.Contains(text(res), c.want) {
			t.Errorf("%s %v: isError %v %q, want an error saying %q", c.tool, c.args, res.IsError, text(res), c.want)
		}
		if reached := len(f.Calls()) > before; reached != c.reachesIt {
			t.Errorf("%s %v: reached the daemon: %v", c.tool, c.args, reached)
		}
	}
}

// TestParallelCalls: two calls of one connection run at the same time,
// not one after the other. Each waits in the daemon until both have
// reached it, so they pass only together; run one after the other, the
// first waits alone until its bound (a deadlock guard, not a timing
// threshold: together they meet at once).
func TestParallelCalls(t *testing.T) {
	const calls = 2
	var arrived sync.WaitGroup
	arrived.Add(calls)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	var alone atomic.Int32
	f := newFake()
	f.onCall = func() {
		arrived.Done()
		select {
		case <-all:
		case <-time.After(10 * time.Second):
			alone.Add(1)
		}
	}
	cs := connect(t, f, nil)
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() { call(t, cs, "list_sandboxes", map[string]any{}) })
	}
	wg.Wait()
	if n := alone.Load(); n != 0 {
		t.Errorf("%d of %d calls waited 10 s in the daemon for the other to arrive: they ran one after the other", n, calls)
	}
}

func TestProgress(t *testing.T) {
	f := newFake()
	f.delay = 2500 * time.Millisecond
	var mu sync.Mutex
	var got []string
	cs := connect(t, f, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		got = append(got, req.Params.Message)
		mu.Unlock()
	}})
	p := &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"sandbox_id": "sb1", "command": "sleep 2"}}
	p.SetProgressToken("tok")
	if _, err := cs.CallTool(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 2 || !strings.HasPrefix(got[0], "run_command: ") {
		t.Errorf("progress: %q, want one a second", got)
	}
}

// TestHTTP drives the Streamable HTTP handler with the go-sdk's client,
// speaking the current revision and the older ones: the calls reach a
// stand-in of the REST API with the caller's key and Host.
func TestHTTP(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	rest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" key="+r.Header.Get("X-API-Key")+" host="+r.Host)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"sandboxes":[{"id":"sbx","state":"running"}]}`))
	}))
	defer rest.Close()
	h := NewHTTPHandler(HTTPConfig{DaemonURL: rest.URL, KeysRequired: true, Version: "test"})
	srv := httptest.NewServer(h)
	defer srv.Close()

	for _, version := range []string{"", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"} {
		t.Run("version="+version, func(t *testing.T) {
			hc := &http.Client{Transport: keyTransport{"Bearer sekret"}}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
				&mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: version})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			want := version
			if want == "" {
				want = "2026-07-28"
			}
			if got := cs.InitializeResult().ProtocolVersion; got != want {
				t.Errorf("negotiated %q, want %q", got, want)
			}
			res := call(t, cs, "list_sandboxes", map[string]any{})
			if !strings.Contains(text(res), "sbx") {
				t.Errorf("list_sandboxes: %q", text(res))
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	wantHost := strings.TrimPrefix(srv.URL, "http://")
	if len(seen) == 0 || seen[0] != "GET /v1/sandboxes key=sekret host="+wantHost {
		t.Errorf("REST calls: %q", seen)
	}

	// A browser page of another origin is refused; one of the daemon's own
	// origin, and a client that is no browser, are not.
	for _, c := range []struct {
		origin string
		want   int
	}{{"http://evil.example", 403}, {srv.URL, 200}, {"", 200}} {
		req, _ := http.NewRequest("POST", srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-06-18")
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("Origin %q: %d, want %d", c.origin, resp.StatusCode, c.want)
		}
	}
}

type keyTransport struct{ auth string }

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", k.auth)
	return http.DefaultTransport.RoundTrip(r)
}
