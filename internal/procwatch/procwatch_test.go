package procwatch

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

func TestParseStat(t *testing.T) {
	tail := " S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 20 21"
	for _, c := range []struct {
		stat string
		want uint64
		ok   bool
	}{
		{"12 (sleep)" + tail, 4242, true},
		// A process names itself: ")" and spaces in the name must not
		// shift the fields.
		{"12 (a) S 9 (b)" + tail, 4242, true},
		{"12 (x y z)" + tail, 4242, true},
		{"12 (zombie) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242", 0, false},
		{"12 (dead) X 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242", 0, false},
		{"12 (short) S 1 2", 0, false},
		{"no parenthesis", 0, false},
		{"12 (bad) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 notanumber", 0, false},
	} {
		got, ok := parseStat([]byte(c.stat))
		if got != c.want || ok != c.ok {
			t.Errorf("parseStat(%q) = %d, %v; want %d, %v", c.stat, got, ok, c.want, c.ok)
		}
	}
}

// child starts `sleep 60` and returns it; the test reaps it.
func child(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func waitDead(t *testing.T, w *Watcher, within time.Duration) {
	t.Helper()
	select {
	case <-w.Dead():
	case <-time.After(within):
		t.Fatalf("Dead not closed within %s", within)
	}
}

func notDead(t *testing.T, w *Watcher, during time.Duration) {
	t.Helper()
	select {
	case <-w.Dead():
		t.Fatal("Dead closed while the process runs")
	case <-time.After(during):
	}
}

func TestWatchSeesTheEnd(t *testing.T) {
	cmd := child(t)
	p, err := Lookup(cmd.Process.Pid)
	if err != nil || !p.Alive() || p.StartTime == 0 {
		t.Fatalf("Lookup = %+v, %v", p, err)
	}
	w := Watch(p, Options{})
	defer w.Stop()
	notDead(t, w, 400*time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	// Not reaped yet: a zombie is an ended process.
	waitDead(t, w, 2*time.Second)
	<-w.Done()
	if p.Alive() {
		t.Error("Alive of a zombie")
	}
	cmd.Wait()
	if _, err := Lookup(cmd.Process.Pid); err == nil {
		t.Error("Lookup of a reaped pid succeeded")
	}
}

// TestWatchAnotherProcessWithThePid checks that a process is told from a
// later one given its pid: a recorded start time that does not match is a
// process that has ended.
func TestWatchAnotherProcessWithThePid(t *testing.T) {
	cmd := child(t)
	p, err := Lookup(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	old := Process{Pid: p.Pid, StartTime: p.StartTime - 1}
	if old.Alive() {
		t.Error("Alive with another start time")
	}
	w := Watch(old, Options{})
	defer w.Stop()
	waitDead(t, w, time.Second)
}

func TestWatchStop(t *testing.T) {
	cmd := child(t)
	p, _ := Lookup(cmd.Process.Pid)
	var ticks atomic.Int32
	w := Watch(p, Options{Every: func() { ticks.Add(1) }, Interval: 100 * time.Millisecond})
	time.Sleep(1500 * time.Millisecond)
	w.Stop()
	w.Stop() // twice is fine
	select {
	case <-w.Done():
	default:
		t.Error("Done not closed after Stop")
	}
	if n := ticks.Load(); n < 1 {
		t.Errorf("Every never ran in 1.5 s at 100 ms")
	}
	select {
	case <-w.Dead():
		t.Error("Dead closed by Stop")
	default:
	}
}

func TestWatchExited(t *testing.T) {
	cmd := child(t)
	p, _ := Lookup(cmd.Process.Pid)
	exited := make(chan struct{})
	var ended, ticks atomic.Int32
	w := Watch(p, Options{Exited: exited, OnEnd: func() { ended.Add(1) }, Every: func() { ticks.Add(1) }, Interval: 100 * time.Millisecond})
	defer w.Stop()
	notDead(t, w, 1200*time.Millisecond)
	if ended.Load() != 0 {
		t.Error("OnEnd ran while the process runs")
	}
	if ticks.Load() == 0 {
		t.Error("Every never ran with Exited set")
	}
	close(exited)
	waitDead(t, w, time.Second)
	if n := ended.Load(); n != 1 {
		t.Errorf("OnEnd ran %d times, want once", n)
	}
}

// TestOnEndNotOnStop checks that stopping a watch is not taken for the
// process's end.
func TestOnEndNotOnStop(t *testing.T) {
	cmd := child(t)
	p, _ := Lookup(cmd.Process.Pid)
	var ended atomic.Int32
	w := Watch(p, Options{OnEnd: func() { ended.Add(1) }})
	time.Sleep(100 * time.Millisecond)
	done := make(chan struct{})
	go func() { w.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Stop of a running process's watch hangs")
	}
	if n := ended.Load(); n != 0 {
		t.Errorf("OnEnd ran %d times on Stop, want 0", n)
	}
}

func TestWatchGone(t *testing.T) {
	cmd := child(t)
	pid := cmd.Process.Pid
	cmd.Process.Kill()
	cmd.Wait()
	w := Watch(Process{Pid: pid}, Options{})
	defer w.Stop()
	waitDead(t, w, time.Second)
}

// blocker starts a shell, as uid, with marker among its arguments, that
// waits in its own read on a pipe the test holds open until it ends. A
// `sleep` would be forked, and the forked shell has the same arguments
// until it has exec'd sleep: on a loaded machine Find saw three
// processes where two were started (CI).
func blocker(t *testing.T, marker string, uid uint32) *exec.Cmd {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command("sh", "-c", "read x", marker)
	cmd.Stdin = r
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// TestFind checks that a process is found by its arguments while it lives,
// and not once it has ended (a zombie included).
func TestFind(t *testing.T) {
	marker := fmt.Sprintf("cubicle-find-%d", time.Now().UnixNano())
	byMarker := func(argv []string) bool { return slices.Contains(argv, marker) }
	cmd := blocker(t, marker, 0)
	ps, err := Find(byMarker)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].Pid != cmd.Process.Pid || !ps[0].Alive() {
		t.Fatalf("Find = %+v, want the one process %d", ps, cmd.Process.Pid)
	}
	cmd.Process.Kill()
	deadline := time.Now().Add(2 * time.Second)
	for {
		ps, err = Find(byMarker)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Find after kill = %+v, want none", ps)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFindOwn checks that a process of another user is found by Find and
// left out by FindOwn, and that RealUID reads both users right.
func TestFindOwn(t *testing.T) {
	needs.Root(t) // to start a process as another user
	marker := fmt.Sprintf("cubicle-findown-%d", time.Now().UnixNano())
	byMarker := func(argv []string) bool { return slices.Contains(argv, marker) }
	var cmds []*exec.Cmd
	for _, uid := range []uint32{0, 65534} {
		cmds = append(cmds, blocker(t, marker, uid))
	}
	all, err := Find(byMarker)
	if err != nil || len(all) != 2 {
		t.Fatalf("Find = %+v, %v; want both", all, err)
	}
	for i, want := range []int{0, 65534} {
		p, _ := Lookup(cmds[i].Process.Pid)
		if uid, err := p.RealUID(); err != nil || uid != want {
			t.Errorf("RealUID of pid %d = %d, %v; want %d", p.Pid, uid, err, want)
		}
	}
	own, err := FindOwn(byMarker)
	if err != nil || len(own) != 1 || own[0].Pid != cmds[0].Process.Pid {
		t.Errorf("FindOwn = %+v, %v; want only pid %d", own, err, cmds[0].Process.Pid)
	}
}
