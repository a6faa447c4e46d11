package e2e

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	cimage "github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestXFCEDesktop checks the desktop image is XFCE's own session: a fresh
// sandbox's screenshot shows the panel along its top and Chromium's page
// below it, and the session's programs are the real ones (their
// executables, not stand-ins), under a D-Bus session bus.
func TestXFCEDesktop(t *testing.T) {
	for _, backend := range selectedBackends("gvisor", "runc") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testXFCEDesktop(t, backend)
		})
	}
}

func testXFCEDesktop(t *testing.T, backend string) {
	d, c := startDaemon(t, backend)
	ctx := context.Background()
	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{Template: "desktop", Backend: backend, StartURL: "about:blank"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Logf("sandbox %s ready in %s", sb.ID, time.Since(t0).Round(time.Millisecond))
	white := color.RGBA{0xff, 0xff, 0xff, 0xff}
	// XFCE's panel holds the top of the screen: Chromium is maximized
	// below it, and the panel's rows are not the page. Until the session
	// is up Chromium may have the whole screen.
	var page image.Rectangle
	var top int
	if !eventually(90*time.Second, func() bool {
		shot := screenshotImage(t, c, sb.ID)
		page = findColour(shot, func(c color.Color) bool { return near(rgba(c), white) })
		top = countWhere(shot, image.Rect(0, 0, shot.Bounds().Dx(), 16), func(c color.Color) bool { return near(rgba(c), white) })
		return page.Dx() > 900 && page.Dy() > 500 && page.Min.Y >= 20 && top == 0
	}) {
		t.Fatalf("want Chromium's page below XFCE's panel: the white area is %v, %d white pixels in the top 16 rows", page, top)
	}
	t.Logf("XFCE's panel and Chromium's page (%v) on the screen %s after create", page, time.Since(t0).Round(time.Millisecond))
	// XFCE fits Chromium's window into the work area below the panel:
	// its tab strip must not be under the panel.
	var chromium client.Window
	if !eventually(30*time.Second, func() bool {
		ws, err := c.Windows(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if strings.EqualFold(w.Class, "chromium") {
				chromium = w
				return w.Y >= 20 && w.Y+w.Height <= 768
			}
		}
		return false
	}) {
		t.Errorf("Chromium's window is at %+v: want it below the panel, inside the screen", chromium)
	}
	want := map[string]string{"xfce4-session": "/usr/bin/xfce4-session", "xfwm4": "/usr/bin/xfwm4",
		"xfce4-panel": "/usr/bin/xfce4-panel", "xfdesktop": "/usr/bin/xfdesktop", "dbus-daemon": "/usr/bin/dbus-daemon"}
	var got string
	if !eventually(60*time.Second, func() bool {
		// The executable of each (a link to sleep named xfwm4 would
		// be /usr/bin/sleep). Its exe link: under the pinned runsc a
		// process's first mapping is gVisor's trap page (Debian's runsc
		// of 2022 could not read the link, and the first mapping told).
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{User: "user", Command: `for p in xfce4-session xfwm4 xfce4-panel xfdesktop dbus-daemon; do
			pid=$(pgrep -o -x $p) && echo "$p $(readlink /proc/$pid/exe)"; done`})
		if err != nil {
			t.Fatal(err)
		}
		got = res.Stdout
		for p, exe := range want {
			if !strings.Contains(got, p+" "+exe+"\n") {
				return false
			}
		}
		return true
	}) {
		t.Errorf("XFCE's programs: %q, want each running from %v", got, want)
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, d, backend, sb.ID)
}

func rgba(c color.Color) color.RGBA {
	r, g, b, a := c.RGBA()
	return color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}
}

// countWhere counts the pixels of img inside r that match.
func countWhere(img image.Image, r image.Rectangle, match func(color.Color) bool) int {
	n := 0
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if match(img.At(x, y)) {
				n++
			}
		}
	}
	return n
}

var extImageOnce sync.Once
var extImageErr error

// TestRecipeExtension builds an operator's image the way the README says
// (test/e2e/testdata/recipe-ext: "from": "desktop", one package, an
// unpacked extension and a managed bookmark, a few lines) and checks, in a
// sandbox of it on gvisor and qemu, what a person would see: the
// extension's magenta banner on a page and its title mark, and the managed
// bookmark folder on Chromium's bookmark bar (its name is a row of full
// blocks, a dark bar in the screenshot above the page).
func TestRecipeExtension(t *testing.T) {
	needs.Root(t)
	needs.Command(t, "debootstrap", "chroot", "cp")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	extImageOnce.Do(func() {
		t0 := time.Now()
		var img cimage.Image
		img, extImageErr = cimage.Build(context.Background(), "e2e-ext", os.DirFS("testdata/recipe-ext"), imageDir(), os.Getenv("CUBICLE_CACHE_DIR"), nil)
		t.Logf("image e2e-ext (from desktop): cached=%v in %s", img.Cached, time.Since(t0).Round(time.Second))
	})
	if extImageErr != nil {
		t.Fatal(extImageErr)
	}
	for _, backend := range selectedBackends("gvisor", "qemu") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testRecipeExtension(t, backend)
		})
	}
}

func testRecipeExtension(t *testing.T, backend string) {
	d, c := startDaemon(t, backend)
	ctx := context.Background()
	wait := 90 * time.Second
	req := client.CreateRequest{Template: "e2e-ext", Backend: backend}
	if backend == "qemu" {
		req.MemoryMB = 2048
		wait = 5 * time.Minute // Chromium under TCG
	}
	sb, err := c.Create(ctx, req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	// The recipe's package is there.
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "jq -n 1+1"}); err != nil || strings.TrimSpace(res.Stdout) != "2" {
		t.Fatalf("jq from the recipe: %+v %v", res, err)
	}
	// Content scripts run on http pages (file:// needs a per-extension
	// grant): serve the page from the sandbox's own loopback.
	page, err := os.ReadFile("testdata/ext.html")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctx, sb.ID, "/tmp/www/ext.html", strings.NewReader(string(page))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecBackground(ctx, sb.ID, client.ExecRequest{Command: "exec python3 -m http.server 8765 --bind 127.0.0.1 --directory /tmp/www"}); err != nil {
		t.Fatal(err)
	}
	if !eventually(wait, func() bool {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "python3 -c \"import urllib.request as u; print(len(u.urlopen('http://127.0.0.1:8765/ext.html').read()))\""})
		return err == nil && res.ExitCode == 0
	}) {
		t.Fatal("the page server in the sandbox did not answer")
	}
	if !eventually(wait, func() bool {
		ws, err := c.Windows(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if strings.Contains(strings.ToLower(w.Class), "chromium") {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no Chromium window %s after create: %v", wait, titles(t, c, sb.ID))
	}
	magenta := func(c color.Color) bool { return near(rgba(c), color.RGBA{0xff, 0x00, 0xff, 0xff}) }
	// Type the address; again if a keystroke was lost while Chromium was
	// still starting, after giving the page time to load (long under TCG).
	nav := 20 * time.Second
	if backend == "qemu" {
		nav = time.Minute
	}
	for deadline := time.Now().Add(wait); ; {
		if _, err := c.Actions(ctx, sb.ID, client.PressKey("ctrl+l"), client.TypeText("http://127.0.0.1:8765/ext.html"), client.PressKey("Return")); err != nil {
			t.Fatal(err)
		}
		if eventually(nav, func() bool { return hasWindowTitle(t, c, sb.ID, "EXT: ext page") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the extension did not mark the page's title: windows %v, want one titled \"EXT: ext page\"", titles(t, c, sb.ID))
		}
	}
	var banner image.Rectangle
	var shot image.Image
	if !eventually(wait, func() bool {
		shot = screenshotImage(t, c, sb.ID)
		banner = findColour(shot, magenta)
		return banner.Dx() > 800 && banner.Dy() >= 55
	}) {
		t.Fatalf("the extension's banner: magenta area %v; want a 60 px band across the page", banner)
	}
	// The bookmark bar sits between the toolbar and the page: the managed
	// folder's name is a dark bar there, at least 60 px long.
	bar := image.Rect(0, banner.Min.Y-40, shot.Bounds().Dx(), banner.Min.Y)
	if run := longestDarkRun(shot, bar); run < 60 {
		t.Errorf("no managed bookmark on the bookmark bar: longest dark run above the page %d px, want >= 60", run)
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, d, backend, sb.ID)
}

func titles(t *testing.T, c *client.Client, id string) []string {
	ws, err := c.Windows(context.Background(), id)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, w := range ws {
		out = append(out, fmt.Sprintf("%q (%s)", w.Title, w.Class))
	}
	return out
}

// longestDarkRun is the longest horizontal run of dark pixels in r.
func longestDarkRun(img image.Image, r image.Rectangle) int {
	best := 0
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		run := 0
		for x := r.Min.X; x < r.Max.X; x++ {
			c := rgba(img.At(x, y))
			if int(c.R)+int(c.G)+int(c.B) < 3*90 {
				run++
				best = max(best, run)
			} else {
				run = 0
			}
		}
	}
	return best
}
