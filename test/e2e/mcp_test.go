package e2e

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/computer"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestMCP drives cubicle's MCP server on a real cubicled (gvisor, or the
// backend CUBICLE_E2E_BACKEND names) with the two official clients: the
// go-sdk's, over Streamable HTTP (/mcp) and over stdio (the built `cubicle
// mcp`), and the TypeScript SDK's (test/mcp-js, node --test), over both.
// It makes two sandboxes: one for the Go clients, one for the TypeScript
// suite.
func TestMCP(t *testing.T) {
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			d, c := startDaemon(t, backend)
			t.Run("go-sdk", func(t *testing.T) { testMCPGo(t, d, c) })
			t.Run("typescript", func(t *testing.T) { testMCPTypeScript(t, d) })
		})
	}
}

// mcpCall calls a tool and fails the test on a protocol error or an
// isError result.
func mcpCall(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s: isError: %s", name, mcpText(res))
	}
	return res
}

func mcpText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mcpPicture decodes the PNG of an image result and returns its size.
func mcpPicture(t *testing.T, res *mcp.CallToolResult) (int, int) {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("%d content blocks, want one image", len(res.Content))
	}
	im, ok := res.Content[0].(*mcp.ImageContent)
	if !ok || im.MIMEType != "image/png" {
		t.Fatalf("content %#v, want a PNG image", res.Content[0])
	}
	img, err := png.Decode(bytes.NewReader(im.Data))
	if err != nil {
		t.Fatalf("decode the screenshot: %v", err)
	}
	return img.Bounds().Dx(), img.Bounds().Dy()
}

type headerTransport struct {
	header http.Header
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.header {
		r.Header[k] = v
	}
	return http.DefaultTransport.RoundTrip(r)
}

func mcpHTTP(t *testing.T, d *harness.Daemon) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: headerTransport{http.Header{"X-Api-Key": {d.APIKey}}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: d.URL + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect to /mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func mcpStdio(t *testing.T, d *harness.Daemon) *mcp.ClientSession {
	t.Helper()
	bin, err := harness.Build()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "cubicle"), "mcp") //depcheck:built
	cmd.Env = []string{"CUBICLE_URL=" + d.URL, "CUBICLE_API_KEY=" + d.APIKey}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(context.Background(),
		&mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("start cubicle mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// meetInSandbox makes two run_command calls at once, the first on a and
// the second on b, that meet in sandbox id: each makes a file of its own
// in a directory named for tag, then waits for the other's. Both end
// "met" only if the two calls ran at the same time; one after the other,
// the first waits alone until its bound and ends "alone". The bound (30 s
// of polling) guards against a hang and is no timing threshold: calls
// that overlap meet at once.
func meetInSandbox(t *testing.T, id, tag string, a, b *mcp.ClientSession) {
	t.Helper()
	dir := "/tmp/mcp-meet-" + tag
	start := time.Now()
	var wg sync.WaitGroup
	for i, cs := range []*mcp.ClientSession{a, b} {
		me, other := "first", "second"
		if i == 1 {
			me, other = other, me
		}
		script := fmt.Sprintf(`mkdir -p %[1]s && touch %[1]s/%[2]s || exit 2
i=0
while [ $i -lt 300 ]; do
	if [ -e %[1]s/%[3]s ]; then echo met; exit 0; fi
	sleep 0.1; i=$((i+1))
done
echo alone; exit 1`, dir, me, other)
		wg.Go(func() {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_command",
				Arguments: map[string]any{"sandbox_id": id, "command": script, "timeout_seconds": 60}})
			if err != nil || res.IsError {
				t.Errorf("%s call: %v %+v", me, err, res)
				return
			}
			if got := mcpText(res); !strings.Contains(got, "exit code 0") || !strings.Contains(got, "met") {
				t.Errorf("%s of two calls at once never saw the other in the sandbox: they ran one after the other: %q", me, got)
			}
		})
	}
	wg.Wait()
	t.Logf("%s: two calls at once met in the sandbox; both done in %v", tag, time.Since(start).Round(time.Millisecond))
}

func testMCPGo(t *testing.T, d *harness.Daemon, c *client.Client) {
	display := func(args map[string]any) map[string]any {
		args["display_width_px"], args["display_height_px"] = 1024, 768
		return args
	}
	start := time.Now()
	cs := mcpHTTP(t, d)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tool := range tools.Tools {
		names[tool.Name] = true
	}
	for _, n := range append([]string{"create_sandbox", "list_sandboxes", "destroy_sandbox", "extend_sandbox",
		"view_sandbox", "run_command", "read_file", "write_file"}, computer.AnthropicActions()...) {
		if !names[n] {
			t.Errorf("tool %s missing", n)
		}
	}

	res := mcpCall(t, cs, "create_sandbox", map[string]any{"width": 1920, "height": 1080, "timeout_seconds": 600})
	sc, _ := res.StructuredContent.(map[string]any)
	id, _ := sc["sandbox_id"].(string)
	if id == "" {
		t.Fatalf("create_sandbox: no sandbox_id in %v", res.StructuredContent)
	}
	t.Logf("create_sandbox over /mcp: %s in %v", id, time.Since(start).Round(time.Millisecond))
	// It is the key's sandbox, as a REST create's would be.
	if sb, err := c.Get(context.Background(), id); err != nil || sb.State != client.StateRunning {
		t.Fatalf("REST get of the MCP sandbox: %+v, %v", sb, err)
	}

	shotStart := time.Now()
	if w, h := mcpPicture(t, mcpCall(t, cs, "screenshot", display(map[string]any{"sandbox_id": id}))); w != 1024 || h != 576 {
		t.Errorf("screenshot: %dx%d, want 1024x576 (1920x1080 shown in 1024x768)", w, h)
	}
	t.Logf("screenshot over /mcp: %v", time.Since(shotStart).Round(time.Millisecond))
	// What the MCP layer (and its loopback hop) adds to a REST call of the
	// same screenshot: medians of 5.
	viaMCP, viaREST := make([]time.Duration, 5), make([]time.Duration, 5)
	for i := range viaMCP {
		s := time.Now()
		mcpCall(t, cs, "screenshot", display(map[string]any{"sandbox_id": id}))
		viaMCP[i] = time.Since(s)
		s = time.Now()
		if _, err := c.ComputerAnthropic(context.Background(), id, map[string]any{
			"tool":  map[string]any{"type": computer.AnthropicToolset, "display_width_px": 1024, "display_height_px": 768},
			"input": map[string]any{"action": "screenshot"}}); err != nil {
			t.Fatal(err)
		}
		viaREST[i] = time.Since(s)
	}
	slices.Sort(viaMCP)
	slices.Sort(viaREST)
	t.Logf("screenshot 1024x576, median of 5: %v over /mcp, %v over REST", viaMCP[2].Round(100*time.Microsecond), viaREST[2].Round(100*time.Microsecond))
	if w, h := mcpPicture(t, mcpCall(t, cs, "left_click", display(map[string]any{"sandbox_id": id, "coordinate": []int{512, 288}}))); w != 1024 || h != 576 {
		t.Errorf("left_click answered a %dx%d picture", w, h)
	}
	if got := mcpText(mcpCall(t, cs, "cursor_position", display(map[string]any{"sandbox_id": id}))); got != "X=512,Y=288" {
		t.Errorf("cursor_position after the click: %q, want X=512,Y=288", got)
	}
	mcpCall(t, cs, "type", map[string]any{"sandbox_id": id, "text": "hello"})

	// Bad input: isError, and nothing ran (the pointer stayed).
	bad, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "left_click",
		Arguments: display(map[string]any{"sandbox_id": id, "coordinate": []int{1024, 10}})})
	if err != nil || !bad.IsError || !strings.Contains(mcpText(bad), "outside the screen") {
		t.Errorf("left_click outside the picture: %v, %+v", err, bad)
	}
	if got := mcpText(mcpCall(t, cs, "cursor_position", display(map[string]any{"sandbox_id": id}))); got != "X=512,Y=288" {
		t.Errorf("cursor_position after the refused click: %q", got)
	}

	run := mcpCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo mcp-$((40+2))"})
	if got := mcpText(run); !strings.Contains(got, "exit code 0") || !strings.Contains(got, "mcp-42") {
		t.Errorf("run_command: %q", got)
	}
	mcpCall(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/tmp/mcp.txt", "content": "through MCP ✓"})
	if got := mcpText(mcpCall(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/tmp/mcp.txt"})); got != "through MCP ✓" {
		t.Errorf("read_file: %q", got)
	}

	// Without the key: 401 in the API's shape. A page of another origin:
	// 403, key or not.
	for _, c := range []struct {
		name   string
		header []string
		want   int
	}{
		{"no key", nil, http.StatusUnauthorized},
		{"wrong key", []string{"X-API-Key", "wrong"}, http.StatusUnauthorized},
		{"foreign origin", []string{"X-API-Key", d.APIKey, "Origin", "https://evil.example"}, http.StatusForbidden},
		{"foreign fetch", []string{"X-API-Key", d.APIKey, "Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"own origin", []string{"X-API-Key", d.APIKey, "Origin", d.URL}, http.StatusOK},
	} {
		req, _ := http.NewRequest("POST", d.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		for i := 0; i+1 < len(c.header); i += 2 {
			req.Header.Set(c.header[i], c.header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, body.String(), c.want)
		} else if c.want == http.StatusUnauthorized && !strings.Contains(body.String(), `"code":"unauthorized"`) {
			t.Errorf("%s: %s, want the API's error", c.name, body.String())
		}
	}

	// Two connections do not wait on each other.
	other := mcpHTTP(t, d)
	meetInSandbox(t, id, "two-connections", cs, other)

	// stdio: the built CLI, the same sandbox (the same key), and two
	// calls of one pipe in parallel too.
	stdioStart := time.Now()
	ss := mcpStdio(t, d)
	if w, h := mcpPicture(t, mcpCall(t, ss, "screenshot", display(map[string]any{"sandbox_id": id}))); w != 1024 || h != 576 {
		t.Errorf("stdio screenshot: %dx%d", w, h)
	}
	t.Logf("cubicle mcp: started and answered a screenshot in %v", time.Since(stdioStart).Round(time.Millisecond))
	if got := mcpText(mcpCall(t, ss, "run_command", map[string]any{"sandbox_id": id, "command": "cat /tmp/mcp.txt"})); !strings.Contains(got, "through MCP ✓") {
		t.Errorf("stdio run_command: %q", got)
	}
	meetInSandbox(t, id, "one-stdio-pipe", ss, ss)

	mcpCall(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": id})
	if sb, err := c.Get(context.Background(), id); err == nil && sb.State != client.StateStopped {
		t.Errorf("after destroy_sandbox: %s", sb.State)
	}
	t.Logf("go-sdk part: %v", time.Since(start).Round(time.Millisecond))
}

// testMCPTypeScript runs test/mcp-js (the @modelcontextprotocol/sdk client)
// against the daemon, over stdio and Streamable HTTP.
func testMCPTypeScript(t *testing.T, d *harness.Daemon) {
	needs.Command(t, "node", "npm")
	bin, err := harness.Build()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(harness.RepoRoot(), "test", "mcp-js")
	npmCI(t, dir)
	env := []string{
		"CUBICLE_URL=" + d.URL,
		"CUBICLE_API_KEY=" + d.APIKey,
		"CUBICLE_BIN=" + filepath.Join(bin, "cubicle"),
		"NO_COLOR=1",
	}
	start := time.Now()
	out, err := runLogged(t, 3*time.Minute, dir, env, "node", "--test", "--test-reporter=spec", "--test-concurrency=1")
	t.Logf("node --test took %v", time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		t.Errorf("node --test: %v", err)
	}
	if m := skippedLine.FindStringSubmatch(out); m == nil {
		t.Error("node --test printed no summary of skipped tests")
	} else if n, _ := strconv.Atoi(m[1]); n != 0 {
		t.Errorf("node --test skipped %d tests", n)
	}
}
