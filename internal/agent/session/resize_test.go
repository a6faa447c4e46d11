package session

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

func TestResizeArgv(t *testing.T) {
	for _, tc := range []struct {
		in, want string // "" want: an error
	}{
		{"Xvfb :0 -screen 0 1024x768x24 -dpi 96 -nolisten tcp", "Xvfb :0 -screen 0 1280x800x24 -dpi 120 -nolisten tcp"},
		{"Xvfb :0 -screen 0 1024x768 -ac", "Xvfb :0 -screen 0 1280x800 -ac -dpi 120"},
		{"Xvfb :0 -ac", ""},
		{"Xvfb :0 -screen 0 big", ""},
		{"Xvfb :0 -screen 0", ""},
	} {
		got, err := resizeArgv(strings.Fields(tc.in), 1280, 800, 120)
		if (err != nil) != (tc.want == "") || strings.Join(got, " ") != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestResize resizes a running session's real Xvfb: the display comes
// back at the new size and DPI, and the programs run again with the new
// CUBICLE_WIDTH, CUBICLE_HEIGHT and CUBICLE_DPI.
func TestResize(t *testing.T) {
	needs.Xvfb(t)
	needs.Root(t)
	needs.Command(t, "xdpyinfo", "xprop")
	n := freeDisplay(t)
	dir, err := os.MkdirTemp("", "cubicle-resize-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	seen := filepath.Join(dir, "seen")
	raw := map[string]any{
		"display": fmt.Sprintf(":%d", n),
		"xvfb":    []string{"Xvfb", "{display}", "-screen", "0", "{width}x{height}x24", "-dpi", "{dpi}", "-nolisten", "tcp"},
		"programs": []map[string]any{
			// An X client (xprop -spy keeps its connection): it ends with
			// the display, as a browser does.
			{"name": "client", "argv": []string{"/bin/sh", "-c",
				`echo "$CUBICLE_WIDTH $CUBICLE_HEIGHT $CUBICLE_DPI" >> ` + seen + `; exec xprop -root -spy >/dev/null`}},
		},
	}
	b, _ := json.Marshal(raw)
	path := filepath.Join(dir, "session.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := reap.Start(reap.All, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	out, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	defer out.Close()
	var sk sink
	s, err := New(cfg.Expand(Vars{Width: 640, Height: 480, DPI: 96}), Options{Reaper: r, Desktop: &sk, Output: out,
		Env: []string{"CUBICLE_WIDTH=640", "CUBICLE_HEIGHT=480", "CUBICLE_DPI=96"}, MinBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Stop(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Wait(ctx); err != nil {
		t.Fatalf("session not ready: %v", err)
	}
	before := s.pidOf(xvfbName)
	eventually(t, "the program's first start", 15*time.Second, func() bool {
		b, _ := os.ReadFile(seen)
		return len(b) > 0
	})

	if err := s.Resize(ctx, 640, 480, 96); err != nil || s.pidOf(xvfbName) != before {
		t.Fatalf("resize to the same geometry: %v; xvfb %d → %d, want it left alone", err, before, s.pidOf(xvfbName))
	}
	if err := s.Resize(ctx, 1280, 800, 120); err != nil {
		t.Fatalf("resize: %v", err)
	}
	c := sk.snapshot()
	if w, h := c[len(c)-1].Size(); w != 1280 || h != 800 {
		t.Errorf("desktop after resize %dx%d, want 1280x800", w, h)
	}
	info, err := exec.Command("xdpyinfo", "-display", fmt.Sprintf(":%d", n)).Output()
	if err != nil || !strings.Contains(string(info), "1280x800 pixels") || !strings.Contains(string(info), "120x120 dots per inch") {
		t.Errorf("xdpyinfo after resize (%v):\n%s\nwant 1280x800 pixels at 120 dpi", err, info)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(seen)
			t.Logf("the program saw:\n%s", b)
		}
	})
	eventually(t, "the program started again with the new geometry", 15*time.Second, func() bool {
		b, _ := os.ReadFile(seen)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for _, l := range lines {
			if l != "640 480 96" && l != "1280 800 120" {
				t.Fatalf("a program saw geometry %q", l)
			}
		}
		return lines[0] == "640 480 96" && lines[len(lines)-1] == "1280 800 120"
	})
	// A new DPI alone restarts the X server too, and Resize waits for it.
	xpid := s.pidOf(xvfbName)
	if err := s.Resize(ctx, 1280, 800, 144); err != nil {
		t.Fatalf("resize to 144 dpi: %v", err)
	}
	if p := s.pidOf(xvfbName); p == xpid || p == 0 {
		t.Errorf("xvfb %d → %d after a DPI change, want a new one", xpid, p)
	}
	info, err = exec.Command("xdpyinfo", "-display", fmt.Sprintf(":%d", n)).Output()
	if err != nil || !strings.Contains(string(info), "144x144 dots per inch") {
		t.Errorf("xdpyinfo right after a DPI-only resize returned (%v):\n%s\nwant 144 dpi", err, info)
	}
	for _, bad := range [][3]int{{0, 800, 96}, {1280, 99999, 96}, {1280, 800, 5}} {
		if err := s.Resize(ctx, bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("resize to %v: no error", bad)
		}
	}
	if c := sk.snapshot(); len(c) > 0 {
		if w, _ := c[len(c)-1].Size(); w != 1280 {
			t.Errorf("a refused resize changed the display to width %d", w)
		}
	}
}
