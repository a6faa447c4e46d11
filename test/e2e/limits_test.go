package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestLimits runs a hostile sandbox next to a quiet one on gvisor and on
// runc, with a daemon whose per-sandbox disk is 256 MiB. The hostile one
// fills its disk (it gets ENOSPC, the host file stays within the limit),
// allocates far more memory than its 512 MiB (the hog is killed, or the
// whole sandbox is, never the daemon), and runs a fork bomb (held by its
// pids limit, on one vCPU). Meanwhile the quiet sandbox and the daemon
// must keep answering; the figures are logged. Destroying the hostile
// sandbox afterwards must leave nothing, loop device included.
func TestLimits(t *testing.T) {
	for _, backend := range backends() {
		if backend != "gvisor" && backend != "runc" {
			continue
		}
		t.Run(backend, func(t *testing.T) {
			needs.Runtime(t, map[string]string{"gvisor": "runsc", "runc": "runc"}[backend]) //depcheck:runs runsc runc
			testLimits(t, backend)
		})
	}
}

func testLimits(t *testing.T, backend string) {
	d, c := startDaemonArgs(t, backend, "--disk-mb", "256")
	ctx := context.Background()
	res := &client.Resolution{Width: 800, Height: 600}
	quiet, err := c.Create(ctx, client.CreateRequest{Resolution: res})
	if err != nil {
		t.Fatal(err)
	}
	hostileReq := client.CreateRequest{Resolution: res, VCPUs: 1, MemoryMB: 512}
	hostile, err := c.Create(ctx, hostileReq)
	if err != nil {
		t.Fatal(err)
	}
	// The quiet sandbox's exec latency, before and while the other one
	// misbehaves.
	probe := func(what string) time.Duration {
		t.Helper()
		t0 := time.Now()
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		r, err := c.Exec(pctx, quiet.ID, client.ExecRequest{Command: "echo quiet"})
		if err != nil || r.Stdout != "quiet\n" {
			t.Fatalf("quiet sandbox %s: exec = %+v, %v", what, r, err)
		}
		if _, err := c.Screenshot(pctx, quiet.ID, client.ScreenshotOptions{}); err != nil {
			t.Fatalf("quiet sandbox %s: screenshot: %v", what, err)
		}
		resp, err := http.Get(d.URL + "/healthz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("daemon %s: healthz %v %v", what, resp, err)
		}
		resp.Body.Close()
		return time.Since(t0)
	}
	base := probe("at rest")

	// Disk: 400 MiB into a 256 MiB layer.
	r, err := c.Exec(ctx, hostile.ID, client.ExecRequest{Command: "dd if=/dev/zero of=/root/fill bs=1M count=400 2>&1; echo rc=$?; df -m / | tail -n 1", TimeoutSeconds: 120})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.Stdout, "No space left on device") || strings.Contains(r.Stdout, "rc=0") {
		t.Errorf("400 MiB into a 256 MiB disk: %q, want ENOSPC", r.Stdout)
	}
	img := filepath.Join(filepath.Dir(d.Log), "oci", backend, hostile.ID, "disk.ext4")
	var st syscall.Stat_t
	if err := syscall.Stat(img, &st); err != nil {
		t.Fatalf("disk file: %v", err)
	} else if used := st.Blocks * 512; used > 257<<20 {
		t.Errorf("disk file takes %d MiB of the host's disk, want at most 256", used>>20)
	} else {
		t.Logf("disk full in the sandbox (%s); the host file takes %d MiB", strings.TrimSpace(r.Stdout[strings.LastIndex(r.Stdout, "rc="):]), used>>20)
	}
	if r, err := c.Exec(ctx, hostile.ID, client.ExecRequest{Command: "rm /root/fill && echo again > /root/small && cat /root/small"}); err != nil || r.Stdout != "again\n" {
		t.Errorf("after freeing the disk: %+v %v", r, err)
	}
	diskProbe := probe("after the disk filled")

	// Memory: 2 GiB of buffers in a 512 MiB sandbox.
	t0 := time.Now()
	r, err = c.Exec(ctx, hostile.ID, client.ExecRequest{Command: "dd if=/dev/zero of=/dev/null bs=2000M count=2", TimeoutSeconds: 120})
	hogWhat := ""
	switch {
	case err != nil:
		// The runtime itself was killed for memory: the daemon must
		// say the sandbox stopped, not report a fault of its own.
		hogWhat = "exec failed: " + err.Error()
		if !strings.Contains(err.Error(), "409") || !strings.Contains(err.Error(), "stopped while the request ran") {
			t.Errorf("exec whose sandbox was killed: %v, want 409 conflict saying it stopped", err)
		}
	case r.ExitCode != 0:
		hogWhat = fmt.Sprintf("hog ended with exit %d: %s", r.ExitCode, strings.TrimSpace(r.Stderr))
	default:
		t.Errorf("a 2000 MiB buffer in a 512 MiB sandbox succeeded: %+v", r)
	}
	sb, err := c.Get(ctx, hostile.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory hog (%v): %s; the sandbox is %s", time.Since(t0).Round(time.Millisecond), hogWhat, sb.State)
	memProbe := probe("after the memory hog")
	if sb.State != "running" {
		// The runtime as a whole was killed: that is the sandbox's
		// loss alone. Start another for the fork bomb.
		assertNoTraceEventually(t, d, hostile.ID)
		if hostile, err = c.Create(ctx, hostileReq); err != nil {
			t.Fatal(err)
		}
	}

	// Fork bomb, for 20 s, then the quiet one is probed under it.
	if _, err := c.ExecBackground(ctx, hostile.ID, client.ExecRequest{Command: "b(){ b | b & }; b"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Second)
	var bombProbes []time.Duration
	for range 3 {
		bombProbes = append(bombProbes, probe("under the fork bomb"))
	}
	hostProcs := len(harness.HostProcesses(hostile.ID))
	t.Logf("%s: quiet sandbox exec+screenshot+healthz: %v at rest, %v after the disk filled, %v after the memory hog, %v under the fork bomb (median of 3); hostile sandbox's host processes during the bomb: %d",
		backend, base.Round(time.Millisecond), diskProbe.Round(time.Millisecond), memProbe.Round(time.Millisecond), median(bombProbes).Round(time.Millisecond), hostProcs)
	if backend == "runc" && hostProcs > 1100 {
		t.Errorf("%d host processes of a runc sandbox, beyond its pids limit", hostProcs)
	}
	t0 = time.Now()
	if err := c.Destroy(ctx, hostile.ID); err != nil {
		t.Fatalf("destroy the fork-bombed sandbox: %v", err)
	}
	t.Logf("destroying the fork-bombed sandbox took %v", time.Since(t0).Round(time.Millisecond))
	assertNoTraceEventually(t, d, hostile.ID)
	probe("after the hostile sandbox was destroyed")
}

// assertNoTraceEventually waits for a sandbox's processes, mounts, files
// and loop devices to be gone, then reports what is left.
func assertNoTraceEventually(t *testing.T, d *harness.Daemon, id string) {
	t.Helper()
	dataDir := filepath.Dir(d.Log)
	if !eventually(30*time.Second, func() bool {
		return len(harness.HostProcesses(id)) == 0 && len(crashTraces(dataDir, id)) == 0
	}) {
		t.Errorf("%s left: processes %v, %v", id, harness.HostProcesses(id), crashTraces(dataDir, id))
	}
}

// loopsOf lists the loop devices whose backing file names id.
func loopsOf(id string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), id) {
			out = append(out, strings.Split(f, "/")[3])
		}
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
