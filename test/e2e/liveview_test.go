package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/color"
	"image/png"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/rfb"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// artifactDir is where the browser test leaves its screenshots for a person
// to look at: $CUBICLE_ARTIFACTS, else test-artifacts/ at the repository
// root (`make test` lists it at the end).
func artifactDir(t *testing.T) string {
	dir := os.Getenv("CUBICLE_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(harness.RepoRoot(), "test-artifacts")
	}
	dir = filepath.Join(dir, "liveview")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser starts a headless Chromium of the host driven by chromedp.
func browser(t *testing.T) context.Context {
	t.Helper()
	needs.Command(t, "chromium")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath("/usr/bin/chromium"),
		chromedp.NoSandbox, // the test runs as root
		chromedp.WindowSize(1280, 960),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// run runs chromedp actions with a timeout.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, what, js string) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// saveShot writes a PNG of the browser's page to the artifact dir.
func saveShot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	buf, err := chromedp.Run(tctx, chromedp.FullScreenshot(90))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(artifactDir(t), name)
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "live view artifact: %s\n", p)
	t.Logf("artifact: %s", p)
}

// canvasPixel reads one pixel of the noVNC canvas at desktop coordinates.
func canvasPixel(t *testing.T, ctx context.Context, x, y int) color.RGBA {
	t.Helper()
	js := fmt.Sprintf(`(() => {
		const c = document.querySelector('#screen canvas');
		const d = c.getContext('2d').getImageData(%d, %d, 1, 1).data;
		return [d[0], d[1], d[2]];
	})()`, x, y)
	rgb := eval[[]int](t, ctx, "read canvas", js)
	return color.RGBA{uint8(rgb[0]), uint8(rgb[1]), uint8(rgb[2]), 0xff}
}

// canvasPoint is where desktop pixel (x, y) is on the page.
func canvasPoint(t *testing.T, ctx context.Context, x, y int) (float64, float64) {
	t.Helper()
	js := fmt.Sprintf(`(() => {
		const c = document.querySelector('#screen canvas');
		const r = c.getBoundingClientRect();
		return [r.left + (%d + 0.5) * r.width / c.width, r.top + (%d + 0.5) * r.height / c.height];
	})()`, x, y)
	p := eval[[]float64](t, ctx, "locate canvas", js)
	return p[0], p[1]
}

// openViewer opens a view link and waits until noVNC is connected and
// showing the desktop.
func openViewer(t *testing.T, ctx context.Context, u string) {
	t.Helper()
	run(t, ctx, "open viewer",
		chromedp.Navigate(u),
		chromedp.WaitVisible(chromedp.CSS(`body[data-state="connected"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#screen canvas`)),
	)
}

// TestLiveView drives the dashboard and the viewer page in a real headless
// Chromium against a real desktop sandbox (gvisor, or the backends
// CUBICLE_E2E_BACKEND names): the canvas shows what screenshots show, a
// click through a control link reaches the sandbox and one through a
// view-only link does not, bad tokens get nothing, 100 viewers come and go
// without leaks, a viewer is closed when its link expires and cut when it
// stops reading, and destroying the sandbox ends its viewers.
func TestLiveView(t *testing.T) {
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testLiveView(t, backend)
		})
	}
}

func testLiveView(t *testing.T, backend string) {
	if _, err := os.Stat(filepath.Join(harness.NoVNCDir(), "core", "rfb.js")); err != nil {
		needs.Skip(t, "noVNC is not installed in %s (make deps)", harness.NoVNCDir())
	}
	d, c := startDaemon(t, backend)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 1024, Height: 768}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	openTestPage(t, c, sb.ID)
	bctx := browser(t)

	// The dashboard: sign in with the API key, the sandbox's card gets a
	// live thumbnail.
	run(t, bctx, "dashboard",
		chromedp.Navigate(d.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#api-key`)),
		chromedp.SendKeys(chromedp.CSS(`#api-key`), d.APIKey),
		chromedp.Click(chromedp.CSS(`#signin button`)), // a click fires the submit event the page handles
		chromedp.WaitVisible(chromedp.CSS(`article.sandbox[data-id="`+sb.ID+`"] img.thumb`)),
	)
	thumbW := eval[int](t, bctx, "thumbnail size",
		`document.querySelector('article.sandbox[data-id="`+sb.ID+`"] img.thumb').naturalWidth`)
	if thumbW < 100 {
		t.Errorf("thumbnail is %d px wide", thumbW)
	}
	saveShot(t, bctx, "dashboard.png")

	// View only: the canvas matches the screenshot, a click changes nothing.
	viewOnly, err := c.View(ctx, sb.ID, client.ViewRequest{TTLSeconds: 600, ViewOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	openViewer(t, bctx, viewOnly.URL)
	waitFor(t, "canvas shows the red page", func() bool { return near(canvasPixel(t, bctx, 512, 450), red) })
	compareCanvas(t, bctx, c, sb.ID)
	x, y := canvasPoint(t, bctx, 512, 450)
	run(t, bctx, "click view-only", chromedp.MouseClickXY(x, y))
	time.Sleep(2 * time.Second)
	if got := pixel(t, c, sb.ID, 512, 450); !near(got, red) {
		t.Fatalf("a click through a view-only link reached the sandbox: pixel %v", got)
	}
	saveShot(t, bctx, "viewer-view-only.png")

	// The page does not send input in view-only mode; the proxy must not
	// rely on that. A viewer that sends a click anyway with a view-only
	// token has it dropped.
	rogue := dialVNC(t, d, sb.ID, "?token="+url.QueryEscape(tokenOf(t, viewOnly.URL)))
	rc := rfb.NewClient(websocket.NetConn(ctx, rogue, websocket.MessageBinary))
	if _, err := rc.Handshake(true); err != nil {
		t.Fatal(err)
	}
	for _, mask := range []uint8{0, 1, 0} {
		if err := rc.Pointer(mask, 512, 450); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "dropped input counted", func() bool { return metricValue(t, d, "cubicle_view_input_dropped_total") >= 3 })
	time.Sleep(time.Second)
	if got := pixel(t, c, sb.ID, 512, 450); !near(got, red) {
		t.Fatalf("a click sent with a view-only token reached the sandbox: pixel %v", got)
	}
	rogue.Close(websocket.StatusNormalClosure, "")

	// A link of a second, refused below once it has expired: made here, it
	// expires during the control link's checks.
	short, err := c.View(ctx, sb.ID, client.ViewRequest{TTLSeconds: 1, ViewOnly: true})
	if err != nil {
		t.Fatal(err)
	}

	// Control: the click reaches the sandbox, and the canvas follows.
	control, err := c.View(ctx, sb.ID, client.ViewRequest{TTLSeconds: 600, ViewOnly: false})
	if err != nil {
		t.Fatal(err)
	}
	openViewer(t, bctx, control.URL)
	waitFor(t, "canvas shows the red page", func() bool { return near(canvasPixel(t, bctx, 512, 450), red) })
	x, y = canvasPoint(t, bctx, 512, 450)
	run(t, bctx, "click control", chromedp.MouseClickXY(x, y))
	waitFor(t, "page turns green", func() bool { return near(pixel(t, c, sb.ID, 512, 450), green) })
	waitFor(t, "canvas turns green", func() bool { return near(canvasPixel(t, bctx, 512, 450), green) })
	saveShot(t, bctx, "viewer-control.png")

	// Refused WebSockets get an error status and not one byte of RFB.
	tok := tokenOf(t, viewOnly.URL)
	time.Sleep(time.Until(short.ExpiresAt) + 200*time.Millisecond) // at once, mostly
	for _, tt := range []struct {
		name, id, query string
		status          int
	}{
		{"no token", sb.ID, "", 401},
		{"garbage token", sb.ID, "?token=v1.abc.def", 401},
		{"expired token", sb.ID, "?token=" + url.QueryEscape(tokenOf(t, short.URL)), 401},
		{"token of another sandbox", "zzzzzzzzzzzzzzzzzzzzzzzzzz", "?token=" + url.QueryEscape(tok), 403},
	} {
		dialRefused(t, d, tt.name, tt.id, tt.query, tt.status)
	}
	// The API key works too (a header, for programs).
	ws := dialVNC(t, d, sb.ID, "", "Authorization", "Bearer "+d.APIKey)
	ws.CloseNow()

	// 100 viewers open, get the desktop's ServerInit and close; goroutines,
	// file descriptors and the connection gauge come back to the baseline.
	noLeak(t, d, sb.ID, tok)

	// A viewer is closed when its link expires, and one that stops
	// reading is cut after viewWriteTimeout (README: "A viewer that
	// cannot keep up for 15 s is closed").
	// The two are timers of the daemon's on connections of their own: the
	// expiring viewer is opened first, and its close is judged once the
	// slow one has been cut (its reader noted when the close came).
	expired := viewerClosedAtExpiry(t, d, c, sb.ID)
	slowViewerCut(t, d, sb.ID, tok)
	expired()

	// Destroy: every viewer is closed within a second of the request, the
	// page says so, and the token is revoked.
	ws = dialVNC(t, d, sb.ID, "?token="+url.QueryEscape(tok))
	defer ws.CloseNow()
	cl := rfb.NewClient(websocket.NetConn(ctx, ws, websocket.MessageBinary))
	if _, err := cl.Handshake(true); err != nil {
		t.Fatal(err)
	}
	closed := make(chan time.Time, 1)
	go func() {
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				closed <- time.Now()
				return
			}
		}
	}()
	start := time.Now()
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-closed:
		t.Logf("viewer closed %v after the destroy request", at.Sub(start).Round(time.Millisecond))
		if at.Sub(start) > time.Second {
			t.Errorf("viewer closed %v after the destroy request, want < 1 s", at.Sub(start))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("viewer still open 5 s after destroy")
	}
	run(t, bctx, "page shows the end", chromedp.WaitVisible(chromedp.CSS(`body[data-state="ended"]`)))
	reason := eval[string](t, bctx, "end reason", `document.body.dataset.reason`)
	if !strings.Contains(strings.ToLower(reason), "ended") {
		t.Errorf("page reason %q, want it to say the sandbox ended", reason)
	}
	saveShot(t, bctx, "viewer-ended.png")
	dialRefused(t, d, "revoked token", sb.ID, "?token="+url.QueryEscape(tok), 403)
	assertNoTrace(t, d, backend, sb.ID)
}

// compareCanvas checks the canvas against a PNG screenshot on a grid of
// points: the live view shows what the API shows.
func compareCanvas(t *testing.T, ctx context.Context, c *client.Client, id string) {
	t.Helper()
	b, err := c.Screenshot(context.Background(), id, client.ScreenshotOptions{Format: "png"})
	if err != nil {
		t.Fatal(err)
	}
	shot, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var pts [][]int
	for y := 24; y < 768; y += 48 {
		for x := 32; x < 1024; x += 64 {
			pts = append(pts, []int{x, y})
		}
	}
	js, _ := json.Marshal(pts)
	got := eval[[][]int](t, ctx, "read canvas grid", `(() => {
		const c = document.querySelector('#screen canvas');
		const g = c.getContext('2d');
		return `+string(js)+`.map(([x, y]) => Array.from(g.getImageData(x, y, 1, 1).data.slice(0, 3)));
	})()`)
	same := 0
	for i, p := range pts {
		r, g, bb, _ := shot.At(p[0], p[1]).RGBA()
		want := color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bb >> 8), 0xff}
		have := color.RGBA{uint8(got[i][0]), uint8(got[i][1]), uint8(got[i][2]), 0xff}
		if near(want, have) {
			same++
		}
	}
	t.Logf("canvas matches the screenshot at %d of %d points", same, len(pts))
	// A caret may blink and the encoding may be lossy at edges; the page is
	// otherwise still.
	if same < len(pts)*95/100 {
		t.Errorf("canvas matches the screenshot at only %d of %d points", same, len(pts))
	}
}

func tokenOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Query().Get("token")
}

func wsURL(d *harness.Daemon, id, query string) string {
	return "ws" + strings.TrimPrefix(d.URL, "http") + "/v1/sandboxes/" + id + "/vnc" + query
}

func dialVNC(t *testing.T, d *harness.Daemon, id, query string, headers ...string) *websocket.Conn {
	t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(headers); i += 2 {
		h.Set(headers[i], headers[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, wsURL(d, id, query), &websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{"binary"}})
	if err != nil {
		t.Fatalf("dial live view: %v", err)
	}
	return ws
}

// dialRefused checks that a WebSocket is refused with status before any
// upgrade, so no RFB byte can have been sent.
func dialRefused(t *testing.T, d *harness.Daemon, name, id, query string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, wsURL(d, id, query), &websocket.DialOptions{Subprotocols: []string{"binary"}})
	if err == nil {
		ws.CloseNow()
		t.Errorf("%s: WebSocket opened", name)
		return
	}
	if resp == nil || resp.StatusCode != status {
		t.Errorf("%s: %v, want HTTP %d", name, err, status)
		return
	}
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error.Code == "" {
		t.Errorf("%s: error body %+v, %v", name, body, err)
	}
}

// noLeak opens and closes 100 viewers and checks the daemon's goroutines,
// file descriptors and open viewers return to the baseline.
func noLeak(t *testing.T, d *harness.Daemon, id, tok string) {
	t.Helper()
	cycle := func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ws := dialVNC(t, d, id, "?token="+url.QueryEscape(tok))
		cl := rfb.NewClient(websocket.NetConn(ctx, ws, websocket.MessageBinary))
		if _, err := cl.Handshake(true); err != nil {
			t.Fatalf("viewer %d: %v", i, err)
		}
		if i%2 == 0 {
			ws.Close(websocket.StatusNormalClosure, "")
		} else {
			ws.CloseNow()
		}
	}
	// The browser's viewer stays open throughout; viewers closed just
	// before (CloseNow does not wait) must be gone before the baseline.
	const open0 = 1
	waitFor(t, "only the browser's viewer open", func() bool { return metricValue(t, d, "cubicle_view_connections") == open0 })
	cycle(-1)
	settle := func() (g, fds float64) {
		time.Sleep(500 * time.Millisecond)
		return metricValue(t, d, "go_goroutines"), metricValue(t, d, "process_open_fds")
	}
	waitFor(t, "first viewer gone", func() bool { return metricValue(t, d, "cubicle_view_connections") == open0 })
	g0, f0 := settle()
	start := time.Now()
	for i := 0; i < 100; i++ {
		cycle(i)
	}
	t.Logf("100 viewers opened and closed in %v", time.Since(start).Round(time.Millisecond))
	var g1, f1 float64
	deadline := time.Now().Add(20 * time.Second)
	for {
		g1, f1 = settle()
		if metricValue(t, d, "cubicle_view_connections") == open0 && g1 <= g0+3 && f1 <= f0+3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 100 viewers: goroutines %v → %v, fds %v → %v, open viewers %v",
				g0, g1, f0, f1, metricValue(t, d, "cubicle_view_connections"))
		}
	}
	t.Logf("after 100 viewers: goroutines %v → %v, fds %v → %v", g0, g1, f0, f1)
}

// metricValue reads one unlabelled (or summed) metric from /metrics.
func metricValue(t *testing.T, d *harness.Daemon, name string) float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", d.URL+"/metrics", nil)
	req.Header.Set("X-API-Key", d.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(?:\{[^}]*\})? ([0-9.e+-]+)$`)
	sum, found := 0.0, false
	for _, m := range re.FindAllStringSubmatch(buf.String(), -1) {
		v, err := strconv.ParseFloat(m[1], 64)
		if err == nil {
			sum += v
			found = true
		}
	}
	if !found {
		t.Fatalf("metric %s not found", name)
	}
	return sum
}
