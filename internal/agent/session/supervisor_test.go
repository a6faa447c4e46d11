package session

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/desktop"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// freeDisplay finds a display number with no lock and no socket.
func freeDisplay(t *testing.T) int {
	t.Helper()
	for n := 60 + os.Getpid()%100; n < 400; n++ {
		_, e1 := os.Stat(fmt.Sprintf("/tmp/.X%d-lock", n))
		_, e2 := os.Stat(fmt.Sprintf("/tmp/.X11-unix/X%d", n))
		if os.IsNotExist(e1) && os.IsNotExist(e2) {
			return n
		}
	}
	t.Fatal("no free X display")
	return 0
}

// sink records what the supervisor hands the desktop service.
type sink struct {
	mu    sync.Mutex
	calls []*desktop.Desktop
}

func (s *sink) SetDesktop(d *desktop.Desktop) {
	s.mu.Lock()
	s.calls = append(s.calls, d)
	s.mu.Unlock()
}

func (s *sink) snapshot() []*desktop.Desktop {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*desktop.Desktop(nil), s.calls...)
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", timeout, what)
}

func TestSupervisor(t *testing.T) {
	needs.Xvfb(t)
	needs.Root(t) // programs run as their configured user
	n := freeDisplay(t)
	// Not t.TempDir: its parent is 0700 and crashy runs as nobody.
	dir, err := os.MkdirTemp("", "cubicle-session-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	log := filepath.Join(dir, "runs")
	if err := os.WriteFile(log, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(log, 0o666); err != nil { // crashy runs as nobody
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// graceful checks, half a second into its shutdown, that the display
	// is still there: programs are stopped before Xvfb.
	termLog := filepath.Join(dir, "term")
	graceful := fmt.Sprintf(`trap 'sleep 0.5; if test -S /tmp/.X11-unix/X%d; then echo display-up; else echo display-gone; fi > %s; exit 0' TERM; while :; do sleep 0.1; done`, n, termLog)
	raw := map[string]any{
		"display": fmt.Sprintf(":%d", n),
		"xvfb":    []string{"Xvfb", "{display}", "-screen", "0", "{width}x{height}x24", "-dpi", "{dpi}", "-nolisten", "tcp"},
		"programs": []map[string]any{
			{"name": "crashy", "argv": []string{"/bin/sh", "-c", `echo "$DISPLAY $USER" >> ` + log + `; sleep 0.2; exit 1`}, "user": "nobody"},
			{"name": "sleeper", "argv": []string{"sleep", "600", "{start_url}"}},
			{"name": "graceful", "argv": []string{"/bin/sh", "-c", graceful}},
		},
	}
	if _, err := exec.LookPath("openbox"); err == nil {
		raw["programs"] = append(raw["programs"].([]map[string]any), map[string]any{"name": "wm", "argv": []string{"openbox"}})
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
	cfg = cfg.Expand(Vars{Width: 800, Height: 600, DPI: 96})

	r, err := reap.Start(reap.All, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	out, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	defer out.Close()
	var sk sink
	s, err := New(cfg, Options{Reaper: r, Desktop: &sk, Output: out, MinBackoff: 100 * time.Millisecond, Grace: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	stopped := false
	defer func() {
		if !stopped {
			_ = s.Stop(context.Background())
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Wait(ctx); err != nil {
		t.Fatalf("session not ready: %v", err)
	}
	calls := sk.snapshot()
	if len(calls) != 1 || calls[0] == nil {
		t.Fatalf("SetDesktop calls = %v, want one desktop", calls)
	}
	if w, h := calls[0].Size(); w != 800 || h != 600 {
		t.Errorf("screen %dx%d, want 800x600", w, h)
	}

	// The crashing program is restarted, with DISPLAY and its user.
	eventually(t, "three runs of crashy", 10*time.Second, func() bool {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "\n") >= 3
	})
	b, _ = os.ReadFile(log)
	if first := strings.SplitN(string(b), "\n", 2)[0]; first != fmt.Sprintf(":%d nobody", n) {
		t.Errorf("crashy saw %q, want DISPLAY and USER=nobody", first)
	}

	// Xvfb dies: the supervisor restarts it and reconnects.
	xpid := s.pidOf("xvfb")
	if xpid == 0 {
		t.Fatal("no xvfb child")
	}
	if err := syscall.Kill(xpid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a new desktop after Xvfb died", 20*time.Second, func() bool {
		c := sk.snapshot()
		return len(c) >= 3 && c[1] == nil && c[len(c)-1] != nil
	})
	if p := s.pidOf("xvfb"); p == 0 || p == xpid {
		t.Errorf("xvfb pid after restart = %d (was %d)", p, xpid)
	}

	stopCtx, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelStop()
	if err := s.Stop(stopCtx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	stopped = true
	if b, err := os.ReadFile(termLog); err != nil || string(b) != "display-up\n" {
		t.Errorf("a program's shutdown saw %q, %v; want the display still up (programs stop before Xvfb)", b, err)
	}
	s.mu.Lock()
	left := len(s.children)
	s.mu.Unlock()
	if left != 0 {
		t.Errorf("%d children left after Stop", left)
	}
	if c := sk.snapshot(); c[len(c)-1] != nil {
		t.Error("desktop not taken away after Stop")
	}
}

// pidOf returns the pid of the named running child, or 0.
func (s *Supervisor) pidOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid, n := range s.children {
		if n == name {
			return pid
		}
	}
	return 0
}

func TestStopBeforeReady(t *testing.T) {
	r, err := reap.Start(reap.All, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	cfg := Config{Display: ":399", Xvfb: []string{"/no/such/Xvfb"}}
	s, err := New(cfg, Options{Reaper: r, MinBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	eventually(t, "an error", 5*time.Second, func() bool { return s.Err() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Wait(ctx); err == nil || !strings.Contains(strings.ToLower(err.Error()), "xvfb") {
		t.Errorf("Wait = %v, want an Xvfb error", err)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Ready():
		t.Error("ready without Xvfb")
	default:
	}
}
