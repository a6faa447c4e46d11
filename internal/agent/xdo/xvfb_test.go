package xdo

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestParseXvfb(t *testing.T) {
	for _, tc := range []struct {
		args string
		want ScreenRequest
		ok   bool
	}{
		// What @e2b/desktop 2.4's _start runs.
		{":0 -ac -screen 0 1280x800x24 -retro -dpi 96 -nolisten tcp -nolisten unix", ScreenRequest{":0", 1280, 800, 96}, true},
		{":0 -ac -screen 0 1920x1080x24 -retro -dpi 144 -nolisten tcp -nolisten unix", ScreenRequest{":0", 1920, 1080, 144}, true},
		{":1 -screen 0 800x600", ScreenRequest{":1", 800, 600, 96}, true},
		{":0 -screen 0 1024x768x24 +extension RANDR -noreset", ScreenRequest{":0", 1024, 768, 96}, true},
		{"", ScreenRequest{}, false},
		{":0", ScreenRequest{}, false},                       // no screen
		{"-screen 0 1024x768x24", ScreenRequest{}, false},    // no display
		{":0 -screen 1 1024x768x24", ScreenRequest{}, false}, // another screen
		{":0 -screen 0 1024x768x16", ScreenRequest{}, false}, // another depth
		{":0 -screen 0 1024x768x24 -screen 0 1x1", ScreenRequest{}, false},
		{":0 -screen 0 axb", ScreenRequest{}, false},
		{":0 -screen 0 1024x768x24 -fbdir /tmp", ScreenRequest{}, false}, // unknown option
		{":0 -screen 0 1024x768x24 -dpi", ScreenRequest{}, false},
		{":0 -screen 0 1024x768x24 -dpi x", ScreenRequest{}, false},
		{":x -screen 0 1024x768x24", ScreenRequest{}, false},
		{":0 :1 -screen 0 1024x768x24", ScreenRequest{}, false},
	} {
		got, ok := ParseXvfb(strings.Fields(tc.args))
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%q: %+v, %v; want %+v, %v", tc.args, got, ok, tc.want, tc.ok)
		}
	}
}

func TestResizeRequest(t *testing.T) {
	args := strings.Fields(":0 -screen 0 1280x800x24 -dpi 96")
	if _, ok := resizeRequest(args, func(string) string { return "" }); !ok {
		t.Error("the SDK's Xvfb: no resize asked")
	}
	session := func(k string) string {
		if k == SessionXServerEnv {
			return "1"
		}
		return ""
	}
	if _, ok := resizeRequest(args, session); ok {
		t.Error("the session's own X server asked the agent to resize; it must run the real Xvfb")
	}
}

// resizer records the sizes asked for and answers err.
type resizer struct {
	mu    sync.Mutex
	asked []ScreenRequest
	err   error
}

func (r *resizer) Resize(_ context.Context, w, h, dpi int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, ScreenRequest{Width: w, Height: h, DPI: dpi})
	return r.err
}

func TestScreen(t *testing.T) {
	rs := &resizer{}
	path := filepath.Join(t.TempDir(), "input", "type.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(":0", &typer{}, &desk{}, rs, slog.New(slog.NewTextHandler(io.Discard, nil)))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()

	if err := SendScreen(ctx, path, ScreenRequest{":0", 1280, 800, 120}); err != nil {
		t.Fatal(err)
	}
	if len(rs.asked) != 1 || rs.asked[0] != (ScreenRequest{Width: 1280, Height: 800, DPI: 120}) {
		t.Errorf("asked %+v", rs.asked)
	}
	var se *statusError
	// Another display: 409, and the wrapper runs the real Xvfb.
	if err := SendScreen(ctx, path, ScreenRequest{":3", 1280, 800, 96}); !errors.As(err, &se) || se.code != http.StatusConflict {
		t.Errorf("display :3: %v, want a 409", err)
	}
	// The session refuses (a size out of range): the caller hears why.
	rs.err = errors.New("width 99999: want 16 to 16384")
	if err := SendScreen(ctx, path, ScreenRequest{":0", 99999, 800, 96}); !errors.As(err, &se) || se.code != http.StatusUnprocessableEntity || !strings.Contains(err.Error(), "16384") {
		t.Errorf("a refused size: %v, want a 422 with the reason", err)
	}
	// No session: 409.
	srv2 := &http.Server{Handler: Handler(":0", &typer{}, &desk{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))}
	path2 := filepath.Join(t.TempDir(), "s2.sock")
	ln2, err := Listen(path2)
	if err != nil {
		t.Fatal(err)
	}
	go srv2.Serve(ln2)
	t.Cleanup(func() { srv2.Close() })
	if err := SendScreen(ctx, path2, ScreenRequest{":0", 1280, 800, 96}); !errors.As(err, &se) || se.code != http.StatusConflict {
		t.Errorf("no session: %v, want a 409", err)
	}
}

func FuzzParseXvfb(f *testing.F) {
	for _, s := range []string{":0 -ac -screen 0 1280x800x24 -retro -dpi 96 -nolisten tcp -nolisten unix", ":1 -screen 0 1x1", "-dpi"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		req, ok := ParseXvfb(strings.Split(s, " "))
		if ok && (!strings.HasPrefix(req.Display, ":") || req.DPI == 0 && !strings.Contains(s, "-dpi")) {
			t.Fatalf("%q: %+v", s, req)
		}
	})
}
