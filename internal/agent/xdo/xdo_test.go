package xdo

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/action"
)

func TestParseType(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		text  string
		delay int
		ok    bool
	}{
		{[]string{"type", "--delay", "75", "--", "héllo ✓"}, "héllo ✓", 75, true},
		{[]string{"type", "hello"}, "hello", 12, true},
		{[]string{"type", "-d", "0", "a", "b c"}, "ab c", 0, true},
		{[]string{"type", "--delay=5", "--", "--not-an-option"}, "--not-an-option", 5, true},
		{[]string{"type", "--", "-"}, "-", 12, true},
		{[]string{"type", "line\nnext"}, "line\nnext", 12, true},
		// What the agent would not do exactly as xdotool: left to xdotool.
		{args: []string{"type", "--window", "123", "x"}},
		{args: []string{"type", "--clearmodifiers", "x"}},
		{args: []string{"type", "--file", "/tmp/x"}},
		{args: []string{"type", "--delay", "-1", "x"}},
		{args: []string{"type", "--delay", "1001", "x"}},
		{args: []string{"type", "--delay", "ms", "x"}},
		{args: []string{"type", "--delay"}},
		{args: []string{"type", "--", ""}},
		{args: []string{"type"}},
		{args: []string{"type", "--"}},
		{args: []string{"type", "bad \xff utf-8"}},
		{args: []string{"type", "bell \a"}},
		{args: []string{"key", "ctrl+a"}},
		{args: nil},
	} {
		text, delay, ok := ParseType(tc.args)
		if ok != tc.ok || text != tc.text || delay != tc.delay {
			t.Errorf("ParseType(%q) = %q, %d, %v; want %q, %d, %v", tc.args, text, delay, ok, tc.text, tc.delay, tc.ok)
		}
	}
}

func FuzzParseType(f *testing.F) {
	f.Add("type\x00--delay\x0075\x00--\x00héllo ✓")
	f.Add("type\x00-d\x000\x00a")
	f.Add("type\x00--window\x001\x00x")
	f.Fuzz(func(t *testing.T, joined string) {
		text, delay, ok := ParseType(strings.Split(joined, "\x00"))
		if !ok {
			return
		}
		if text == "" || delay < 0 || delay > action.MaxDelayMS || len(text) > action.MaxTextBytes {
			t.Fatalf("accepted %q delay %d", text, delay)
		}
		for _, r := range text {
			if _, typable := action.RuneKeysym(r); !typable {
				t.Fatalf("accepted untypable %U", r)
			}
		}
	})
}

func TestSameDisplay(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{":0", ":0", true},
		{":0.0", ":0", true},
		{"unix:0", ":0", true},
		{":1", ":0", false},
		{":10", ":1", false},
		{":0.1", ":0", false},
		{"otherhost:0", ":0", false},
		{"", ":0", false},
		{"", "", false},
	} {
		if got := SameDisplay(tc.a, tc.b); got != tc.same {
			t.Errorf("SameDisplay(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

// typer records what it was asked to type and answers err.
type typer struct {
	mu    sync.Mutex
	typed []string
	delay int
	err   error
}

func (f *typer) Type(_ context.Context, text string, delayMS int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.typed = append(f.typed, text)
	f.delay = delayMS
	return nil
}

// serve runs Handler for display :0 on a real unix socket made by Listen,
// with a desktop that refuses every action.
func serve(t *testing.T, ty Typer) string {
	return serveDesktop(t, ty, &desk{})
}

// serveDesktop is serve with d as the desktop /act drives.
func serveDesktop(t *testing.T, ty Typer, d *desk) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "input", "type.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o666 {
		t.Errorf("socket mode = %v, %v; want 0666 so every user of the sandbox can connect", fi.Mode(), err)
	}
	srv := &http.Server{Handler: Handler(":0", ty, d, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return path
}

func TestSend(t *testing.T) {
	ctx := context.Background()
	ty := &typer{}
	path := serve(t, ty)

	if err := Send(ctx, path, Request{Display: ":0.0", Text: "héllo ✓", DelayMS: 75}); err != nil {
		t.Fatalf("send: %v", err)
	}
	if len(ty.typed) != 1 || ty.typed[0] != "héllo ✓" || ty.delay != 75 {
		t.Errorf("typed %q with delay %d", ty.typed, ty.delay)
	}

	// Another display is not the agent's: an error the wrapper falls back on.
	var ref *refusal
	err := Send(ctx, path, Request{Display: ":1", Text: "x"})
	if err == nil || errors.As(err, &ref) || !strings.Contains(err.Error(), "409") || !errors.Is(err, errNotRun) {
		t.Errorf("send for :1 = %v, want a 409 that is not a refusal", err)
	}

	// A request the desktop rejects is a refusal: no second attempt.
	ty.err = &action.Error{Msg: "the character U+0007 cannot be typed"}
	err = Send(ctx, path, Request{Display: ":0", Text: "x"})
	if !errors.As(err, &ref) || !strings.Contains(ref.msg, "cannot be typed") {
		t.Errorf("send with a bad character = %v, want a refusal", err)
	}

	// No desktop yet: fall back.
	ty.err = errors.New("the X display is not up yet")
	err = Send(ctx, path, Request{Display: ":0", Text: "x"})
	if err == nil || errors.As(err, &ref) || !strings.Contains(err.Error(), "503") || !errors.Is(err, errNotRun) {
		t.Errorf("send without a desktop = %v, want a 503 that is not a refusal", err)
	}
	if len(ty.typed) != 1 {
		t.Errorf("typed %q, want only the first request", ty.typed)
	}

	// Nobody listening: fall back.
	err = Send(ctx, filepath.Join(t.TempDir(), "none.sock"), Request{Display: ":0", Text: "x"})
	if err == nil || errors.As(err, &ref) || !errors.Is(err, errNotRun) {
		t.Errorf("send to no agent = %v, want an error that is not a refusal, after which xdotool runs", err)
	}
}

func TestHandlerRejectsBadBodies(t *testing.T) {
	ty := &typer{}
	path := serve(t, ty)
	for _, body := range []string{
		`{"display":":0","text":"x","extra":1}`,
		`not json`,
		`{"display":":0","text":"` + strings.Repeat("a", maxBody) + `"}`,
	} {
		c := unixClient(path)
		resp, err := c.Post("http://agent/type", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("body %.40q: status %d, want 400", body, resp.StatusCode)
		}
	}
	if len(ty.typed) != 0 {
		t.Errorf("typed %q from bad bodies", ty.typed)
	}
}
