package oci

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// helperEnv names the environment variable that turns the test binary into
// a stand-in for a daemon that creates one box (helperCreate), so a test
// can kill it at a moment of its choosing.
const helperEnv = "CUBICLE_OCI_TEST_CREATE"

// helperJob is what the stand-in daemon is to create.
type helperJob struct {
	Cfg   Config
	ID    string
	Image string
}

func TestMain(m *testing.M) {
	if job := os.Getenv(helperEnv); job != "" {
		helperCreate(job)
		return
	}
	os.Exit(m.Run())
}

// helperCreate creates the box job names and waits to be killed.
func helperCreate(job string) {
	var j helperJob
	if err := json.Unmarshal([]byte(job), &j); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if _, err := New(j.Cfg).Create(context.Background(), driver.Spec{ID: j.ID, Shape: driver.Shape{Image: j.Image}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	select {}
}

// TestCleanupAfterKillDuringRun kills a daemon while its `runtime run` is
// under way, then has a new driver on the same state directory clean up,
// as a restarted daemon does: nothing of the box may be left, not even the
// runtime's state, lock or cgroups, which the run writes after the kill.
// CI once found them left, after a kill 135 ms into a create.
func TestCleanupAfterKillDuringRun(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx := context.Background()
			const id = "tkillrun"
			job, err := json.Marshal(helperJob{Cfg: d.cfg, ID: id, Image: image})
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			helper := exec.Command(os.Args[0], "-test.run=^$") //depcheck:built (this test binary)
			helper.Env = append(os.Environ(), helperEnv+"="+string(job))
			helper.Stdout, helper.Stderr = &out, &out
			if err := helper.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- helper.Wait() }()
			defer func() { helper.Process.Kill(); <-exited }()
			// Kill the "daemon" as soon as its run has started.
			deadline := time.Now().Add(time.Minute)
			for {
				runs, err := d.orphanRuns(nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(runs) > 0 {
					break
				}
				select {
				case err := <-exited:
					exited <- err
					t.Fatalf("helper ended before its run was seen: %v\n%s", err, out.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("no run seen in a minute\n%s", out.String())
				}
				time.Sleep(2 * time.Millisecond)
			}
			helper.Process.Kill()
			exited <- <-exited
			runs, _ := d.orphanRuns(nil)
			t.Logf("daemon killed; %d runtime process(es) of its run still going", len(runs))

			d2 := New(d.cfg) // the restarted daemon's
			if err := d2.Cleanup(ctx, nil); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if runs, _ := d2.orphanRuns(nil); len(runs) > 0 {
				t.Errorf("runs still going after Cleanup: %+v", runs)
			}
			assertGone(t, d2, id, 0)
		})
	}
}

// TestWaitOrphanRuns checks the matching and the bound: only a run of a
// box of this driver, not kept, started by the daemon's user, is waited
// for, and one that outlasts the bound is killed.
func TestWaitOrphanRuns(t *testing.T) {
	state := t.TempDir()
	d := New(Config{Runtime: "runsc", StateDir: state})
	startAs := func(uid uint32, pidFile, script string) *exec.Cmd {
		t.Helper()
		// sh -c SCRIPT NAME ARGS...: the arguments are only for matching.
		// A script of "block" waits with the shell's own read, on a pipe
		// the test holds open: a sleep would be forked, and the forked
		// shell, until it has exec'd sleep, has the same arguments, so
		// it matched too once on a loaded machine (CI, stop 21).
		cmd := exec.Command("sh", "-c", script, "runsc", "run", "--detach", "--pid-file", pidFile, "--bundle", "x", "id")
		if script == "block" {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Args[2] = "read x"
			cmd.Stdin = r
			t.Cleanup(func() { w.Close() })
			defer r.Close()
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // as Create starts a run
		if uid != 0 {
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	start := func(pidFile, script string) *exec.Cmd { return startAs(0, pidFile, script) }
	mine := start(filepath.Join(state, "tmine", "pid"), "block")
	if os.Geteuid() == 0 {
		// Anyone may name a box in a process's arguments; only the
		// daemon's user runs the runtime.
		startAs(65534, filepath.Join(state, "tforeign", "pid"), "block")
	}
	start(filepath.Join(state, "tkept", "pid"), "block")
	start(filepath.Join(t.TempDir(), "tother", "pid"), "block")
	start(filepath.Join(state, "Not-An-ID", "pid"), "block")
	runs, err := d.orphanRuns(map[string]bool{"tkept": true})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Pid != mine.Process.Pid {
		t.Fatalf("orphanRuns = %+v, want only pid %d", runs, mine.Process.Pid)
	}

	// One that ends on its own within the bound is waited for.
	short := start(filepath.Join(state, "tshort", "pid"), "sleep 0.3")
	keep := map[string]bool{"tkept": true, "tmine": true}
	begin := time.Now()
	if err := d.waitOrphanRuns(context.Background(), keep, 10*time.Second); err != nil {
		t.Fatalf("wait for a run that ends: %v", err)
	}
	if took := time.Since(begin); took < 200*time.Millisecond {
		t.Errorf("returned after %v, before the run (pid %d) ended", took, short.Process.Pid)
	}

	// One that outlasts the bound is killed, and said so.
	err = d.waitOrphanRuns(context.Background(), map[string]bool{"tkept": true}, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "killed 1") {
		t.Fatalf("wait past the bound = %v, want an error saying it killed 1", err)
	}
	for end := time.Now().Add(5 * time.Second); alive(mine.Process.Pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the run left past the bound was not killed")
		}
	}
}

// TestRemoveCgroups checks that deleting a container the runtime does not
// know still removes the box's empty cgroups, and leaves (and reports) one
// that has a task in it.
func TestRemoveCgroups(t *testing.T) {
	needs.Root(t)
	if _, err := os.Stat("/sys/fs/cgroup/pids"); err != nil {
		needs.Skip(t, "no cgroup v1 pids hierarchy: %v", err)
	}
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			needs.Runtime(t, rt) //depcheck:caller
			d := New(Config{Runtime: rt, StateDir: filepath.Join(t.TempDir(), "st")})
			id := "tcgroup" + rt
			empty := filepath.Join("/sys/fs/cgroup/pids", cgroupParent, id)
			if err := os.MkdirAll(empty, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Rmdir(empty) })
			if err := d.deleteContainer(context.Background(), id); err != nil {
				t.Fatalf("deleteContainer: %v", err)
			}
			if _, err := os.Stat(empty); !os.IsNotExist(err) {
				t.Errorf("empty cgroup %s: %v, want removed", empty, err)
			}

			// A cgroup with a task stays, and the error says so.
			busy := filepath.Join("/sys/fs/cgroup/pids", cgroupParent, id+"busy")
			if err := os.MkdirAll(busy, 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sleep", "30")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); syscall.Rmdir(busy) })
			if err := os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := removeCgroups(id + "busy"); err == nil || !strings.Contains(err.Error(), busy) {
				t.Errorf("removeCgroups of a busy cgroup = %v, want an error naming %s", err, busy)
			}
			if _, err := os.Stat(busy); err != nil {
				t.Errorf("busy cgroup: %v, want kept", err)
			}
		})
	}
}
