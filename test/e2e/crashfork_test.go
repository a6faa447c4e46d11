package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestCrashFork kills cubicled with -9 at random points of forks of a
// running qemu or gvisor desktop (CUBICLE_CRASH_FORK_ROUNDS times, default 4) and
// restarts it. Then the same for snapshots (CUBICLE_CRASH_SNAPSHOT_ROUNDS
// kills during snapshots of the parent and as many during creates from a
// snapshot, default 3 each). The kills of each kind fall in successive
// slices of the operation (killPoint), so 2 of a kind kill both early
// (the copy, the parent's vCPUs stopped) and late (the copies starting,
// re-keyed).
//
// What a user may lose, from the recovery paths (Manager.recover, the
// drivers' Adopt, which thaws a box a fork or snapshot left stopped, and
// for gVisor has its agent listen again and removes the copy's image),
// and what each round asserts, no more:
//
//   - The parent: nothing. It is running, with its memory, processes and
//     disk as they were (a counter started in it before the kills counts
//     on from where it was), and usable (a command runs, a screenshot
//     comes back) within assertUsable's minute once the restarted daemon
//     answers, like any sandbox a restart re-adopts. It stood still from
//     the kill until the restart, if the kill came during the copy.
//   - A fork, or a sandbox started from a snapshot: the fork or the
//     create. It was never made (no record yet), or failed with the
//     restart as its reason and nothing left (its record was still
//     starting), or it is running and usable. Never stopped.
//   - A snapshot: the snapshot. It is listed and starts a usable
//     sandbox, or is gone without a trace (its directory too). The
//     snapshot a cut-short create started from is intact.
//
// Once a round's forks are gone the host holds what it held before.
func TestCrashFork(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Command(t, "nft")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	for i, backend := range selectedBackends("qemu", "gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testCrashFork(t, backend, i)
		})
	}
}

func testCrashFork(t *testing.T, backend string, i int) {
	rounds := 4
	if s := os.Getenv("CUBICLE_CRASH_FORK_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CUBICLE_CRASH_FORK_ROUNDS=%q", s)
		}
		rounds = n
	}
	d, c := startDaemonArgs(t, backend, "--net", "--net-bridge", "cbcrashf"+strconv.Itoa(i), "--net-cidr", "10.89."+strconv.Itoa(40+i)+".0/24")
	dataDir := filepath.Dir(d.Log)
	ctx := context.Background()
	parent, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 800, Height: 600},
		Metadata: map[string]string{"crash": "fork"}, Network: &client.Network{Allow: []string{"192.0.2.0/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	intact := parentCounter(t, c, parent.ID)
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
		at := killPoint(round, rounds, took)
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
		what := fmt.Sprintf("round %d (kill %v into a fork)", round, at.Round(time.Millisecond))
		assertParent(t, c, parent.ID, what, intact)
		kids := forksOf()
		t.Logf("%s: %d forks listed", what, len(kids))
		if len(kids) > 2 {
			t.Fatalf("%s: %d forks from a fork of 2", what, len(kids))
		}
		for _, k := range kids {
			outcome["fork: "+k.State]++
			assertCopyOutcome(t, c, dataDir, k, what)
		}
		if len(kids) == 0 {
			outcome["fork: never made"]++
		}
		assertHostAsBefore(t, d, dataDir, before, free, what)
	}
	t.Logf("outcomes of %d kills during forks: %v", rounds, outcome)
	crashSnapshots(t, d, c, parent, intact)
}

// crashSnapshots is TestCrashFork's part for snapshots, on its daemon
// and parent.
func crashSnapshots(t *testing.T, d *harness.Daemon, c *client.Client, parent client.Sandbox, intact func() (int, error)) {
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
		at := killPoint(round, rounds, tookSnap)
		done := make(chan struct{})
		go func() { defer close(done); c.CreateSnapshot(ctx, parent.ID, client.SnapshotOptions{Name: "cut"}) }()
		time.Sleep(at)
		restart()
		<-done
		what := fmt.Sprintf("round %d (kill %v into a snapshot)", round, at.Round(time.Millisecond))
		assertParent(t, c, parent.ID, what, intact)
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
		at := killPoint(round, rounds, tookRestore)
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
			assertCopyOutcome(t, c, dataDir, k, what)
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

// parentCounter starts a counter in sandbox id, in memory (a shell's
// variable) and on its disk (/var/tmp/crash-count), and returns what
// reads it.
func parentCounter(t *testing.T, c *client.Client, id string) func() (int, error) {
	t.Helper()
	ctx := context.Background()
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /var/tmp/crash-count.part; mv /var/tmp/crash-count.part /var/tmp/crash-count; sleep 0.2; done' >/dev/null 2>&1 & echo started`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start the parent's counter: %+v %v", res, err)
	}
	read := func() (int, error) {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		res, err := c.Exec(rctx, id, client.ExecRequest{Command: "cat /var/tmp/crash-count"})
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(res.Stdout))
	}
	if !eventually(30*time.Second, func() bool { n, err := read(); return err == nil && n > 0 }) {
		t.Fatal("the parent's counter does not count")
	}
	last := 0
	return func() (int, error) {
		n, err := read()
		if err == nil && n < last {
			err = fmt.Errorf("the counter is at %d, was %d: it started over", n, last)
		}
		if err == nil {
			last = n
		}
		return n, err
	}
}

// assertParent checks what a kill may leave of the parent (TestCrashFork):
// running, usable within assertUsable's minute, and with its counter
// going on from where it was.
func assertParent(t *testing.T, c *client.Client, id, what string, counter func() (int, error)) {
	t.Helper()
	if got, err := c.Get(context.Background(), id); err != nil || got.State != client.StateRunning {
		t.Fatalf("%s: the parent: %+v, %v", what, got, err)
	}
	tu := time.Now()
	assertUsable(t, c, id)
	t.Logf("%s: the parent answered a command and a screenshot %v after the restart", what, time.Since(tu).Round(time.Millisecond))
	n, err := counter()
	if err != nil {
		t.Fatalf("%s: the parent's counter: %v", what, err)
	}
	if !eventually(30*time.Second, func() bool { m, err := counter(); return err == nil && m > n }) {
		t.Errorf("%s: the parent's counter stands at %d", what, n)
	}
}

// assertCopyOutcome checks what a kill may leave of a fork or of a
// sandbox started from a snapshot (TestCrashFork): running and usable
// (then destroyed), or failed with the restart as its reason; either
// way nothing of it left once it is gone.
func assertCopyOutcome(t *testing.T, c *client.Client, dataDir string, sb client.Sandbox, what string) {
	t.Helper()
	switch sb.State {
	case client.StateRunning:
		assertUsable(t, c, sb.ID)
		if err := c.Destroy(context.Background(), sb.ID); err != nil {
			t.Fatalf("%s: destroy %s: %v", what, sb.ID, err)
		}
	case "failed":
		if !strings.Contains(sb.Error, "cubicled stopped while the sandbox was starting") {
			t.Errorf("%s: %s failed with %q, want the restart as its reason", what, sb.ID, sb.Error)
		}
	default:
		t.Errorf("%s: %s is %s (%q) after the restart; a kill may leave it only running or failed", what, sb.ID, sb.State, sb.Error)
		if sb.State != "stopped" {
			return // half-made: what it holds is its state's
		}
	}
	assertCrashClean(t, dataDir, sb)
}
