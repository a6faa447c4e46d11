package reap

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func spawn(t *testing.T, r *Reaper, argv ...string) (int, <-chan Status) {
	t.Helper()
	pid, ch, err := r.Spawn(func() (int, error) {
		return syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Env: []string{"PATH=/usr/bin:/bin"}, Files: []uintptr{0, 1, 2}})
	})
	if err != nil {
		t.Fatal(err)
	}
	return pid, ch
}

func wait(t *testing.T, ch <-chan Status) Status {
	t.Helper()
	select {
	case st := <-ch:
		return st
	case <-time.After(10 * time.Second):
		t.Fatal("no status within 10s")
		return Status{}
	}
}

func TestStatus(t *testing.T) {
	for _, mode := range []Mode{All, Own} {
		r, err := Start(mode, nil)
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			argv       []string
			wantCode   int
			wantExited bool
			wantString string
		}{
			{[]string{"/bin/sh", "-c", "exit 0"}, 0, true, "exit status 0"},
			{[]string{"/bin/sh", "-c", "exit 7"}, 7, true, "exit status 7"},
			{[]string{"/bin/sh", "-c", "kill -TERM $$"}, -1, false, "signal: terminated"},
		}
		for _, tt := range tests {
			_, ch := spawn(t, r, tt.argv...)
			st := wait(t, ch)
			if st.ExitCode() != tt.wantCode || st.Exited() != tt.wantExited || st.String() != tt.wantString {
				t.Errorf("mode %d %v: got code %d exited %v %q, want %d %v %q", mode, tt.argv,
					st.ExitCode(), st.Exited(), st.String(), tt.wantCode, tt.wantExited, tt.wantString)
			}
		}
		r.Stop()
		r.Stop() // idempotent
	}
}

// TestOrphans checks that a grandchild orphaned by its parent is reaped
// (the agent is PID 1; here it is a child subreaper).
func TestOrphans(t *testing.T) {
	r, err := Start(All, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	_, ch := spawn(t, r, "/bin/sh", "-c", "sleep 0.3 & exit 0")
	wait(t, ch)
	time.Sleep(100 * time.Millisecond)
	if len(children(t)) == 0 {
		t.Fatal("the orphaned sleep was not re-parented to us")
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if len(children(t)) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("children left (zombies?): %v", children(t))
}

// children lists our child processes as "pid state".
func children(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := strconv.Itoa(os.Getpid())
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == me {
			out = append(out, e.Name()+" "+f[0])
		}
	}
	return out
}

// TestSpawnDuringOrphanStorm: children that end as fast as they are
// reaped (a fork bomb's orphans, here a fake wait4 that never runs out)
// must not keep Spawn, and so every exec, waiting, nor Stop.
func TestSpawnDuringOrphanStorm(t *testing.T) {
	var storm atomic.Bool
	storm.Store(true)
	t.Cleanup(func() { storm.Store(false) })
	var next atomic.Int64
	next.Store(1 << 22) // above any pid Spawn is given below
	r := &Reaper{mode: All, log: slog.New(slog.DiscardHandler), waiters: make(map[int]chan Status), stop: make(chan struct{}),
		waitAny: func(ws *syscall.WaitStatus) (int, error) {
			if !storm.Load() {
				return 0, nil
			}
			*ws = 0 // exit status 0
			return int(next.Add(1)), nil
		}}
	reaped := make(chan struct{})
	go func() { r.reap(); close(reaped) }()
	for next.Load() < 1<<22+1000 { // the storm is under way
		time.Sleep(time.Millisecond)
	}
	spawned := make(chan error, 1)
	go func() {
		_, _, err := r.Spawn(func() (int, error) { return 42, nil })
		spawned <- err
	}()
	select {
	case err := <-spawned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Spawn still waits for the reaper after 5 s of orphans")
	}
	close(r.stop)
	select {
	case <-reaped:
	case <-time.After(5 * time.Second):
		t.Fatal("the reaper did not stop during the storm")
	}
}
