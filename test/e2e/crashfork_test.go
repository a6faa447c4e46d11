package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestCrashFork kills cubicled with -9 at random points of forks of a
// running qemu desktop (CUBICLE_CRASH_FORK_ROUNDS times, default 4) and
// restarts it. After each restart the parent is running and usable (a
// fork stops its vCPUs for the copy: a daemon killed then leaves them
// stopped, and the restart lets them run), and each fork the round made
// is running and usable or stopped without a trace; once the forks are
// gone the host holds what it held before the round.
//
// Then the same for snapshots (CUBICLE_CRASH_SNAPSHOT_ROUNDS kills during
// snapshots of the parent and as many during creates from a snapshot,
// default 3 each): after each restart the parent is running and usable;
// a snapshot the kill cut short is listed and starts a usable sandbox, or
// is gone without a trace (its directory too); a sandbox the kill cut
// short while it started from a snapshot is running and usable or
// stopped without a trace, and the snapshot it started from is intact
// (a create from it afterwards is usable).
func TestCrashFork(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Command(t, "nft")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	for _, backend := range selectedBackends("qemu") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testCrashFork(t, backend)
		})
	}
}

func testCrashFork(t *testing.T, backend string) {
	rounds := 4
	if s := os.Getenv("CUBICLE_CRASH_FORK_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CUBICLE_CRASH_FORK_ROUNDS=%q", s)
		}
		rounds = n
	}
	d, c := startDaemonArgs(t, backend, "--net", "--net-bridge", "cbcrashf", "--net-cidr", "10.89.40.0/24")
	dataDir := filepath.Dir(d.Log)
	ctx := context.Background()
	parent, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 800, Height: 600},
		Metadata: map[string]string{"crash": "fork"}, Network: &client.Network{Allow: []string{"192.0.2.0/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	// forksOf lists the forks made since the last call (forks copy the
	// parent's metadata; stopped ones stay listed for a while).
	known := map[string]bool{parent.ID: true}
	forksOf := func() []client.Sandbox {
		t.Helper()
		sbs, err := c.List(ctx, client.ListOptions{Metadata: map[string]string{"crash": "fork"}})
		if err != nil {
			t.Fatal(err)
		}
		var out []client.Sandbox
		for _, sb := range sbs {
			if !known[sb.ID] {
				known[sb.ID] = true
				out = append(out, sb)
			}
		}
		return out
	}
	// An undisturbed fork of two, so that kills fall anywhere in one.
	t0 := time.Now()
	forks, err := c.Fork(ctx, parent.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	t.Logf("undisturbed: fork of 2 in %v", took.Round(time.Millisecond))
	forksOf()
	for _, f := range forks {
		if err := c.Destroy(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
		assertCrashClean(t, dataDir, f)
	}
	outcome := map[string]int{}
	for round := range rounds {
		before := snapshotHost(dataDir, d.Pid())
		free := metricValue(t, d, "cubicle_netpool_free")
		at := time.Duration(rand.Int64N(int64(took) * 11 / 10))
		done := make(chan struct{})
		go func() { defer close(done); c.Fork(ctx, parent.ID, 2) }()
		time.Sleep(at)
		d.Kill9()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := d.Restart(rctx); err != nil {
			cancel()
			t.Fatal(err)
		}
		cancel()
		<-done
		if got, err := c.Get(ctx, parent.ID); err != nil || got.State != client.StateRunning {
			t.Fatalf("round %d: the parent after a kill %v into a fork: %+v, %v", round, at.Round(time.Millisecond), got, err)
		}
		// Usable again within 3 minutes. One CI run saw the parent's
		// screenshots stall for over a minute after a kill 0.8 s into a
		// fork (commands ran at once): the wait is logged when long.
		tu := time.Now()
		if !eventually(3*time.Minute, func() bool { return usable(c, parent.ID) }) {
			assertUsable(t, c, parent.ID)
		}
		if w := time.Since(tu); w > 10*time.Second {
			t.Logf("round %d: the parent was usable again after %v", round, w.Round(time.Millisecond))
		}
		kids := forksOf()
		t.Logf("round %d: kill %v into a fork of 2: %d forks listed", round, at.Round(time.Millisecond), len(kids))
		if len(kids) > 2 {
			t.Fatalf("round %d: %d forks from a fork of 2", round, len(kids))
		}
		for _, k := range kids {
			outcome["fork: "+k.State]++
			switch k.State {
			case "running":
				assertUsable(t, c, k.ID)
				if err := c.Destroy(ctx, k.ID); err != nil {
					t.Fatalf("round %d: destroy %s: %v", round, k.ID, err)
				}
			case "stopped", "failed":
			default:
				t.Errorf("round %d: fork %s is %s after the restart: half-made", round, k.ID, k.State)
				continue
			}
			assertCrashClean(t, dataDir, k)
		}
		if len(kids) == 0 {
			outcome["fork: never made"]++
		}
		assertHostAsBefore(t, d, dataDir, before, free, fmt.Sprintf("round %d (kill %v into a fork)", round, at.Round(time.Millisecond)))
	}
	t.Logf("outcomes of %d kills during forks: %v", rounds, outcome)
	crashSnapshots(t, d, c, parent)
}

// crashSnapshots is TestCrashFork's part for snapshots, on its daemon
// and parent.
func crashSnapshots(t *testing.T, d *harness.Daemon, c *client.Client, parent client.Sandbox) {
	rounds := 3
	if s := os.Getenv("CUBICLE_CRASH_SNAPSHOT_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CUBICLE_CRASH_SNAPSHOT_ROUNDS=%q", s)
		}
		rounds = n
	}
	ctx := context.Background()
	dataDir := filepath.Dir(d.Log)
	restart := func() {
		t.Helper()
		d.Kill9()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := d.Restart(rctx); err != nil {
			t.Fatal(err)
		}
	}
	// startFrom starts a sandbox from snapshot ref, checks that it is
	// usable and destroys it.
	startFrom := func(ref, what string) {
		t.Helper()
		sb, err := c.Create(ctx, client.CreateRequest{FromSnapshot: ref})
		if err != nil {
			t.Fatalf("%s: create from snapshot %s: %v", what, ref, err)
		}
		assertUsable(t, c, sb.ID)
		if err := c.Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		assertCrashClean(t, dataDir, sb)
	}
	// Undisturbed, so that kills fall anywhere in one.
	t0 := time.Now()
	kept, err := c.CreateSnapshot(ctx, parent.ID, client.SnapshotOptions{Name: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	tookSnap := time.Since(t0)
	t0 = time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{FromSnapshot: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	tookRestore := time.Since(t0)
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertCrashClean(t, dataDir, sb)
	t.Logf("undisturbed: snapshot in %v, create from it in %v", tookSnap.Round(time.Millisecond), tookRestore.Round(time.Millisecond))

	outcome := map[string]int{}
	for round := range rounds {
		before := snapshotHost(dataDir, d.Pid())
		free := metricValue(t, d, "cubicle_netpool_free")
		at := time.Duration(rand.Int64N(int64(tookSnap) * 11 / 10))
		done := make(chan struct{})
		go func() { defer close(done); c.CreateSnapshot(ctx, parent.ID, client.SnapshotOptions{Name: "cut"}) }()
		time.Sleep(at)
		restart()
		<-done
		what := fmt.Sprintf("round %d (kill %v into a snapshot)", round, at.Round(time.Millisecond))
		if got, err := c.Get(ctx, parent.ID); err != nil || got.State != client.StateRunning {
			t.Fatalf("%s: the parent: %+v, %v", what, got, err)
		}
		if !eventually(3*time.Minute, func() bool { return usable(c, parent.ID) }) {
			assertUsable(t, c, parent.ID)
		}
		s, err := c.GetSnapshot(ctx, "cut")
		switch {
		case err == nil:
			outcome["snapshot: kept"]++
			startFrom("cut", what)
			if err := c.DeleteSnapshot(ctx, "cut"); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dataDir, "snapshots", s.ID)); !os.IsNotExist(err) {
				t.Errorf("%s: the deleted snapshot's directory: %v", what, err)
			}
		case client.IsNotFound(err):
			outcome["snapshot: gone"]++
		default:
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %v", what, map[bool]string{true: "kept", false: "gone"}[err == nil])
		assertHostAsBefore(t, d, dataDir, before, free, what)
	}
	seen := map[string]bool{} // stopped sandboxes stay listed a while
	for round := range rounds {
		before := snapshotHost(dataDir, d.Pid())
		free := metricValue(t, d, "cubicle_netpool_free")
		at := time.Duration(rand.Int64N(int64(tookRestore) * 11 / 10))
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Create(ctx, client.CreateRequest{FromSnapshot: "kept", Metadata: map[string]string{"crash": "restore"}})
		}()
		time.Sleep(at)
		restart()
		<-done
		what := fmt.Sprintf("round %d (kill %v into a create from a snapshot)", round, at.Round(time.Millisecond))
		listed, err := c.List(ctx, client.ListOptions{Metadata: map[string]string{"crash": "restore"}})
		if err != nil {
			t.Fatal(err)
		}
		var sbs []client.Sandbox
		for _, sb := range listed {
			if !seen[sb.ID] {
				seen[sb.ID] = true
				sbs = append(sbs, sb)
			}
		}
		if len(sbs) > 1 {
			t.Fatalf("%s: %d sandboxes from one create", what, len(sbs))
		}
		for _, k := range sbs {
			outcome["restore: "+k.State]++
			switch k.State {
			case "running":
				assertUsable(t, c, k.ID)
				if err := c.Destroy(ctx, k.ID); err != nil {
					t.Fatalf("%s: destroy %s: %v", what, k.ID, err)
				}
			case "stopped", "failed":
			default:
				t.Errorf("%s: %s is %s after the restart: half-made", what, k.ID, k.State)
				continue
			}
			assertCrashClean(t, dataDir, k)
		}
		if len(sbs) == 0 {
			outcome["restore: never made"]++
		}
		t.Logf("%s: %d sandboxes listed", what, len(sbs))
		if got, err := c.GetSnapshot(ctx, "kept"); err != nil || got.ID != kept.ID {
			t.Fatalf("%s: the snapshot: %+v, %v", what, got, err)
		}
		assertHostAsBefore(t, d, dataDir, before, free, what)
	}
	startFrom("kept", "after the kills")
	t.Logf("outcomes of %d kills during snapshots and %d during creates from one: %v", rounds, rounds, outcome)
}

// usable reports whether a command runs and a screenshot comes back in
// sandbox id, each within 30 s.
func usable(c *client.Client, id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: "echo usable"})
	if err != nil || res.Stdout != "usable\n" {
		return false
	}
	_, err = c.Screenshot(ctx, id, client.ScreenshotOptions{})
	return err == nil
}
