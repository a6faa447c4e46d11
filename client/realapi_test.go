package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"image"
	"image/jpeg"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestSDKAgainstRealAPI drives every method of the Go SDK against the
// daemon's real REST handlers (internal/api) and sandbox manager, with a
// real agent and a real X server behind them (startRealStack; only the
// isolation is a fake). The fake daemon of fake_test.go checks what the
// SDK sends; this checks that what the daemon really answers means to the
// SDK's user what the SDK says it means: exec output, file bytes,
// screenshot sizes, input that reaches an application, error codes for
// bad input.
func TestSDKAgainstRealAPI(t *testing.T) {
	st := startRealStack(t, 2)
	c := st.client
	ctx := context.Background()
	// The fake's sandboxes see the host's files: work in a directory of
	// the test's own.
	dir := t.TempDir()

	t.Run("Health and Info", func(t *testing.T) {
		if err := c.Health(ctx); err != nil {
			t.Fatalf("Health: %v", err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Version != "sdk-test" || info.DefaultBackend != "fake" {
			t.Errorf("Info: version %q, default backend %q; want sdk-test, fake", info.Version, info.DefaultBackend)
		}
		if !slices.ContainsFunc(info.Backends, func(b client.Backend) bool { return b.Name == "fake" && b.Available && b.Isolation == "namespace" }) {
			t.Errorf("Info.Backends = %+v, want fake, available, namespace", info.Backends)
		}
		if info.Capacity != (client.Capacity{MaxSandboxes: 2, Running: 0}) {
			t.Errorf("Info.Capacity = %+v, want 2 slots, none running", info.Capacity)
		}
	})

	var sb client.Sandbox
	t.Run("Create waits for a ready desktop", func(t *testing.T) {
		t0 := time.Now()
		var err error
		sb, err = c.Create(ctx, client.CreateRequest{
			Resolution:     &client.Resolution{Width: 800, Height: 600},
			Env:            map[string]string{"SDK_GREETING": "hello from create"},
			Metadata:       map[string]string{"suite": "sdk-real-api"},
			TimeoutSeconds: 600,
		})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		if !regexp.MustCompile(`^[a-z0-9]{16,}$`).MatchString(sb.ID) {
			t.Errorf("id %q: want 16 or more of [a-z0-9]", sb.ID)
		}
		if sb.State != client.StateRunning || sb.Backend != "fake" || sb.Isolation != "namespace" || sb.Template != "desktop" {
			t.Errorf("Create = %+v, want running desktop on fake (namespace)", sb)
		}
		if sb.Resolution != (client.Resolution{Width: 800, Height: 600}) {
			t.Errorf("resolution %v, want 800x600", sb.Resolution)
		}
		if sb.Metadata["suite"] != "sdk-real-api" {
			t.Errorf("metadata %v", sb.Metadata)
		}
		if left := time.Until(sb.ExpiresAt); left < 590*time.Second || left > 600*time.Second+time.Since(t0) {
			t.Errorf("expires in %v, want 600 s after create", left)
		}
		if st.drv.box(sb.ID) == nil {
			t.Errorf("the driver runs no box for %s", sb.ID)
		}
	})
	if sb.ID == "" {
		t.FailNow()
	}

	t.Run("Get and List", func(t *testing.T) {
		got, err := c.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != sb.ID || got.State != client.StateRunning || got.Metadata["suite"] != "sdk-real-api" {
			t.Errorf("Get = %+v", got)
		}
		for _, tt := range []struct {
			name string
			opts client.ListOptions
			want bool
		}{
			{"all", client.ListOptions{}, true},
			{"by metadata", client.ListOptions{Metadata: map[string]string{"suite": "sdk-real-api"}}, true},
			{"other metadata", client.ListOptions{Metadata: map[string]string{"suite": "other"}}, false},
			{"running", client.ListOptions{State: client.StateRunning}, true},
			{"stopped", client.ListOptions{State: client.StateStopped}, false},
		} {
			list, err := c.List(ctx, tt.opts)
			if err != nil {
				t.Fatalf("List %s: %v", tt.name, err)
			}
			if has := slices.ContainsFunc(list, func(s client.Sandbox) bool { return s.ID == sb.ID }); has != tt.want {
				t.Errorf("List %s: lists the sandbox %v, want %v (%d listed)", tt.name, has, tt.want, len(list))
			}
		}
	})

	t.Run("Screenshot", func(t *testing.T) {
		for _, tt := range []struct {
			name       string
			opts       client.ScreenshotOptions
			format     string
			wantW, wan int
		}{
			{"default PNG", client.ScreenshotOptions{}, "png", 800, 600},
			{"JPEG", client.ScreenshotOptions{Format: "jpeg", Quality: 50}, "jpeg", 800, 600},
			{"half scale", client.ScreenshotOptions{Scale: 0.5}, "png", 400, 300},
			{"width", client.ScreenshotOptions{Width: 200}, "png", 200, 150},
			{"region", client.ScreenshotOptions{Region: &client.Region{X: 10, Y: 20, W: 300, H: 100}}, "png", 300, 100},
			{"with cursor", client.ScreenshotOptions{Cursor: true}, "png", 800, 600},
		} {
			b, err := c.Screenshot(ctx, sb.ID, tt.opts)
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
				continue
			}
			w, h, format := decodeImage(t, b)
			if format != tt.format || w != tt.wantW || h != tt.wan {
				t.Errorf("%s: a %dx%d %s, want %dx%d %s", tt.name, w, h, format, tt.wantW, tt.wan, tt.format)
			}
		}
		for _, tt := range []struct {
			name string
			opts client.ScreenshotOptions
		}{
			{"format gif", client.ScreenshotOptions{Format: "gif"}},
			{"scale 5", client.ScreenshotOptions{Scale: 5}},
			{"quality 500", client.ScreenshotOptions{Format: "jpeg", Quality: 500}},
			{"region off the screen", client.ScreenshotOptions{Region: &client.Region{X: 790, Y: 590, W: 100, H: 100}}},
		} {
			if _, err := c.Screenshot(ctx, sb.ID, tt.opts); !client.IsInvalidArgument(err) {
				t.Errorf("Screenshot with %s: %v, want invalid_argument", tt.name, err)
			}
		}
	})

	t.Run("ScreenSize, Move and CursorPosition", func(t *testing.T) {
		size, err := c.ScreenSize(ctx, sb.ID)
		if err != nil || size != (client.Resolution{Width: 800, Height: 600}) {
			t.Errorf("ScreenSize = %v, %v; want 800x600", size, err)
		}
		if err := c.Move(ctx, sb.ID, 123, 45); err != nil {
			t.Fatal(err)
		}
		if p, err := c.CursorPosition(ctx, sb.ID); err != nil || p != (client.Point{X: 123, Y: 45}) {
			t.Errorf("CursorPosition after Move(123, 45) = %v, %v", p, err)
		}
		if err := c.Move(ctx, sb.ID, 800, 10); !client.IsInvalidArgument(err) {
			t.Errorf("Move off the screen: %v, want invalid_argument", err)
		}
	})

	t.Run("input reaches an application (xev)", func(t *testing.T) {
		name := "sdk-xev-" + sb.ID[:8]
		logPath := filepath.Join(dir, "xev.log")
		pid, err := c.ExecBackground(ctx, sb.ID, client.ExecRequest{
			Command: "exec xev -geometry 400x300+0+0 -name " + name + " > " + logPath,
			Env:     map[string]string{"LANG": "C.UTF-8"}, // xev prints text in the locale's charset
		})
		if err != nil || pid <= 0 {
			t.Fatalf("ExecBackground(xev): pid %d, %v", pid, err)
		}
		var win client.Window
		waitUntil(t, "xev's window among Windows()", func() bool {
			ws, err := c.Windows(ctx, sb.ID)
			if err != nil {
				t.Fatalf("Windows: %v", err)
			}
			i := slices.IndexFunc(ws, func(w client.Window) bool { return w.Title == name })
			if i >= 0 {
				win = ws[i]
			}
			return i >= 0
		})
		if win.Width != 400 || win.Height != 300 {
			t.Errorf("xev's window is %dx%d, want 400x300", win.Width, win.Height)
		}
		steps := []struct {
			what string
			do   func() error
		}{
			{"Click", func() error { return c.Click(ctx, sb.ID, 100, 100) }},
			{"Type", func() error { return c.Type(ctx, sb.ID, "hé ok") }},
			{"Key", func() error { return c.Key(ctx, sb.ID, "Return") }},
			{"Scroll", func() error { return c.Scroll(ctx, sb.ID, "down", 2) }},
			{"Drag", func() error { return c.Drag(ctx, sb.ID, client.Point{X: 50, Y: 50}, client.Point{X: 200, Y: 150}) }},
		}
		for _, s := range steps {
			if err := s.do(); err != nil {
				t.Fatalf("%s: %v", s.what, err)
			}
		}
		// Wait for all of it (or 15 s), then say what arrived.
		var ev xevLog
		poll(func() bool {
			ev = readXev(t, c, sb.ID, logPath)
			return ev.presses[1] >= 2 && ev.presses[5] >= 2 && strings.Contains(ev.keys, "Return")
		})
		if !strings.Contains(ev.keys, "Return") {
			t.Errorf("xev saw the keys %q, want Return among them", ev.keys)
		}
		if ev.presses[1] != 2 || ev.presses[5] != 2 {
			t.Errorf("xev saw button presses %v, want 2 of button 1 (Click, Drag) and 2 of button 5 (Scroll down 2)", ev.presses)
		}
		if ev.typed != "hé ok" {
			t.Errorf("xev saw the text %q, want %q", ev.typed, "hé ok")
		}
		if p, err := c.CursorPosition(ctx, sb.ID); err != nil || p != (client.Point{X: 200, Y: 150}) {
			t.Errorf("CursorPosition after the drag = %v, %v; want its end 200,150", p, err)
		}
	})

	t.Run("Actions", func(t *testing.T) {
		res, err := c.Actions(ctx, sb.ID,
			client.MoveTo(10, 20),
			client.WaitMS(10),
			client.Action{Type: client.ActionCursorPosition},
			client.Action{Type: client.ActionScreenSize},
			client.Action{Type: client.ActionScreenshot, Format: "png", Scale: 0.5},
		)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Results) != 5 {
			t.Fatalf("%d results for 5 actions: %+v", len(res.Results), res.Results)
		}
		if r := res.Results[2]; r.X != 10 || r.Y != 20 {
			t.Errorf("cursor_position after a move to 10,20: %d,%d", r.X, r.Y)
		}
		if r := res.Results[3]; r.Width != 800 || r.Height != 600 {
			t.Errorf("screen_size: %dx%d", r.Width, r.Height)
		}
		shot := res.Results[4]
		if w, h, f := decodeImage(t, shot.Data); w != 400 || h != 300 || f != "png" || shot.Width != 400 || shot.Height != 300 {
			t.Errorf("screenshot action: %dx%d %s (says %dx%d), want a 400x300 png", w, h, f, shot.Width, shot.Height)
		}
		// The first failing action stops the list and says which it was.
		_, err = c.Actions(ctx, sb.ID, client.MoveTo(1, 2), client.ClickAt(5000, 5000), client.MoveTo(3, 4))
		var ae *client.APIError
		if !client.IsInvalidArgument(err) || !asAPIError(err, &ae) || ae.Index == nil || *ae.Index != 1 {
			t.Errorf("actions with a click off the screen at index 1: %v, want invalid_argument at index 1", err)
		}
		if p, err := c.CursorPosition(ctx, sb.ID); err != nil || p != (client.Point{X: 1, Y: 2}) {
			t.Errorf("after the failed list the pointer is at %v (%v), want 1,2: the action before ran, the one after did not", p, err)
		}
		if _, err := c.Actions(ctx, sb.ID, client.Action{Type: "teleport"}); !client.IsInvalidArgument(err) {
			t.Errorf("an unknown action type: %v, want invalid_argument", err)
		}
		if err := c.Key(ctx, sb.ID, "ctrl+nosuchkey"); !client.IsInvalidArgument(err) {
			t.Errorf("an unknown key: %v, want invalid_argument", err)
		}
	})

	t.Run("ClipboardSet and ClipboardGet", func(t *testing.T) {
		if text, err := c.ClipboardGet(ctx, sb.ID); err != nil || text != "" {
			t.Errorf("ClipboardGet of a fresh desktop = %q, %v; want empty", text, err)
		}
		const text = "Grüße ✓ 東京\n😀"
		if err := c.ClipboardSet(ctx, sb.ID, text); err != nil {
			t.Fatal(err)
		}
		if got, err := c.ClipboardGet(ctx, sb.ID); err != nil || got != text {
			t.Errorf("ClipboardGet after ClipboardSet = %q, %v; want %q", got, err, text)
		}
		res, err := c.Actions(ctx, sb.ID, client.SetClipboard("in a list"), client.Action{Type: client.ActionClipboardGet})
		if err != nil || len(res.Results) != 2 || res.Results[1].Text != "in a list" {
			t.Errorf("set and get in one list: %+v, %v", res.Results, err)
		}
		for _, bad := range []string{"", "nul\x00", strings.Repeat("x", 64<<10+1)} {
			if err := c.ClipboardSet(ctx, sb.ID, bad); !client.IsInvalidArgument(err) {
				t.Errorf("ClipboardSet(%.20q): %v, want invalid_argument", bad, err)
			}
		}
		if got, err := c.ClipboardGet(ctx, sb.ID); err != nil || got != "in a list" {
			t.Errorf("after the refused sets the clipboard holds %q (%v), want what it held", got, err)
		}
	})

	t.Run("Exec", func(t *testing.T) {
		for _, tt := range []struct {
			name           string
			req            client.ExecRequest
			code           int
			stdout, stderr string
		}{
			{"shell, create's env, exit code", client.ExecRequest{Command: `echo "$SDK_GREETING"; echo oops >&2; exit 3`}, 3, "hello from create\n", "oops\n"},
			{"exact argv", client.ExecRequest{Argv: []string{"printf", "%s|", "a b", "c"}}, 0, "a b|c|", ""},
			{"stdin", client.ExecRequest{Command: "tr a-z A-Z", Stdin: "shout ✓"}, 0, "SHOUT ✓", ""},
			{"env and cwd", client.ExecRequest{Command: `echo "$X"; pwd`, Env: map[string]string{"X": "from exec"}, Cwd: dir}, 0, "from exec\n" + dir + "\n", ""},
			{"DISPLAY is the sandbox's", client.ExecRequest{Command: `xdpyinfo | sed -n 's/^  dimensions: *\([0-9x]*\) .*/\1/p'`}, 0, "800x600\n", ""},
		} {
			res, err := c.Exec(ctx, sb.ID, tt.req)
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
				continue
			}
			if res.ExitCode != tt.code || res.Stdout != tt.stdout || res.Stderr != tt.stderr {
				t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d, %q, %q", tt.name, res.ExitCode, res.Stdout, res.Stderr, tt.code, tt.stdout, tt.stderr)
			}
		}
		t0 := time.Now()
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "sleep 30", TimeoutSeconds: 1})
		if took := time.Since(t0); err != nil || res.ExitCode == 0 || !res.TimedOut || took > 15*time.Second {
			t.Errorf("sleep 30 with a 1 s timeout: %+v, %v after %v; want it killed after about 1 s, TimedOut", res, err, took)
		}
		if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "exit 3"}); err != nil || res.TimedOut {
			t.Errorf("exit 3: %+v, %v; want not TimedOut", res, err)
		}
		for _, tt := range []struct {
			name string
			req  client.ExecRequest
		}{
			{"neither command nor argv", client.ExecRequest{}},
			{"both command and argv", client.ExecRequest{Command: "true", Argv: []string{"true"}}},
			{"negative timeout", client.ExecRequest{Command: "true", TimeoutSeconds: -1}},
		} {
			if _, err := c.Exec(ctx, sb.ID, tt.req); !client.IsInvalidArgument(err) {
				t.Errorf("Exec with %s: %v, want invalid_argument", tt.name, err)
			}
		}
	})

	t.Run("ExecStream and ExecStreamTo", func(t *testing.T) {
		var events []client.ExecEvent
		code, err := c.ExecStream(ctx, sb.ID, client.ExecRequest{Command: "echo one; sleep 0.3; echo two >&2; exit 4"},
			func(e client.ExecEvent) error { events = append(events, e); return nil })
		if err != nil || code != 4 {
			t.Fatalf("ExecStream: exit %d, %v; want 4", code, err)
		}
		var order []string
		for _, e := range events {
			switch {
			case e.Stdout != "":
				order = append(order, "out:"+e.Stdout)
			case e.Stderr != "":
				order = append(order, "err:"+e.Stderr)
			case e.ExitCode != nil:
				order = append(order, "exit:"+strconv.Itoa(*e.ExitCode))
			}
		}
		if want := []string{"out:one\n", "err:two\n", "exit:4"}; !slices.Equal(order, want) {
			t.Errorf("ExecStream events %q, want %q: output as it comes, the exit code last", order, want)
		}
		var out, errOut bytes.Buffer
		code, err = c.ExecStreamTo(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "printf abc; printf xyz >&2"}}, &out, &errOut)
		if err != nil || code != 0 || out.String() != "abc" || errOut.String() != "xyz" {
			t.Errorf("ExecStreamTo: exit %d, %v, stdout %q, stderr %q", code, err, out.String(), errOut.String())
		}
	})

	t.Run("ExecBackground outlives the call", func(t *testing.T) {
		pid, err := c.ExecBackground(ctx, sb.ID, client.ExecRequest{Command: "sleep 300"})
		if err != nil || pid <= 0 {
			t.Fatalf("ExecBackground: %d, %v", pid, err)
		}
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "kill -0 " + strconv.Itoa(pid) + " && echo alive"})
		if err != nil || res.Stdout != "alive\n" {
			t.Errorf("the background process %d after ExecBackground returned: %+v, %v", pid, res, err)
		}
	})

	t.Run("Files", func(t *testing.T) {
		data := make([]byte, 300<<10)
		rand.Read(data)
		p := filepath.Join(dir, "up", "deep", "file.bin")
		fi, err := c.Upload(ctx, sb.ID, p, bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Path != p || fi.Size != int64(len(data)) {
			t.Errorf("Upload = %+v, want %s, %d bytes", fi, p, len(data))
		}
		rc, err := c.Download(ctx, sb.ID, p)
		if err != nil {
			t.Fatal(err)
		}
		back, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(back, data) {
			t.Errorf("Download: %d bytes (%v), want the %d uploaded", len(back), err, len(data))
		}
		// The sandbox's own shell sees the same file.
		if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"stat", "-c", "%s", p}}); err != nil || res.Stdout != strconv.Itoa(len(data))+"\n" {
			t.Errorf("stat in the sandbox: %+v, %v", res, err)
		}
		entries, err := c.ListFiles(ctx, sb.ID, filepath.Dir(p))
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name != "file.bin" || entries[0].Path != p || entries[0].Type != client.FileTypeFile ||
			entries[0].Size != int64(len(data)) || entries[0].ModifiedAt.IsZero() {
			t.Errorf("ListFiles = %+v, want just file.bin, a file of %d bytes", entries, len(data))
		}
		if entries, err := c.ListFiles(ctx, sb.ID, filepath.Join(dir, "up")); err != nil || len(entries) != 1 || entries[0].Type != client.FileTypeDir {
			t.Errorf("ListFiles of the parent = %+v, %v; want the directory deep", entries, err)
		}
		if err := c.RemoveFile(ctx, sb.ID, p); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Download(ctx, sb.ID, p); !client.IsNotFound(err) {
			t.Errorf("Download after RemoveFile: %v, want not_found", err)
		}
		if _, err := c.ListFiles(ctx, sb.ID, filepath.Join(dir, "nope")); !client.IsNotFound(err) {
			t.Errorf("ListFiles of a missing directory: %v, want not_found", err)
		}
		if _, err := c.Upload(ctx, sb.ID, "relative/path", strings.NewReader("x")); !client.IsInvalidArgument(err) {
			t.Errorf("Upload to a relative path: %v, want invalid_argument", err)
		}
	})

	t.Run("SetTimeout", func(t *testing.T) {
		got, err := c.SetTimeout(ctx, sb.ID, 120)
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(got.ExpiresAt); left < 110*time.Second || left > 121*time.Second {
			t.Errorf("after SetTimeout(120) the sandbox expires in %v", left)
		}
		if again, err := c.Get(ctx, sb.ID); err != nil || !again.ExpiresAt.Equal(got.ExpiresAt) {
			t.Errorf("Get after SetTimeout: expires %v (%v), want %v", again.ExpiresAt, err, got.ExpiresAt)
		}
		if _, err := c.SetTimeout(ctx, sb.ID, -5); !client.IsInvalidArgument(err) {
			t.Errorf("SetTimeout(-5): %v, want invalid_argument", err)
		}
	})

	t.Run("View", func(t *testing.T) {
		v, err := c.View(ctx, sb.ID, client.ViewRequest{TTLSeconds: 120, ViewOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(v.ExpiresAt); left < 110*time.Second || left > 121*time.Second || !v.ViewOnly {
			t.Errorf("View = %+v: want view-only, expiring in 120 s", v)
		}
		u, err := url.Parse(v.URL)
		if err != nil || u.Path != "/view/"+sb.ID || u.Query().Get("token") == "" || !strings.HasPrefix(v.URL, st.url) {
			t.Fatalf("View URL %q: want %s/view/%s?token=…", v.URL, st.url, sb.ID)
		}
		// The link opens the view without an API key; a changed token
		// does not.
		status, body := getJSON(t, v.URL)
		if status != http.StatusOK || body["sandbox_id"] != sb.ID || body["view_only"] != true {
			t.Errorf("GET the view URL: %d %v, want 200 for this sandbox, view only", status, body)
		}
		q := u.Query()
		tok := []byte(q.Get("token"))
		tok[len(tok)/2] ^= 1
		q.Set("token", string(tok))
		u.RawQuery = q.Encode()
		if status, body := getJSON(t, u.String()); status != http.StatusUnauthorized {
			t.Errorf("GET the view URL with a changed token: %d %v, want 401", status, body)
		}
	})

	var second client.Sandbox
	t.Run("Create WithoutWait", func(t *testing.T) {
		var err error
		second, err = c.Create(ctx, client.CreateRequest{Metadata: map[string]string{"suite": "sdk-real-api", "n": "2"}}, client.WithoutWait())
		if err != nil {
			t.Fatal(err)
		}
		if second.State != client.StateStarting {
			t.Errorf("Create WithoutWait: state %s, want starting", second.State)
		}
		waitUntil(t, "the second sandbox running", func() bool {
			got, err := c.Get(ctx, second.ID)
			if err != nil || got.State == client.StateFailed {
				t.Fatalf("Get: %+v, %v", got, err)
			}
			return got.State == client.StateRunning
		})
		// No resolution asked for: the daemon's 1024x768.
		b, err := c.Screenshot(ctx, second.ID, client.ScreenshotOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if w, h, _ := decodeImage(t, b); w != 1024 || h != 768 {
			t.Errorf("the second sandbox's screen is %dx%d, want the default 1024x768", w, h)
		}
	})

	t.Run("errors a user meets", func(t *testing.T) {
		wrongKey := client.New(st.url, client.WithAPIKey("not-the-key"))
		for _, tt := range []struct {
			name string
			err  error
			is   func(error) bool
			code string
		}{
			{"Create beyond capacity (2 running)", second1(c.Create(ctx, client.CreateRequest{})), client.IsCapacityExhausted, client.CodeCapacityExhausted},
			{"Create of an unknown template", second1(c.Create(ctx, client.CreateRequest{Template: "nosuchtemplate"})), client.IsInvalidArgument, client.CodeInvalidArgument},
			{"Create with a 5x5 screen", second1(c.Create(ctx, client.CreateRequest{Resolution: &client.Resolution{Width: 5, Height: 5}})), client.IsInvalidArgument, client.CodeInvalidArgument},
			{"Create on a backend the daemon lacks", second1(c.Create(ctx, client.CreateRequest{Backend: "firecracker"})), client.IsInvalidArgument, client.CodeInvalidArgument},
			{"Get of an unknown id", second1(c.Get(ctx, "nosuchsandbox0")), client.IsNotFound, client.CodeNotFound},
			{"Screenshot of an unknown id", second1(c.Screenshot(ctx, "nosuchsandbox0", client.ScreenshotOptions{})), client.IsNotFound, client.CodeNotFound},
			{"Info with a wrong key", second1(wrongKey.Info(ctx)), client.IsUnauthorized, client.CodeUnauthorized},
			{"List with a wrong key", second1(wrongKey.List(ctx, client.ListOptions{})), client.IsUnauthorized, client.CodeUnauthorized},
		} {
			if !tt.is(tt.err) || client.ErrorCode(tt.err) != tt.code {
				t.Errorf("%s: %v, want %s", tt.name, tt.err, tt.code)
			}
		}
	})

	t.Run("Volumes", func(t *testing.T) {
		needs.Command(t, "mkfs.ext4")
		v, err := c.CreateVolume(ctx, "sdk-vol", 64)
		if err != nil {
			t.Fatal(err)
		}
		if v.Name != "sdk-vol" || v.SizeMB != 64 || v.CreatedAt.IsZero() || v.AttachedTo != "" {
			t.Errorf("CreateVolume = %+v", v)
		}
		if _, err := c.CreateVolume(ctx, "sdk-vol", 64); !client.IsConflict(err) {
			t.Errorf("CreateVolume of a name in use: %v, want conflict", err)
		}
		if _, err := c.CreateVolume(ctx, "Bad Name", 64); !client.IsInvalidArgument(err) {
			t.Errorf("CreateVolume of a bad name: %v, want invalid_argument", err)
		}
		list, err := c.ListVolumes(ctx)
		if err != nil || len(list) != 1 || list[0].Name != "sdk-vol" {
			t.Errorf("ListVolumes = %+v, %v", list, err)
		}
		if got, err := c.GetVolume(ctx, "sdk-vol"); err != nil || got != v {
			t.Errorf("GetVolume = %+v, %v; want %+v", got, err, v)
		}
		// The stack's backend cannot attach volumes: refused, and the
		// volume stays free.
		_, err = c.Create(ctx, client.CreateRequest{Volumes: []client.VolumeMount{{Name: "sdk-vol", Path: "/data"}}})
		if client.ErrorCode(err) != client.CodeNotSupported {
			t.Errorf("Create with a volume on a backend without volumes: %v, want not_supported", err)
		}
		if got, _ := c.GetVolume(ctx, "sdk-vol"); got.AttachedTo != "" {
			t.Errorf("a refused create left the volume attached to %s", got.AttachedTo)
		}
		if err := c.DeleteVolume(ctx, "sdk-vol"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetVolume(ctx, "sdk-vol"); !client.IsNotFound(err) {
			t.Errorf("GetVolume after DeleteVolume: %v, want not_found", err)
		}
		if err := c.DeleteVolume(ctx, "sdk-vol"); !client.IsNotFound(err) {
			t.Errorf("a second DeleteVolume: %v, want not_found", err)
		}
	})

	// Snapshots that the stack's backend cannot take: refused as such,
	// with nothing made. (qemu's real ones: test/e2e TestSnapshot.)
	t.Run("Snapshots", func(t *testing.T) {
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range info.Backends {
			if b.Name == "fake" && (b.Capabilities.Snapshot || b.Capabilities.SnapshotReason == "") {
				t.Errorf("Info: fake backend capabilities %+v, want no snapshots and why", b.Capabilities)
			}
		}
		if _, err := c.CreateSnapshot(ctx, second.ID, client.SnapshotOptions{Name: "sdk-snap"}); !client.IsNotSupported(err) {
			t.Errorf("CreateSnapshot on a backend without snapshots: %v, want not_supported", err)
		}
		if _, err := c.CreateSnapshot(ctx, second.ID, client.SnapshotOptions{Name: "Bad Name"}); !client.IsInvalidArgument(err) {
			t.Errorf("CreateSnapshot with a bad name: %v, want invalid_argument", err)
		}
		if _, err := c.CreateSnapshot(ctx, "nope", client.SnapshotOptions{}); !client.IsNotFound(err) {
			t.Errorf("CreateSnapshot of an unknown sandbox: %v, want not_found", err)
		}
		if list, err := c.ListSnapshots(ctx, ""); err != nil || len(list) != 0 {
			t.Errorf("ListSnapshots = %+v, %v; want none", list, err)
		}
		if list, err := c.ListSnapshots(ctx, second.ID); err != nil || len(list) != 0 {
			t.Errorf("ListSnapshots of a sandbox = %+v, %v; want none", list, err)
		}
		if _, err := c.GetSnapshot(ctx, "sdk-snap"); !client.IsNotFound(err) {
			t.Errorf("GetSnapshot of none: %v, want not_found", err)
		}
		if err := c.DeleteSnapshot(ctx, "sdk-snap"); !client.IsNotFound(err) {
			t.Errorf("DeleteSnapshot of none: %v, want not_found", err)
		}
		if _, err := c.Create(ctx, client.CreateRequest{FromSnapshot: "sdk-snap"}); !client.IsNotFound(err) {
			t.Errorf("Create from no snapshot: %v, want not_found", err)
		}
	})

	t.Run("Destroy", func(t *testing.T) {
		box := st.drv.box(second.ID)
		if box == nil {
			t.Fatal("no box for the second sandbox")
		}
		if err := c.Destroy(ctx, second.ID); err != nil {
			t.Fatal(err)
		}
		// Destroy frees everything before it answers.
		if st.drv.box(second.ID) != nil {
			t.Error("the box still runs after Destroy returned")
		}
		select {
		case <-box.xdone:
		default:
			t.Error("the sandbox's X server still runs after Destroy returned")
		}
		got, err := c.Get(ctx, second.ID)
		if err != nil || got.State != client.StateStopped {
			t.Errorf("Get after Destroy: %+v, %v; want stopped", got, err)
		}
		if _, err := c.Screenshot(ctx, second.ID, client.ScreenshotOptions{}); !client.IsConflict(err) {
			t.Errorf("Screenshot of a stopped sandbox: %v, want conflict", err)
		}
		if _, err := c.Exec(ctx, second.ID, client.ExecRequest{Command: "true"}); !client.IsConflict(err) {
			t.Errorf("Exec in a stopped sandbox: %v, want conflict", err)
		}
		if err := c.Destroy(ctx, second.ID); err != nil {
			t.Errorf("a second Destroy: %v, want nil (destroying a stopped sandbox is a no-op)", err)
		}
		if err := c.Destroy(ctx, "nosuchsandbox0"); !client.IsNotFound(err) {
			t.Errorf("Destroy of an unknown id: %v, want not_found", err)
		}
		// The first sandbox goes too; its background processes with it.
		first := st.drv.box(sb.ID)
		if err := c.Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if first != nil {
			<-first.xdone
		}
		if info, err := c.Info(ctx); err != nil || info.Capacity.Running != 0 {
			t.Errorf("Info after destroying both: %+v, %v; want none running", info.Capacity, err)
		}
	})
}

// second1 keeps the error of a two-result call.
func second1[T any](_ T, err error) error { return err }

func asAPIError(err error, target **client.APIError) bool {
	ae, ok := err.(*client.APIError)
	if ok {
		*target = ae
	}
	return ok
}

// decodeImage decodes a PNG or JPEG and returns its size and format.
func decodeImage(t *testing.T, b []byte) (w, h int, format string) {
	t.Helper()
	var img image.Image
	var err error
	switch {
	case bytes.HasPrefix(b, []byte("\x89PNG")):
		format = "png"
		img, err = png.Decode(bytes.NewReader(b))
	case bytes.HasPrefix(b, []byte{0xff, 0xd8}):
		format = "jpeg"
		img, err = jpeg.Decode(bytes.NewReader(b))
	default:
		t.Errorf("not a PNG or JPEG: % x", b[:min(len(b), 8)])
		return 0, 0, ""
	}
	if err != nil {
		t.Errorf("decode %s: %v", format, err)
		return 0, 0, format
	}
	return img.Bounds().Dx(), img.Bounds().Dy(), format
}

// getJSON GETs u asking for JSON, without an API key.
func getJSON(t *testing.T, u string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// waitUntil polls cond for up to 15 s and fails t if it never holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// poll calls cond until it holds or 15 s have passed and reports whether
// it held.
func poll(cond func() bool) bool {
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// xevLog is what xev printed: button presses by button, the text of the
// key presses, and their keysym names.
type xevLog struct {
	presses map[int]int
	typed   string
	keys    string
}

var (
	xevButton = regexp.MustCompile(`button (\d+),`)
	xevKeysym = regexp.MustCompile(`\(keysym 0x[0-9a-f]+, ([^)]+)\)`)
	xevString = regexp.MustCompile(`XLookupString gives \d+ bytes: (?:\([0-9a-f ]+\) )?"(.*)"`)
)

// readXev downloads xev's output through the SDK and parses its events.
func readXev(t *testing.T, c *client.Client, id, path string) xevLog {
	t.Helper()
	rc, err := c.Download(context.Background(), id, path)
	if err != nil {
		t.Fatalf("Download %s: %v", path, err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	out := xevLog{presses: map[int]int{}}
	for _, block := range strings.Split(string(b), "\n\n") {
		block = strings.TrimSpace(block)
		switch {
		case strings.HasPrefix(block, "ButtonPress event"):
			if m := xevButton.FindStringSubmatch(block); m != nil {
				n, _ := strconv.Atoi(m[1])
				out.presses[n]++
			}
		case strings.HasPrefix(block, "KeyPress event"):
			if m := xevKeysym.FindStringSubmatch(block); m != nil {
				out.keys += m[1] + " "
			}
			if m := xevString.FindStringSubmatch(block); m != nil && m[1] != "\r" {
				out.typed += m[1]
			}
		}
	}
	return out
}
