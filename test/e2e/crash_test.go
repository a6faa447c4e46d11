package e2e

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/cluster"
	"github.com/cubicle-dev/cubicle/internal/cluster/etcdtest"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestCrashRestart kills cubicled with SIGKILL at a random point of a
// create, a destroy, a pause or a resume (the last two where the backend
// pauses), again and again (CUBICLE_CRASH_ROUNDS times, default 12;
// `make crash` runs 50), restarts it, and checks that every sandbox the
// round made is in a state that a kill during its operation may leave
// (crashOutcomes: what a user may lose) and no other: running and usable
// (a command runs, a screenshot is a PNG of its size), paused and
// resumable (then usable), or ended with nothing of it left:
// no process, mount, file, network namespace, veth, nft rule or address.
// None may be half-made; and after each round, whatever its outcome, the
// host holds nothing it did not hold before the round (a create killed
// before its record was written leaves an unknown ID: the check compares
// the host with a snapshot). The rounds take the kinds in turn, so that
// as many rounds as there are kinds (4 where the backend pauses, else 2;
// fewer are raised to that) kill once during each, and the kills of one
// kind fall in successive slices of its operation (killPoint). Sandboxes
// have networking (an allow-list, so that each has rules of its own), so
// the whole of a create is exposed; it runs in a network namespace the
// test made, on gvisor or the backends CUBICLE_E2E_BACKEND names.
func TestCrashRestart(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Command(t, "nft")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	for i, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testCrashRestart(t, backend, fmt.Sprintf("cbcrash%d", i), fmt.Sprintf("10.89.%d.0/24", 20+i), nil)
		})
	}
	// The same, the daemon being a cluster node (on a real etcd, in this
	// namespace): its catalog entries must follow what its store holds
	// after every kill, with none left of a sandbox that is gone.
	t.Run("gvisor-cluster-node", func(t *testing.T) {
		needsBackend(t, "gvisor")
		etcd := etcdtest.Start(t, 1)
		testCrashRestart(t, "gvisor", "cbcrashcl", "10.89.40.0/24", etcd.Endpoints())
	})
}

func testCrashRestart(t *testing.T, backend, bridge, cidr string, etcd []string) {
	rounds := 12
	if s := os.Getenv("CUBICLE_CRASH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CUBICLE_CRASH_ROUNDS=%q", s)
		}
		rounds = n
	}
	args := []string{"--net", "--net-bridge", bridge, "--net-cidr", cidr}
	var catalog *cluster.Cluster
	if etcd != nil {
		rounds = min(rounds, 8)
		args = append(args, "--cluster-etcd", strings.Join(etcd, ","), "--node-name", "crash", "--lease-ttl", "4s")
		var err error
		// A reader of the catalog, as another node sees it.
		catalog, err = cluster.New(cluster.Config{Endpoints: etcd, Name: "crash-test-reader"})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); catalog.Run(rctx) }()
		t.Cleanup(func() { stop(); <-done; catalog.Close() })
	}
	// inCatalog waits until the catalog's entry of id is in state (""
	// for no entry at all).
	inCatalog := func(round int, id, state string) {
		t.Helper()
		if catalog == nil {
			return
		}
		var last string
		if !eventually(30*time.Second, func() bool {
			e := catalog.Entries(func(e cluster.Entry) bool { return e.ID == id })
			last = catalogLines(e)
			if state == "" {
				return len(e) == 0
			}
			return len(e) == 1 && e[0].State == state && e[0].Node == "crash"
		}) {
			t.Errorf("round %d: the catalog's entry of %s is %s, want state %q", round, id, last, state)
		}
	}
	// Not t.TempDir: a VM's socket paths must stay short.
	dataDir, err := os.MkdirTemp("", "cubicle-e2e-crash-")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	d, err := harness.Start(sctx, harness.Options{DataDir: dataDir, ImageDir: imageDir(), DefaultBackend: backend,
		Args: args})
	cancel()
	if err != nil {
		os.RemoveAll(dataDir)
		t.Fatal(err)
	}
	c := client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(3*time.Minute))
	t.Cleanup(func() {
		if sbs, err := c.List(ctx, client.ListOptions{}); err == nil {
			for _, sb := range sbs {
				c.Destroy(ctx, sb.ID)
			}
		}
		d.Stop()
		if t.Failed() {
			log, _ := os.ReadFile(d.Log)
			t.Logf("cubicled log (tail):\n%s", tail(string(log), 80))
		}
		os.RemoveAll(dataDir)
	})
	req := func(round int) client.CreateRequest {
		return client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 800, Height: 600},
			Metadata: map[string]string{"crash-round": strconv.Itoa(round)},
			Network:  &client.Network{Allow: []string{"192.0.2.0/24"}}}
	}

	// How long an undisturbed create and destroy take here, so that
	// kills fall anywhere in them (and a little after).
	t0 := time.Now()
	sb, err := c.Create(ctx, req(-1))
	if err != nil {
		t.Fatal(err)
	}
	createTook := time.Since(t0)
	t0 = time.Now()
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	destroyTook := time.Since(t0)
	t.Logf("undisturbed: create %v, destroy %v", createTook.Round(time.Millisecond), destroyTook.Round(time.Millisecond))
	assertCrashClean(t, dataDir, sb)
	// And a pause and a resume, where the backend can.
	var pauseTook, resumeTook time.Duration
	if canPause(t, c, backend) {
		sb, err := c.Create(ctx, req(-1))
		if err != nil {
			t.Fatal(err)
		}
		t0 = time.Now()
		if _, err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		pauseTook = time.Since(t0)
		t0 = time.Now()
		if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatal(err)
		}
		resumeTook = time.Since(t0)
		if err := c.Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		t.Logf("undisturbed: pause %v, resume %v", pauseTook.Round(time.Millisecond), resumeTook.Round(time.Millisecond))
	}
	kinds := []string{"create", "destroy"}
	if pauseTook > 0 {
		kinds = append(kinds, "pause", "resume")
	}
	if rounds < len(kinds) {
		t.Logf("%d rounds would not kill during each of %v: running %d", rounds, kinds, len(kinds))
		rounds = len(kinds)
	}

	restart := func() {
		t.Helper()
		d.Kill9()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := d.Restart(rctx); err != nil {
			t.Fatal(err)
		}
	}
	outcome := map[string]int{}
	for round := range rounds {
		// The kinds in turn: this round's kill is number nth (from 0)
		// of the of kills during its kind.
		k := round % len(kinds)
		kind := kinds[k]
		nth, of := round/len(kinds), (rounds-k+len(kinds)-1)/len(kinds)
		duringCreate := kind == "create"
		// What the host holds before the round: after it, once the
		// round's sandbox (if any) is gone, nothing may have been added,
		// whether or not the sandbox ever got a record.
		before := snapshotHost(dataDir, d.Pid())
		free := metricValue(t, d, "cubicle_netpool_free")
		var at time.Duration
		// killDuring kills cubicled at a random point of op, which takes
		// about took undisturbed, in the nth slice of it.
		killDuring := func(took time.Duration, op func()) {
			at = killPoint(nth, of, took)
			done := make(chan struct{})
			go func() { defer close(done); op() }()
			time.Sleep(at)
			restart()
			<-done
		}
		if duringCreate {
			cctx, cancel := context.WithCancel(ctx)
			killDuring(createTook, func() { c.Create(cctx, req(round)) })
			cancel()
		} else {
			sb, err := c.Create(ctx, req(round))
			if err != nil {
				t.Fatalf("round %d: create: %v", round, err)
			}
			id := sb.ID
			switch kind {
			case "destroy":
				killDuring(destroyTook, func() { c.Destroy(ctx, id) })
			case "pause":
				killDuring(pauseTook, func() { c.Pause(ctx, id) })
			case "resume":
				if _, err := c.Pause(ctx, id); err != nil {
					t.Fatalf("round %d: pause: %v", round, err)
				}
				killDuring(resumeTook, func() { c.Resume(ctx, id, 0) })
			}
		}
		sbs, err := c.List(ctx, client.ListOptions{Metadata: map[string]string{"crash-round": strconv.Itoa(round)}})
		if err != nil {
			t.Fatalf("round %d: list: %v", round, err)
		}
		if !duringCreate && len(sbs) != 1 {
			t.Fatalf("round %d: %d sandboxes listed after a kill during %s, want the one", round, len(sbs), kind)
		}
		if len(sbs) > 1 {
			t.Fatalf("round %d: %d sandboxes from one create", round, len(sbs))
		}
		if len(sbs) == 0 {
			// Killed before the record was written: nothing of the
			// sandbox may exist, though its ID is unknown.
			outcome[kind+": never made"]++
			t.Logf("round %d: kill %v into %s: no record", round, at.Round(time.Millisecond), kind)
			assertHostAsBefore(t, d, dataDir, before, free, fmt.Sprintf("round %d (never made)", round))
			continue
		}
		sb := settled(t, c, sbs[0])
		t.Logf("round %d: kill %v into %s of %s: %s %s", round, at.Round(time.Millisecond), kind, sb.ID, sb.State, sb.Error)
		outcome[kind+": "+sb.State]++
		if !slices.Contains(crashOutcomes[kind], sb.State) {
			t.Errorf("round %d: %s is %s (%q) after a kill %v into a %s; a kill then may leave it only %s",
				round, sb.ID, sb.State, sb.Error, at.Round(time.Millisecond), kind, strings.Join(crashOutcomes[kind], " or "))
		}
		switch sb.State {
		case "paused":
			// Paused and resumable, as it was.
			if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
				// The restarted daemon may be finishing the resume
				// the kill cut short, and got there first.
				got, gerr := c.Get(ctx, sb.ID)
				if gerr == nil {
					got = settled(t, c, got)
				}
				if !client.IsConflict(err) || gerr != nil || got.State != client.StateRunning {
					t.Fatalf("round %d: resume %s after the restart: %v (then %s, %v)", round, sb.ID, err, got.State, gerr)
				}
			}
			fallthrough
		case "running":
			assertUsable(t, c, sb.ID)
			inCatalog(round, sb.ID, "running")
			if err := c.Destroy(ctx, sb.ID); err != nil {
				t.Fatalf("round %d: destroy %s: %v", round, sb.ID, err)
			}
		case "failed":
			// A create the kill cut short: the restart says so.
			if kind == "create" && !strings.Contains(sb.Error, "cubicled stopped while the sandbox was starting") {
				t.Errorf("round %d: failed create %s says %q, want the restart as its reason", round, sb.ID, sb.Error)
			}
		case "stopped":
		default:
			t.Errorf("round %d: %s is %s after the restart: half-made", round, sb.ID, sb.State)
			continue
		}
		assertCrashClean(t, dataDir, sb)
		inCatalog(round, sb.ID, "")
		// Destroy stays idempotent for what the crash ended.
		if err := c.Destroy(ctx, sb.ID); err != nil && !client.IsNotFound(err) {
			t.Errorf("round %d: second destroy of %s: %v", round, sb.ID, err)
		}
		assertHostAsBefore(t, d, dataDir, before, free, fmt.Sprintf("round %d (%s %s)", round, sb.ID, sb.State))
	}
	t.Logf("outcomes of %d kills: %v", rounds, outcome)
	if path := os.Getenv("CUBICLE_CRASH_BENCHMARKS"); path != "" && !t.Failed() {
		var b strings.Builder
		fmt.Fprintf(&b, "## Crash restarts (make crash)\n\ncubicled killed -9 %d times at random points (spread over 110 %% of an undisturbed create, %v, destroy, %v, pause, %v, or resume, %v) of creates, destroys, pauses and resumes of %s desktops with networking, restarted each time. After each restart every sandbox of the round was as a kill during its operation may leave it, and no worse: a create's never made, failed with the restart as its reason, or running and usable (a command ran, a screenshot decoded); a destroy's running and usable, or stopped; a pause's or a resume's running and usable, or paused and then resumed and usable, never stopped or failed. What ended left no trace (no process, mount, file, loop device, network namespace, veth, nft rule or address; for a create killed before its record was written, nothing new on the host at all). Half-made: 0 (target: none; met).\n\n| kill during | outcome | n |\n|---|---|---|\n",
			rounds, createTook.Round(time.Millisecond), destroyTook.Round(time.Millisecond), pauseTook.Round(time.Millisecond), resumeTook.Round(time.Millisecond), backend)
		for _, k := range slices.Sorted(maps.Keys(outcome)) {
			during, state, _ := strings.Cut(k, ": ")
			fmt.Fprintf(&b, "| %s | %s | %d |\n", during, state, outcome[k])
		}
		if err := harness.ReplaceSection(path, "crash", b.String()); err != nil {
			t.Error(err)
		}
	}

	if catalog != nil {
		// Nothing of any round is left in the catalog, including
		// sandboxes whose record the kill prevented.
		if !eventually(30*time.Second, func() bool { return len(catalog.Entries(nil)) == 0 }) {
			t.Errorf("catalog entries left after every sandbox is gone: %s", catalogLines(catalog.Entries(nil)))
		}
	}
	if l := hostLinks(t); len(l) > 0 {
		t.Errorf("sandbox links left: %v", l)
	}
	if got := bridgePorts(t, bridge); got != 0 {
		t.Errorf("bridge has %d ports after every sandbox is gone", got)
	}
	if out, _ := exec.Command("nft", "list", "ruleset").CombinedOutput(); strings.Contains(string(out), "sb-") {
		t.Errorf("per-sandbox rules left:\n%s", out)
	}
	if body := metricsText(t, d); !strings.Contains(body, "cubicle_netpool_free 253") {
		t.Errorf("metrics: want cubicle_netpool_free 253 with every address free:\n%s", grepLines(body, "netpool"))
	}
}

// canPause reports whether sandboxes of backend can pause, as
// harness.Expected says: a daemon that says otherwise fails t.
func canPause(t *testing.T, c *client.Client, backend string) bool {
	t.Helper()
	return backendCaps(t, c, backend).Pause
}

// crashOutcomes are the states a kill -9 of cubicled during each kind of
// operation may leave its sandbox in after the restart, from the
// recovery paths (Manager.recover, the drivers' Settle and Resume): what
// a user may lose, and nothing more.
//
//   - create: the create. No record was written yet ("never made"), or
//     the record was still starting and the restart failed it, freeing
//     everything, with that as its reason; or the create had finished
//     and the sandbox runs. Never stopped: nothing ends a sandbox made.
//   - destroy: only what was asked. Stopped, or running when the kill
//     came before the destroy began. Never failed.
//   - pause: nothing. Running (the pause had not got far enough: the box
//     runs on, its agent listening again; README: "a pause it cut short
//     leaves the sandbox running") or paused (the checkpoint was written
//     first), then resumable as it was. Never stopped or failed.
//   - resume: nothing. Running (the restarted daemon finishes the resume
//     the kill cut short) or paused (the kill came before the resume
//     began), then resumable. Never stopped or failed.
var crashOutcomes = map[string][]string{
	"create":  {"never made", "failed", "running"},
	"destroy": {"running", "stopped"},
	"pause":   {"running", "paused"},
	"resume":  {"running", "paused"},
}

// killPoint is when to kill cubicled, after an operation that takes
// about took undisturbed began, for the nth of n kills during it: a
// random point of the nth of n equal slices of 110 % of took (the kill
// may come just after it ends, too). So any n, 2 included, kills both
// early (in the first steps of the operation) and late.
func killPoint(nth, n int, took time.Duration) time.Duration {
	span := int64(took) * 11 / 10 / int64(max(n, 1))
	return time.Duration(int64(nth)*span + rand.Int64N(max(span, 1)))
}

// settled waits until sb is in no passing state: a resume the restart
// cut short is finished by the restarted daemon, in the background.
// pausing is never seen after a restart (a pause the kill cut short
// leaves the sandbox running, or paused when it had got far enough).
func settled(t *testing.T, c *client.Client, sb client.Sandbox) client.Sandbox {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for sb.State == client.StateResuming && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		got, err := c.Get(context.Background(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		sb = got
	}
	return sb
}

// assertUsable checks that a sandbox the restarted daemon calls running
// answers: a command prints, a screenshot is a PNG of its size.
func assertUsable(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: "echo usable"})
	if err != nil || res.Stdout != "usable\n" {
		t.Errorf("%s: exec after the restart: %+v %v", id, res, err)
	}
	shot, err := c.Screenshot(ctx, id, client.ScreenshotOptions{})
	if err != nil {
		t.Errorf("%s: screenshot after the restart: %v", id, err)
		return
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil || img.Bounds().Dx() != 800 || img.Bounds().Dy() != 600 {
		t.Errorf("%s: screenshot after the restart: %v (%d bytes)", id, err, len(shot))
	}
}

// assertCrashClean checks that nothing of a stopped sandbox is left on the
// host: processes, mounts, files under the data dir, and its network.
func assertCrashClean(t *testing.T, dataDir string, sb client.Sandbox) {
	t.Helper()
	ok := eventually(30*time.Second, func() bool {
		return len(harness.HostProcesses(sb.ID)) == 0 && len(crashTraces(dataDir, sb.ID)) == 0
	})
	if !ok {
		t.Errorf("%s (%s): left behind: processes %v, %s", sb.ID, sb.State, harness.HostProcesses(sb.ID), strings.Join(crashTraces(dataDir, sb.ID), "; "))
	}
	if sb.IP != "" {
		assertNetGone(t, dataDir, sb)
	} else if _, err := os.Stat("/run/netns/cubicle-" + sb.ID); err == nil {
		t.Errorf("%s: network namespace left", sb.ID)
	}
}

// crashTraces lists the mounts, data-dir paths, network namespace and
// loop devices that name id.
func crashTraces(dataDir, id string) []string {
	var left []string
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, id) {
			left = append(left, "mount "+line)
		}
	}
	filepath.WalkDir(dataDir, func(p string, e os.DirEntry, err error) error {
		if err == nil && strings.Contains(e.Name(), id) {
			left = append(left, "path "+p)
		}
		return nil
	})
	if _, err := os.Stat("/run/netns/cubicle-" + id); err == nil {
		left = append(left, fmt.Sprintf("netns /run/netns/cubicle-%s", id))
	}
	for _, l := range loopsOf(id) {
		left = append(left, "loop device "+l)
	}
	return left
}

// assertHostAsBefore checks, waiting up to 30 s for the restarted daemon's
// clean-up, that the host holds nothing that it did not hold in before
// (snapshotHost: processes, mounts, loop devices, network namespaces,
// links, nft rules, cgroups, jails, data-dir paths) and that the address
// pool has as many free addresses as then.
func assertHostAsBefore(t *testing.T, d *harness.Daemon, dataDir string, before hostState, free float64, what string) {
	t.Helper()
	var added []string
	if !eventually(30*time.Second, func() bool {
		added = snapshotHost(dataDir, d.Pid()).newSince(before)
		return len(added) == 0
	}) {
		t.Errorf("%s: new on the host since before the round:\n%s", what, strings.Join(added, "\n"))
	}
	if got := metricValue(t, d, "cubicle_netpool_free"); got != free {
		t.Errorf("%s: %v addresses free, %v before the round", what, got, free)
	}
}

// catalogLines shows catalog entries as "ID on NODE: STATE".
func catalogLines(es []cluster.Entry) string {
	var out []string
	for _, e := range es {
		out = append(out, fmt.Sprintf("%s on %s: %s", e.ID, e.Node, e.State))
	}
	return "[" + strings.Join(out, ", ") + "]"
}
