package oci_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/drivertest"
	"github.com/cubicle-dev/cubicle/internal/driver/oci"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// TestPauseFailureLeavesTheBoxRunning makes a gVisor box's checkpoint fail
// midway, three ways: the state directory (a tmpfs here) has 4 MiB left
// when the pause starts, so the image cannot be written; it has not a
// block left, so nothing the pause writes there fits (the soak's "data dir
// full": when the runtime kept its records there, its state file was cut
// short, and no runsc call could reach or end the box after); and the
// `runsc checkpoint` process is killed once its image has begun. Either way the pause
// must answer an error and the box run on as it was: its Wait open, a
// process that counts alive and counting on from where it was, a file in
// memory (/dev/shm) intact, no image left behind, and a pause that then
// has room succeeds. Debian's runsc (20221219), and the pinned one without
// --leave-running, ended the box both ways.
func TestPauseFailureLeavesTheBoxRunning(t *testing.T) {
	needs.Root(t)
	needs.Runtime(t, "runsc")
	agent := drivertest.AgentBinary(t)
	image := drivertest.DesktopImage(t, false)
	for _, tc := range []struct {
		name string
		full bool  // the state directory is full when the pause starts
		left int64 // what is left free on it then
		kill bool  // the checkpoint process is killed
	}{
		{name: "disk full", full: true, left: 4 << 20},
		{name: "no block left", full: true},
		{name: "checkpoint killed", kill: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			state := filepath.Join(t.TempDir(), "st")
			if err := os.MkdirAll(state, 0o700); err != nil {
				t.Fatal(err)
			}
			if tc.full {
				if err := unix.Mount("cubicle-pausefail", state, "tmpfs", 0, "size=512m,mode=0700"); err != nil {
					t.Fatalf("tmpfs: %v", err)
				}
				t.Cleanup(func() {
					if err := unix.Unmount(state, unix.MNT_DETACH); err != nil {
						t.Errorf("unmount %s: %v", state, err)
					}
				})
			}
			d := oci.New(oci.Config{Runtime: "runsc", StateDir: state, AgentBinary: agent})
			if err := d.Available(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := d.Cleanup(context.Background(), nil); err != nil {
					t.Errorf("final Cleanup: %v", err)
				}
			})
			id, token := "tpf"+nonce(t, 6), nonce(t, 16)
			b, err := d.Create(ctx, driver.Spec{ID: id, Shape: driver.Shape{Image: image},
				Session: driver.Session{Token: token, Width: 800, Height: 600, DPI: 96, StartURL: "about:blank"}})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop(context.Background())
			c := agentclient.New(b.DialAgent, token)
			defer func() { c.Close() }()
			run := func(cmd string) string {
				t.Helper()
				res, err := c.Exec(ctx, agentclient.ExecRequest{Command: cmd}, nil)
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("exec %q: %+v, %v", cmd, res, err)
				}
				return strings.TrimSpace(string(res.Stdout))
			}
			counter, err := c.Background(ctx, agentclient.ExecRequest{Command: `i=0; while :; do i=$((i+1)); echo $i > /tmp/count.part; mv /tmp/count.part /tmp/count; sleep 0.2; done`})
			if err != nil {
				t.Fatal(err)
			}
			run("printf %s " + token + " > /dev/shm/pausefail")
			count := func() int {
				t.Helper()
				n, _ := strconv.Atoi(run("cat /tmp/count 2>/dev/null || echo 0"))
				return n
			}
			for count() < 3 {
				time.Sleep(200 * time.Millisecond)
			}

			var filler string
			if tc.full {
				filler = filepath.Join(state, "filler")
				fill(t, filler, state, tc.left)
			}
			stopGreedy := func() {}
			if tc.full && tc.left == 0 {
				// Others write to the full disk too (the soak's other
				// boxes): whatever a file rewritten in place frees for a
				// moment is taken before it is written again.
				greedy, stop := filepath.Join(state, "greedy"), make(chan struct{})
				done := make(chan struct{})
				go func() { defer close(done); takeFreed(greedy, stop) }()
				stopGreedy = func() { close(stop); <-done; os.Remove(greedy) }
				defer func() { stopGreedy() }()
			}
			killed := make(chan int, 1)
			if tc.kill {
				go func() { killed <- killCheckpoint(ctx, id, filepath.Join(state, id, "checkpoint")) }()
			}
			before := count()
			_, err = d.Pause(ctx, b)
			if err == nil {
				t.Fatalf("the pause succeeded; the test meant it to fail")
			}
			if !strings.Contains(err.Error(), "runsc checkpoint") {
				t.Fatalf("the pause failed before its checkpoint, not in it: %v", err)
			}
			t.Logf("the pause failed, as meant: %v", err)
			if tc.kill {
				if pid := <-killed; pid == 0 {
					t.Errorf("no runsc checkpoint process of %s was seen to kill", id)
				}
			}
			select {
			case <-b.Wait():
				t.Fatalf("the failed pause ended the box")
			default:
			}
			c.Close()
			c = agentclient.New(b.DialAgent, token)
			if got := run("kill -0 " + strconv.Itoa(int(counter)) + " && echo alive"); got != "alive" {
				t.Errorf("the counting process is gone after the failed pause")
			}
			if got := run("cat /dev/shm/pausefail"); got != token {
				t.Errorf("/dev/shm/pausefail holds %q after the failed pause, want %q", got, token)
			}
			after := count()
			if after < before {
				t.Errorf("the count was %d before the failed pause and %d after: it started over", before, after)
			}
			deadline := time.Now().Add(30 * time.Second)
			for count() <= after && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			if n := count(); n <= after {
				t.Errorf("the count stands at %d after the failed pause: its process does not run", n)
			}
			if _, err := os.Stat(filepath.Join(state, id, "checkpoint")); !os.IsNotExist(err) {
				t.Errorf("the failed pause left its image directory (%v)", err)
			}

			// With room again, the box pauses and resumes.
			stopGreedy()
			stopGreedy = func() {}
			if filler != "" {
				os.Remove(filler)
			}
			c.Close()
			paused, err := d.Pause(ctx, b)
			if err != nil {
				t.Fatalf("a pause with room, after the failed one: %v", err)
			}
			nb, err := d.Resume(ctx, paused)
			if err != nil {
				t.Fatalf("resume: %v", err)
			}
			defer nb.Stop(context.Background())
			c = agentclient.New(nb.DialAgent, token)
			if got := run("kill -0 " + strconv.Itoa(int(counter)) + " && cat /dev/shm/pausefail"); got != token {
				t.Errorf("after the pause and resume: %q, want the counter alive and %q", got, token)
			}
		})
	}
}

// fill writes file until dir's filesystem has about left bytes free
// (none at all for 0: until a write finds no room).
func fill(t *testing.T, file, dir string, left int64) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	if free <= left {
		return
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n := free - left; n > 0 || left == 0; n -= int64(len(buf)) {
		chunk := buf
		if n > 0 && n < int64(len(buf)) {
			chunk = buf[:n]
		}
		if _, err := f.Write(chunk); err != nil {
			if left == 0 && errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatalf("fill %s: %v", file, err)
		}
	}
}

// takeFreed appends to file every block that comes free on its full
// filesystem, until stop is closed.
func takeFreed(file string, stop <-chan struct{}) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	block := make([]byte, 4096)
	for {
		select {
		case <-stop:
			return
		default:
		}
		f.Write(block) // no room is the usual answer: try again at once
	}
}

// killCheckpoint kills the `runsc checkpoint` of container id once the
// save is under way (a file of its image in dir has bytes) and answers
// its pid, or 0 when it saw none (ctx bounds the wait).
func killCheckpoint(ctx context.Context, id, dir string) int {
	for ctx.Err() == nil {
		ps, _ := procwatch.FindOwn(func(argv []string) bool {
			return slices.Contains(argv, "checkpoint") && slices.Contains(argv, id)
		})
		if len(ps) > 0 && imageBytes(dir) > 0 {
			syscall.Kill(ps[0].Pid, syscall.SIGKILL)
			return ps[0].Pid
		}
		time.Sleep(2 * time.Millisecond)
	}
	return 0
}

// imageBytes is how much the files directly in dir hold.
func imageBytes(dir string) int64 {
	es, _ := os.ReadDir(dir)
	var n int64
	for _, e := range es {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

func nonce(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}
