package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestWarmPool boots a daemon with a warm pool on real gVisor and checks
// what a user of it sees: a create that matches is served from the pool
// (a hit in the metrics, the pool's box as the sandbox), the sandbox
// runs the create's session (its environment in a command, its start URL
// in Chromium's title), and the next claim sees nothing of the one
// before: not its file, not its environment, not its page, not the pool's
// marker. A daemon that stops destroys the boxes nobody claimed.
func TestWarmPool(t *testing.T) {
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testWarmPool(t, backend)
		})
	}
}

func testWarmPool(t *testing.T, backend string) {
	d, c := startDaemonArgs(t, backend, "--pool", backend+"/desktop-lite:1024x768=2")
	ctx := context.Background()
	waitPool := func(n int) {
		t.Helper()
		waitFor(t, "pool ready", func() bool {
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return len(info.Pools) == 1 && info.Pools[0].Ready >= n
		})
	}
	waitPool(2)
	if sbs, err := c.List(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Fatalf("the pool's boxes are listed: %+v, %v", sbs, err)
	}

	// Each claim's start URL is a file of the image, whose name Chromium
	// shows as the window's title.
	claim := func(name, page string) client.Sandbox {
		t.Helper()
		t0 := time.Now()
		sb, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 1024, Height: 768},
			Env: map[string]string{"CLAIM": name}, StartURL: page})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Logf("claim %s: sandbox %s ready in %v", name, sb.ID, time.Since(t0).Round(time.Millisecond))
		return sb
	}
	sh := func(id, script string) string {
		t.Helper()
		res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return res.Stdout + res.Stderr
	}

	a := claim("a", "file:///etc/os-release")
	if hits := poolClaims(t, d, "hit"); hits != 1 {
		t.Errorf("%v pool hits after the first create, want 1", hits)
	}
	if out := sh(a.ID, `echo "claim=$CLAIM pooled=${CUBICLE_POOLED:-no} token=${CUBICLE_AGENT_TOKEN:-no}"`); strings.TrimSpace(out) != "claim=a pooled=no token=no" {
		t.Errorf("sandbox a's environment: %q, want its create's CLAIM and nothing of the pool", out)
	}
	waitFor(t, "sandbox a's start URL", func() bool { return hasWindowTitle(t, c, a.ID, "os-release") })
	sh(a.ID, `echo secret-of-a > /tmp/left-by-a; mkdir -p /home/user/a-was-here`)
	if err := c.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, d, backend, a.ID)

	waitPool(1)
	b := claim("b", "file:///etc/hostname")
	if b.ID == a.ID {
		t.Fatal("the pool served the same sandbox twice")
	}
	if hits := poolClaims(t, d, "hit"); hits != 2 {
		t.Errorf("%v pool hits after the second create, want 2", hits)
	}
	out := sh(b.ID, `echo "claim=$CLAIM"; cat /tmp/left-by-a 2>/dev/null; test -e /home/user/a-was-here && echo a-dir; true`)
	if strings.TrimSpace(out) != "claim=b" {
		t.Errorf("sandbox b sees %q, want its own CLAIM and nothing sandbox a left", out)
	}
	waitFor(t, "sandbox b's start URL", func() bool { return hasWindowTitle(t, c, b.ID, "hostname") })
	if hasWindowTitle(t, c, b.ID, "os-release") {
		t.Error("sandbox b shows sandbox a's page")
	}

	// A create the pool does not serve boots cold and is no hit.
	cold, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 800, Height: 600}})
	if err != nil {
		t.Fatal(err)
	}
	if hits := poolClaims(t, d, "hit"); hits != 2 {
		t.Errorf("a create of another screen size counted as a hit (%v)", hits)
	}
	for _, id := range []string{b.ID, cold.ID} {
		if err := c.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	// The daemon's stop destroys the boxes still in the pool.
	waitPool(2)
	dataDir := filepath.Dir(d.Log)
	d.Stop()
	if pids := harness.HostProcesses(dataDir); len(pids) > 0 {
		t.Errorf("processes of the pool left after the daemon stopped: %v", pids)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, dataDir) {
			t.Errorf("mount left after the daemon stopped: %s", line)
		}
	}
}

// poolClaims is cubicle_pool_claims_total of one result, over the pools.
func poolClaims(t *testing.T, d *harness.Daemon, result string) float64 {
	t.Helper()
	text := metricsText(t, d)
	sum := 0.0
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "cubicle_pool_claims_total{") && strings.Contains(line, `result="`+result+`"`) {
			if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}
