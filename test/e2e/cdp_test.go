package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// devToolsPort is Chromium's DevTools port inside a sandbox
// (session.DevToolsPort, api.DefaultCDPPort).
const devToolsPort = 9222

// cdpPage is the page Playwright opens, served from the sandbox's own disk.
const cdpPage = `<!doctype html>
<html><head><title>cubicle cdp</title>
<style>body { background: #fff; margin: 0; } h1 { font: 48px sans-serif; }</style></head>
<body><h1 id="greeting">Hello from the sandbox</h1><ul><li>one</li><li>two</li></ul></body></html>
`

// TestCDP drives a sandbox's Chromium with Playwright and Puppeteer
// (playwright-core and puppeteer-core from npm, test/cdp-js) through
// cubicled's CDP endpoint: connectOverCDP with a token-only http URL, then
// with the WebSocket URL and the API key in a header, then Puppeteer's
// connect({browserWSEndpoint, headers}); it opens a page from the sandbox's
// disk, reads its DOM, paints its background and checks the change in
// cubicle's own screenshot. Then it
// checks that DevTools is reachable only on the sandbox's loopback: not on
// the sandbox's address (from the sandbox itself, from the host, from
// another sandbox) and not as any listening socket of the host. The test
// runs in a network namespace of its own with sandbox networking on, so
// that sandboxes have addresses to attack; the daemon's namespace is the
// host's as far as the sandboxes can tell.
func TestCDP(t *testing.T) {
	// npm installs before the test leaves the host's network: the
	// namespace it runs in reaches no registry (and an earlier CI run
	// had no cached copy to fall back on).
	needs.Command(t, "nft", "node", "npm")
	jsDir := filepath.Join(harness.RepoRoot(), "test", "cdp-js")
	npmCI(t, jsDir)
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testCDP(t, jsDir, backend)
		})
	}
}

func testCDP(t *testing.T, jsDir, backend string) {
	start := time.Now()
	cidr := "10.89.60.0/24"
	d, c := startDaemonArgs(t, backend, "--net", "--net-bridge", "cbcdp0", "--net-cidr", cidr, "--net-dns", "192.0.2.53")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Two sandboxes at once: the one Playwright drives, and one that
	// tries to reach its DevTools over the sandbox network.
	var (
		sbs  [2]client.Sandbox
		errs [2]error
		wg   sync.WaitGroup
	)
	for i := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// DevTools is on by default: the creates do not ask.
			req := client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 1024, Height: 768}}
			if isVM(backend) {
				req.MemoryMB = 768
			}
			sbs[i], errs[i] = c.Create(ctx, req)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	sb, other := sbs[0], sbs[1]
	t.Logf("sandboxes %s at %s and %s at %s ready after %s", sb.ID, sb.IP, other.ID, other.IP, time.Since(start).Round(time.Millisecond))
	if _, err := netip.ParseAddr(sb.IP); err != nil {
		t.Fatalf("sandbox %s has no address (%q): the isolation checks need sandbox networking", sb.ID, sb.IP)
	}

	if _, err := c.Upload(ctx, sb.ID, "/tmp/cdp.html", strings.NewReader(cdpPage)); err != nil {
		t.Fatal(err)
	}
	view, err := c.View(ctx, sb.ID, client.ViewRequest{TTLSeconds: 600, ViewOnly: false})
	if err != nil {
		t.Fatal(err)
	}
	vu, err := url.Parse(view.URL)
	if err != nil {
		t.Fatal(err)
	}
	token := vu.Query().Get("token")

	// The endpoint's own answers, without Playwright.
	versionURL := d.URL + "/v1/sandboxes/" + sb.ID + "/cdp/json/version"
	for _, ch := range []struct {
		name    string
		url     string
		headers []string
		want    int
	}{
		{"no key, no token", versionURL, nil, 401},
		{"wrong key", versionURL, []string{"X-API-Key", "nope"}, 401},
		{"a view-only token", versionURL + "?token=" + url.QueryEscape(viewOnlyToken(t, c, sb.ID)), nil, 403},
		{"the other sandbox's token", versionURL + "?token=" + url.QueryEscape(viewOnlyToken(t, c, other.ID)), nil, 403},
		// E2B's data plane forwards any other port of a sandbox to
		// whoever knows its id; not DevTools (nor the VNC server).
		{"E2B's port routing to DevTools", d.URL + "/json/version", []string{"E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", strconv.Itoa(devToolsPort)}, 403},
		{"E2B's port routing to x11vnc", d.URL + "/", []string{"E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "5999"}, 403},
	} {
		if code := httpStatus(t, ch.url, ch.headers...); code != ch.want {
			t.Errorf("GET /cdp/json/version with %s: %d, want %d", ch.name, code, ch.want)
		}
	}

	// Playwright.
	t0 := time.Now()
	out, err := runLogged(t, 2*time.Minute, jsDir, []string{
		"CUBICLE_URL=" + d.URL, "CUBICLE_API_KEY=" + d.APIKey, "CUBICLE_TOKEN=" + token,
		"CUBICLE_SANDBOX=" + sb.ID, "CUBICLE_PAGE=file:///tmp/cdp.html", "NO_COLOR=1",
	}, "node", "cdp.mjs")
	if err != nil {
		t.Fatalf("node cdp.mjs: %v", err)
	}
	var res struct {
		ConnectMS             int      `json:"connectMs"`
		ReconnectMS           int      `json:"reconnectMs"`
		GotoMS                int      `json:"gotoMs"`
		Version               string   `json:"version"`
		Title                 string   `json:"title"`
		Heading               string   `json:"heading"`
		Items                 []string `json:"items"`
		Background            string   `json:"background"`
		HeadingAfterReconnect *string  `json:"headingAfterReconnect"`
		PuppeteerConnectMS    int      `json:"puppeteerConnectMs"`
		PuppeteerHeading      *string  `json:"puppeteerHeading"`
		PuppeteerChanged      string   `json:"puppeteerChanged"`
	}
	_, line, ok := strings.Cut(out, "RESULT ")
	if !ok {
		t.Fatalf("no RESULT line in:\n%s", out)
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(strings.SplitN(line, "\n", 2)[0])), &res); err != nil {
		t.Fatalf("RESULT: %v", err)
	}
	t.Logf("Playwright: Chromium %s; connect %d ms (token, http URL), goto %d ms, reconnect %d ms (key, ws URL); Puppeteer: connect %d ms; script %s",
		res.Version, res.ConnectMS, res.GotoMS, res.ReconnectMS, res.PuppeteerConnectMS, time.Since(t0).Round(time.Millisecond))
	if res.Title != "cubicle cdp" || res.Heading != "Hello from the sandbox" || !slices.Equal(res.Items, []string{"one", "two"}) {
		t.Errorf("DOM read through CDP: title %q, heading %q, items %q", res.Title, res.Heading, res.Items)
	}
	if res.Background != "rgb(255, 0, 255)" {
		t.Errorf("background after the change: %q", res.Background)
	}
	if res.HeadingAfterReconnect == nil || *res.HeadingAfterReconnect != "Changed by Playwright" {
		t.Errorf("after reconnecting: heading %v, want the changed page", res.HeadingAfterReconnect)
	}
	if res.PuppeteerHeading == nil || *res.PuppeteerHeading != "Changed by Playwright" || res.PuppeteerChanged != "Changed by Puppeteer" {
		t.Errorf("Puppeteer: heading %v, then %q; want Playwright's change, then its own", res.PuppeteerHeading, res.PuppeteerChanged)
	}
	// cubicle's own screenshot shows what Playwright did.
	magenta := color.RGBA{255, 0, 255, 255}
	if !eventually(20*time.Second, func() bool { return near(pixel(t, c, sb.ID, 512, 600), magenta) }) {
		t.Errorf("screenshot pixel (512,600) = %v, want magenta", pixel(t, c, sb.ID, 512, 600))
	}

	// Where the backend pauses, DevTools' listener comes back with the
	// sandbox: the endpoint answers after a resume, on the same page.
	if exp, _ := harness.Expected(backend); exp.Pause {
		if _, err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatalf("pause a sandbox whose DevTools was driven: %v", err)
		}
		if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatalf("resume: %v", err)
		}
		ok := eventually(30*time.Second, func() bool { return httpStatus(t, versionURL, "X-API-Key", d.APIKey) == 200 })
		if !ok {
			t.Errorf("GET /cdp/json/version after pause and resume: %d, want 200", httpStatus(t, versionURL, "X-API-Key", d.APIKey))
		}
		if got := pixel(t, c, sb.ID, 512, 600); !near(got, magenta) {
			t.Errorf("after pause and resume the page is gone: pixel (512,600) = %v, want magenta", got)
		}
	}

	// A create that turns DevTools off gets none: once its Chromium has
	// a window (DevTools listens before), nothing listens on the port.
	off, err := c.Create(ctx, client.CreateRequest{Backend: backend, Env: map[string]string{"CUBICLE_DEVTOOLS": "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if !eventually(time.Minute, func() bool {
		ws, err := c.Windows(ctx, off.ID)
		return err == nil && slices.ContainsFunc(ws, func(w client.Window) bool { return strings.Contains(strings.ToLower(w.Class), "chromium") })
	}) {
		t.Fatalf("the sandbox created with CUBICLE_DEVTOOLS=0 shows no Chromium window")
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if code := httpStatus(t, d.URL+"/v1/sandboxes/"+off.ID+"/cdp/json/version", "X-API-Key", d.APIKey); code != 503 {
			t.Errorf("GET /cdp/json/version of a sandbox created with CUBICLE_DEVTOOLS=0: %d, want 503", code)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := c.Destroy(ctx, off.ID); err != nil {
		t.Fatal(err)
	}

	assertDevToolsLoopbackOnly(t, d, c, sb, other)
	t.Logf("TestCDP/%s took %s", backend, time.Since(start).Round(time.Millisecond))
}

// assertDevToolsLoopbackOnly checks that sb's DevTools answers on its
// loopback and nowhere else: not on sb's own address (from inside sb, a
// check of the bind address that no firewall rule affects), not from the
// host, not from other, and that no socket of the host listens on the
// DevTools port. A listener of sb on all addresses is the control.
func assertDevToolsLoopbackOnly(t *testing.T, d *harness.Daemon, c *client.Client, sb, other client.Sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sh := func(id, script string) string {
		t.Helper()
		res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"bash", "-c", script}, TimeoutSeconds: 30})
		if err != nil {
			t.Fatalf("exec in %s: %v", id, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	// probe reports "open" or "closed" for addr as seen from sandbox id.
	probe := func(id, host string, port int) string {
		return sh(id, fmt.Sprintf("timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%d' 2>/dev/null && echo open || echo closed", host, port))
	}
	if got := sh(sb.ID, fmt.Sprintf(`python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:%d/json/version", timeout=5).read().decode())' 2>&1`, devToolsPort)); !strings.Contains(got, "webSocketDebuggerUrl") {
		t.Fatalf("DevTools on the sandbox's loopback: %q", got)
	}
	// The control: a listener on every address of sb.
	sh(sb.ID, "(setsid python3 -m http.server 9000 --bind 0.0.0.0 >/dev/null 2>&1 &); for i in $(seq 300); do (echo > /dev/tcp/127.0.0.1/9000) 2>/dev/null && break; sleep 0.1; done")
	for _, ch := range []struct {
		name, from, host string
		port             int
		want             string
	}{
		{"sandbox → its own address, all-address listener (control)", sb.ID, sb.IP, 9000, "open"},
		{"sandbox → its own address, DevTools", sb.ID, sb.IP, devToolsPort, "closed"},
		{"other sandbox → DevTools", other.ID, sb.IP, devToolsPort, "closed"},
		{"other sandbox → its own loopback DevTools port, not the first's", other.ID, "127.0.0.1", devToolsPort, "open"},
	} {
		if got := probe(ch.from, ch.host, ch.port); got != ch.want {
			t.Errorf("%s (%s:%d): %s, want %s", ch.name, ch.host, ch.port, got, ch.want)
		}
	}
	if err := netpooltest.Dial("", sb.IP+":9000"); err != nil {
		t.Errorf("host → sandbox all-address listener (control): %v", err)
	}
	for _, addr := range []string{sb.IP, "127.0.0.1", gatewayOf(sb.IP)} {
		if err := netpooltest.Dial("", addr+":"+strconv.Itoa(devToolsPort)); err == nil {
			t.Errorf("host → %s:%d: connected, want refused", addr, devToolsPort)
		}
	}
	// No socket of the host's namespace listens on the DevTools port, no
	// host process of either sandbox listens at all, and cubicled only on
	// its API address.
	ls, err := tcpListeners()
	if err != nil {
		t.Fatal(err)
	}
	owners := socketOwners()
	pids := append(harness.HostProcesses(sb.ID), harness.HostProcesses(other.ID)...)
	_, apiPort, _ := strings.Cut(d.Addr[strings.LastIndex(d.Addr, ":"):], ":")
	for _, l := range ls {
		ps := owners[l.Inode]
		switch {
		case l.Port == devToolsPort:
			t.Errorf("a socket of the host's network namespace listens on the DevTools port: %s (pids %v)", l.Addr, ps)
		case slices.ContainsFunc(ps, func(p int) bool { return slices.Contains(pids, p) }):
			t.Errorf("a host process of a sandbox listens on %s (pids %v)", l.Addr, ps)
		case slices.Contains(ps, d.Pid()) && strconv.Itoa(l.Port) != apiPort:
			t.Errorf("cubicled listens on %s besides its API address %s", l.Addr, d.Addr)
		}
	}
}

// gatewayOf is the bridge's address on a sandbox's /24 (netpool gives the
// bridge the subnet's first address).
func gatewayOf(ip string) string {
	a := netip.MustParseAddr(ip).As4()
	a[3] = 1
	return netip.AddrFrom4(a).String()
}

// viewOnlyToken issues a view-only token of sandbox id.
func viewOnlyToken(t *testing.T, c *client.Client, id string) string {
	t.Helper()
	v, err := c.View(context.Background(), id, client.ViewRequest{ViewOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(v.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get("token")
}

// httpStatus GETs u with headers and returns the status.
func httpStatus(t *testing.T, u string, headers ...string) int {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
