package drivertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"image/color"
	_ "image/jpeg" // screenshots may be JPEG
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
	fspb "github.com/cubicle-dev/cubicle/proto/filesystem"
)

// testPage is the main box's start page. Its colour and title change on
// the input it gets, so the suite can see an action's effect in the
// screenshot and in the window list: a click on the page turns it blue and
// focuses the text field, typed text shows in the title, Enter turns the
// page green.
const testPage = `<!doctype html><html><head><title>drivertest ready</title>
<style>html,body{margin:0;height:100%}body{background:#ff0000}
input{position:fixed;left:0;top:0;width:300px;height:24px}</style></head>
<body><input id="i" autofocus><script>
var i = document.getElementById("i");
document.body.addEventListener("click", function (e) {
	if (e.target === i) return;
	document.body.style.background = "#0000ff";
	document.title = "clicked " + e.clientX + "," + e.clientY;
	i.focus();
});
i.addEventListener("input", function () { document.title = "typed:" + i.value; });
i.addEventListener("keydown", function (e) {
	if (e.key === "Enter") { document.body.style.background = "#00ff00"; document.title = "enter:" + i.value; }
});
</script></body></html>`

// pageURL opens testPage without any file in the box.
var pageURL = "data:text/html;base64," + base64.StdEncoding.EncodeToString([]byte(testPage))

// probeX, probeY is a point of the page, below the browser's toolbar and
// any info bar, away from the text field.
const probeX, probeY = width / 2, 480

var (
	red   = color.RGBA{255, 0, 0, 255}
	blue  = color.RGBA{0, 0, 255, 255}
	green = color.RGBA{0, 255, 0, 255}
)

// exec checks the process service: what a command prints on each stream,
// its exit code, argv passed as given, stdin, and the box's environment
// (the spec's Env reaches every process).
func (s *suite) exec(t *testing.T, sb *sbox) {
	tests := []struct {
		name           string
		req            agentclient.ExecRequest
		stdout, stderr string
		code           int
	}{
		{name: "shell", req: agentclient.ExecRequest{Command: `printf %s "$DRIVERTEST_NONCE"; printf 'to stderr' >&2; exit 7`},
			stdout: sb.nonce, stderr: "to stderr", code: 7},
		{name: "argv", req: agentclient.ExecRequest{Argv: []string{"printf", "%s|%s", "two words", sb.nonce}},
			stdout: "two words|" + sb.nonce},
		{name: "stdin", req: agentclient.ExecRequest{Argv: []string{"cat"}, Stdin: []byte(sb.token + "\n")},
			stdout: sb.token + "\n"},
		{name: "cwd", req: agentclient.ExecRequest{Command: "pwd", Cwd: "/tmp"}, stdout: "/tmp\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := sb.client.Exec(ctx, tt.req, nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != tt.stdout || string(res.Stderr) != tt.stderr || res.ExitCode != tt.code {
				t.Errorf("exec %+v: stdout %q, stderr %q, exit %d; want %q, %q, %d",
					tt.req, res.Stdout, res.Stderr, res.ExitCode, tt.stdout, tt.stderr, tt.code)
			}
		})
	}
}

// token checks that the agent got the spec's token: a request with another
// one is refused, on the Connect services and the /files endpoint alike.
func (s *suite) token(t *testing.T, sb *sbox) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wrong := agentclient.New(sb.box.DialAgent, sb.token+"x")
	defer wrong.Close()
	if _, err := wrong.Exec(ctx, agentclient.ExecRequest{Argv: []string{"true"}}, nil); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("exec with a wrong token: %v, want unauthenticated", err)
	}
	_, _, err := wrong.Download(ctx, "/etc/hostname")
	var se *agentclient.StatusError
	if !errors.As(err, &se) || se.Code != 401 {
		t.Errorf("download with a wrong token: %v, want 401", err)
	}
}

// screenshot waits for the page to paint, then checks that screenshots
// decode at the requested sizes and show it.
func (s *suite) screenshot(t *testing.T, sb *sbox) {
	t0 := time.Now()
	painted := s.waitPixel(t, sb, red, min(s.cfg.readyTimeout, 90*time.Second))
	if titles, _ := s.waitTitle(t, sb, "drivertest ready", 0); !painted && strings.HasPrefix(titles, `"Untitled`) {
		// Chromium under TCG at times restarts its network service
		// while it starts ("Network service crashed or was terminated,
		// restarting service" on the console) and loses the start
		// navigation for good: a blank "Untitled" tab that never loaded
		// its URL. A reload is what a user would do; the README names
		// the bug.
		t.Logf("a blank %s tab after 90 s; reloading once", titles)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := s.act(ctx, sb, &desktoppb.Action{Type: "key", Keys: []string{"F5"}})
		cancel()
		if err != nil {
			t.Fatalf("reload: %v", err)
		}
	}
	if !painted && !s.waitPixel(t, sb, red, s.cfg.readyTimeout-min(s.cfg.readyTimeout, 90*time.Second)+30*time.Second) {
		s.keep(t, sb, "unpainted")
		titles, _ := s.waitTitle(t, sb, "drivertest ready", 0)
		s.logBox(t, sb)
		t.Fatalf("the start page never painted (no %v at %d,%d in %s; window titles: %s)", red, probeX, probeY, s.cfg.readyTimeout, titles)
	}
	t.Logf("start page painted %s after the desktop was ready", time.Since(t0).Round(time.Millisecond))
	tests := []struct {
		name          string
		req           *desktoppb.ScreenshotRequest
		format        string
		width, height int
	}{
		{name: "png full", req: &desktoppb.ScreenshotRequest{Format: "png"}, format: "png", width: width, height: height},
		{name: "png width", req: &desktoppb.ScreenshotRequest{Format: "png", Width: 512}, format: "png", width: 512, height: 384},
		{name: "jpeg scale", req: &desktoppb.ScreenshotRequest{Format: "jpeg", Scale: 0.25, Quality: 70}, format: "jpeg", width: 256, height: 192},
		{name: "region", req: &desktoppb.ScreenshotRequest{Format: "png", Region: &desktoppb.Region{X: probeX - 50, Y: probeY - 20, W: 100, H: 40}},
			format: "png", width: 100, height: 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			resp, err := sb.client.Desktop.Screenshot(ctx, connect.NewRequest(tt.req))
			if err != nil {
				t.Fatal(err)
			}
			img, format, err := image.Decode(bytes.NewReader(resp.Msg.Data))
			if err != nil {
				t.Fatalf("screenshot does not decode: %v", err)
			}
			if b := img.Bounds(); format != tt.format || b.Dx() != tt.width || b.Dy() != tt.height {
				t.Errorf("screenshot is %s %dx%d, want %s %dx%d", format, b.Dx(), b.Dy(), tt.format, tt.width, tt.height)
			}
			if int(resp.Msg.Width) != img.Bounds().Dx() || int(resp.Msg.Height) != img.Bounds().Dy() {
				t.Errorf("response says %dx%d, image is %v", resp.Msg.Width, resp.Msg.Height, img.Bounds())
			}
			if tt.name == "region" {
				// Only the page's background is there.
				if c, share := dominant(img); !near(c, red) || share < 0.99 {
					t.Errorf("region around the probe point: dominant colour %v covers %.1f%%, want red, all of it", c, 100*share)
				}
				return
			}
			// A desktop showing a browser: many colours (text, toolbar,
			// the page), none covering the whole screen.
			if n := distinctColours(img); n < 8 {
				t.Errorf("screenshot has %d distinct colours: blank", n)
			}
			if c, share := dominant(img); share > 0.97 {
				t.Errorf("colour %v covers %.1f%% of the screenshot: blank", c, 100*share)
			}
		})
	}
}

// actions checks that input has its effect, seen as the page sees it: a
// click turns it blue, typed text reaches its text field (shown in the
// window title), Enter turns it green; the pointer is where it was sent.
func (s *suite) actions(t *testing.T, sb *sbox) {
	// The Screenshot check waited for the first paint.
	if !s.waitPixel(t, sb, red, 30*time.Second) {
		t.Fatalf("the start page is not red at %d,%d before any action", probeX, probeY)
	}
	x, y := int32(probeX), int32(probeY)
	steps := []struct {
		name   string
		action *desktoppb.Action
		colour color.RGBA
		title  string
	}{
		{name: "click", action: &desktoppb.Action{Type: "click", X: &x, Y: &y}, colour: blue, title: "clicked "},
		{name: "type", action: &desktoppb.Action{Type: "type", Text: "drivertest"}, colour: blue, title: "typed:drivertest"},
		{name: "key", action: &desktoppb.Action{Type: "key", Keys: []string{"Return"}}, colour: green, title: "enter:drivertest"},
	}
	for _, st := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t0 := time.Now()
		_, err := s.act(ctx, sb, st.action)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if !s.waitPixel(t, sb, st.colour, 30*time.Second) {
			s.keep(t, sb, "after-"+st.name)
			t.Fatalf("%s: the page at %d,%d is not %v 30 s later", st.name, probeX, probeY, st.colour)
		}
		title, ok := s.waitTitle(t, sb, st.title, 30*time.Second)
		if !ok {
			t.Fatalf("%s: no window title with %q 30 s later (titles: %s)", st.name, st.title, title)
		}
		t.Logf("%s: effect seen in %s (title %q)", st.name, time.Since(t0).Round(time.Millisecond), title)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.act(ctx, sb, &desktoppb.Action{Type: "cursor_position"})
	if err != nil {
		t.Fatal(err)
	}
	if p := res[0]; p.X != x || p.Y != y {
		t.Errorf("cursor at %d,%d after the click, want %d,%d", p.X, p.Y, x, y)
	}
}

// act runs actions and turns a failed one into an error.
func (s *suite) act(ctx context.Context, sb *sbox, actions ...*desktoppb.Action) ([]*desktoppb.ActionResult, error) {
	resp, err := sb.client.Desktop.Act(ctx, connect.NewRequest(&desktoppb.ActRequest{Actions: actions}))
	if err != nil {
		return nil, err
	}
	if resp.Msg.Error != "" {
		return nil, fmt.Errorf("action %d: %s (%s)", resp.Msg.FailedIndex, resp.Msg.Error, resp.Msg.ErrorCode)
	}
	if len(resp.Msg.Results) != len(actions) {
		return nil, fmt.Errorf("%d results for %d actions", len(resp.Msg.Results), len(actions))
	}
	return resp.Msg.Results, nil
}

// waitPixel polls full screenshots until the probe point is near want.
func (s *suite) waitPixel(t *testing.T, sb *sbox, want color.RGBA, timeout time.Duration) bool {
	t.Helper()
	var last color.RGBA
	for deadline := time.Now().Add(timeout); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := sb.client.Desktop.Screenshot(ctx, connect.NewRequest(&desktoppb.ScreenshotRequest{
			Format: "png", Region: &desktoppb.Region{X: probeX, Y: probeY, W: 1, H: 1}}))
		cancel()
		if err == nil {
			if img, err := png.Decode(bytes.NewReader(resp.Msg.Data)); err == nil {
				last = rgba(img.At(img.Bounds().Min.X, img.Bounds().Min.Y))
				if near(last, want) {
					return true
				}
			}
		}
		if time.Now().After(deadline) || !alive(sb.box) {
			t.Logf("pixel at %d,%d is %v (last error %v), want %v", probeX, probeY, last, err, want)
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitTitle polls the window list until a window's title contains want; it
// returns that title, or all titles when none did.
func (s *suite) waitTitle(t *testing.T, sb *sbox, want string, timeout time.Duration) (string, bool) {
	t.Helper()
	var titles []string
	for deadline := time.Now().Add(timeout); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := s.act(ctx, sb, &desktoppb.Action{Type: "windows"})
		cancel()
		if err == nil {
			titles = titles[:0]
			for _, w := range res[0].Windows {
				if strings.Contains(w.Title, want) {
					return w.Title, true
				}
				titles = append(titles, fmt.Sprintf("%q", w.Title))
			}
		}
		if time.Now().After(deadline) || !alive(sb.box) {
			return strings.Join(titles, ", "), false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// keep saves a full screenshot for a failure: in $CUBICLE_SCREENSHOT_DIR
// when set, else in the test's temporary directory (logged either way).
func (s *suite) keep(t *testing.T, sb *sbox, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := sb.client.Desktop.Screenshot(ctx, connect.NewRequest(&desktoppb.ScreenshotRequest{Format: "png"}))
	if err != nil {
		t.Logf("no screenshot to keep: %v", err)
		return
	}
	dir := os.Getenv("CUBICLE_SCREENSHOT_DIR")
	if dir == "" {
		// Not t.TempDir: the file is for after the failed run.
		if dir, err = os.MkdirTemp("", "drivertest-"); err != nil {
			t.Logf("keep screenshot: %v", err)
			return
		}
	}
	p := filepath.Join(dir, "drivertest-"+s.name+"-"+what+".png")
	if err := os.WriteFile(p, resp.Msg.Data, 0o644); err != nil {
		t.Logf("keep screenshot: %v", err)
		return
	}
	t.Logf("screenshot kept: %s", p)
}

// logBox logs what runs in the box and its memory, for a failure.
func (s *suite) logBox(t *testing.T, sb *sbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := sb.client.Exec(ctx, agentclient.ExecRequest{Command: "ps -eo pid,etimes,rss,args | cut -c1-160; free -m", MaxOutput: 64 << 10}, nil)
	t.Logf("in the box: %s%s %v", res.Stdout, res.Stderr, err)
}

// files checks the filesystem service and /files: an upload reads back
// byte for byte, shows in a listing with its size, is the same file a
// command in the box sees, a file a command writes downloads, and a removed
// file is gone.
func (s *suite) files(t *testing.T, sb *sbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := "/tmp/drivertest-" + sb.nonce + "/sub dir"
	path := dir + "/blob.bin"
	payload := make([]byte, 300<<10)
	_, _ = rand.Read(payload)
	n, err := sb.client.Upload(ctx, path, bytes.NewReader(payload))
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	if n != int64(len(payload)) {
		t.Errorf("upload wrote %d bytes, want %d", n, len(payload))
	}
	if got := download(ctx, t, sb, path); !bytes.Equal(got, payload) {
		t.Errorf("download: %d bytes, not the %d uploaded", len(got), len(payload))
	}
	list, err := sb.client.Filesystem.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir, Depth: 1}))
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if es := list.Msg.Entries; len(es) != 1 || es[0].Name != "blob.bin" || es[0].Size != int64(len(payload)) || es[0].Type != fspb.FileType_FILE_TYPE_FILE {
		t.Errorf("list %s = %v, want the one file blob.bin of %d bytes", dir, es, len(payload))
	}
	sum := sha256.Sum256(payload)
	res, err := sb.client.Exec(ctx, agentclient.ExecRequest{Argv: []string{"sha256sum", path}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := strings.Cut(string(res.Stdout), " "); got != hex.EncodeToString(sum[:]) {
		t.Errorf("sha256sum in the box = %q (exit %d), want %x", res.Stdout, res.ExitCode, sum)
	}
	written := dir + "/from-exec.txt"
	if res, err := sb.client.Exec(ctx, agentclient.ExecRequest{Command: `printf %s "$DRIVERTEST_NONCE" > "` + written + `"`}, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("write a file in the box: %+v, %v", res, err)
	}
	if got := download(ctx, t, sb, written); string(got) != sb.nonce {
		t.Errorf("download of a file a command wrote = %q, want %q", got, sb.nonce)
	}
	if _, err := sb.client.Filesystem.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: path})); err != nil {
		t.Fatalf("remove: %v", err)
	}
	_, _, err = sb.client.Download(ctx, path)
	var se *agentclient.StatusError
	if !errors.As(err, &se) || se.Code != 404 {
		t.Errorf("download after remove: %v, want 404", err)
	}
}

func download(ctx context.Context, t *testing.T, sb *sbox, path string) []byte {
	t.Helper()
	rc, _, err := sb.client.Download(ctx, path)
	if err != nil {
		t.Fatalf("download %s: %v", path, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("download %s: %v", path, err)
	}
	return data
}

func rgba(c color.Color) color.RGBA {
	r, g, b, a := c.RGBA()
	return color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}
}

// near allows for the browser's colour management.
func near(a, b color.RGBA) bool {
	d := func(x, y uint8) bool { return int(x)-int(y) < 24 && int(y)-int(x) < 24 }
	return d(a.R, b.R) && d(a.G, b.G) && d(a.B, b.B)
}

func distinctColours(img image.Image) int {
	seen := map[color.RGBA]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			seen[rgba(img.At(x, y))] = true
		}
	}
	return len(seen)
}

// dominant returns the most common colour of img and the share of pixels
// it has.
func dominant(img image.Image) (color.RGBA, float64) {
	count := map[color.RGBA]int{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			count[rgba(img.At(x, y))]++
		}
	}
	var best color.RGBA
	for c, n := range count {
		if n > count[best] {
			best = c
		}
	}
	return best, float64(count[best]) / float64(b.Dx()*b.Dy())
}
