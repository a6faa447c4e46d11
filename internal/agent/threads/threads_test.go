package threads

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/needs"
	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary the helper process of
// TestReserveAtPidsLimit; its value is the number of threads to reserve.
const helperEnv = "CUBICLE_THREADS_HELPER"

// blockers is how many goroutines the helper blocks in system calls at
// once, once its pids cgroup is full: each needs a thread of its own.
const blockers = 12

func TestMain(m *testing.M) {
	if v, ok := os.LookupEnv(helperEnv); ok {
		os.Exit(helper(v))
	}
	os.Exit(m.Run())
}

// helper reserves threads (the number v), says how many it has, waits
// until the test has filled its pids cgroup, then blocks blockers
// goroutines in reads of a pipe at once. Without a reserve the runtime
// must start threads the cgroup refuses, and the process ends.
func helper(v string) int {
	n, _ := strconv.Atoi(v)
	have, err := Count()
	if n > 0 {
		have, err = Reserve(context.Background(), n)
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("threads", have)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 1
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		fmt.Println("error", err)
		return 1
	}
	var wg sync.WaitGroup
	for range blockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			unix.Read(p[0], b[:])
		}()
	}
	// Long enough for the runtime to want a thread for every blocked
	// goroutine's successor (it looks every 20 µs to 10 ms).
	time.Sleep(300 * time.Millisecond)
	unix.Close(p[1])
	wg.Wait()
	fmt.Println("survived")
	return 0
}

// TestReserveAtPidsLimit runs a helper process in a pids cgroup that is
// then made full (pids.max = pids.current, as a fork bomb leaves it), and
// has it block goroutines in system calls. With a reserve it must go on;
// without one it must die for want of a thread, which shows the limit
// really was full.
func TestReserveAtPidsLimit(t *testing.T) {
	needs.Root(t)
	for _, tc := range []struct {
		name    string
		reserve int
		survive bool
	}{
		{"reserve", 2 * blockers, true},
		{"none", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg := pidsCgroup(t)
			cmd := exec.Command(os.Args[0], "-test.run=^$") //depcheck:built (this test binary)
			cmd.Env = append(os.Environ(), helperEnv+"="+strconv.Itoa(tc.reserve), "GOMAXPROCS=2")
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
				t.Fatalf("move the helper into %s: %v", cg, err)
			}
			out := bufio.NewReader(stdout)
			line, err := out.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "threads ") {
				t.Fatalf("helper: %q %v; stderr %s", line, err, stderr.String())
			}
			have, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "threads ")))
			if tc.reserve > 0 && have < tc.reserve {
				t.Errorf("after Reserve(%d) the helper has %d threads, want at least %d", tc.reserve, have, tc.reserve)
			}
			cur, err := os.ReadFile(filepath.Join(cg, "pids.current"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(cg, "pids.max"), []byte(strings.TrimSpace(string(cur))), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := stdin.Write([]byte("go\n")); err != nil {
				t.Fatal(err)
			}
			rest, _ := out.ReadString('\n')
			werr := cmd.Wait()
			survived := strings.TrimSpace(rest) == "survived" && werr == nil
			t.Logf("%d threads, pids.max %s: helper said %q, exit %v", have, strings.TrimSpace(string(cur)), strings.TrimSpace(rest), werr)
			switch {
			case tc.survive && !survived:
				t.Errorf("with %d threads in reserve the helper did not survive a full pids cgroup: %q %v\n%s", tc.reserve, rest, werr, lastLines(stderr.String(), 5))
			case !tc.survive && survived:
				t.Errorf("without a reserve the helper survived: the cgroup was not full, so the reserve case proves nothing")
			case !tc.survive && !strings.Contains(stderr.String(), "failed to create new OS thread"):
				t.Errorf("without a reserve the helper ended otherwise than for want of a thread: %v\n%s", werr, lastLines(stderr.String(), 5))
			}
		})
	}
}

// pidsCgroup makes an empty pids cgroup (v1 or v2) for the test and
// removes it at the end.
func pidsCgroup(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("cubicle-threads-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	var dir string
	switch {
	case fileExists("/sys/fs/cgroup/pids/cgroup.procs"):
		dir = filepath.Join("/sys/fs/cgroup/pids", name)
	case fileExists("/sys/fs/cgroup/cgroup.controllers"):
		b, _ := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control")
		if !strings.Contains(string(b), "pids") {
			needs.Skip(t, "the cgroup v2 root does not delegate the pids controller")
		}
		dir = filepath.Join("/sys/fs/cgroup", name)
	default:
		needs.Skip(t, "no pids cgroup controller")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The helper is gone by now (killed, waited for); rmdir may race
		// its last exit by a moment.
		for range 50 {
			if err := unix.Rmdir(dir); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("remove cgroup %s: still busy", dir)
	})
	return dir
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func TestCount(t *testing.T) {
	n, err := Count()
	if err != nil {
		t.Fatal(err)
	}
	if n < 1 {
		t.Fatalf("Count() = %d, want at least 1", n)
	}
}
