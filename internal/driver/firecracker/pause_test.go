package firecracker

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// guestMemory asks the fake's stand-in agent for the guest's memory, or
// sets it (set != "").
func guestMemory(t *testing.T, b driver.Box, set string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := b.DialAgent(ctx)
	if err != nil {
		t.Fatalf("dial agent: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := "MEM?\n"
	if set != "" {
		msg = "MEM=" + set + "\n"
	}
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("agent: %v", err)
	}
	return strings.TrimSuffix(line, "\n")
}

// jailHas reports which of names are in the jail's chroot.
func jailHas(p paths, names ...string) []string {
	var out []string
	for _, n := range names {
		if _, err := os.Lstat(p.host(n)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

var snapshotNames = []string{snapshotFile, memoryFile, snapshotPart, memoryPart, snapshotResumed}

// TestPauseResumeConversation pauses and resumes a VM twice against the
// recording fake: every request Firecracker would get, in order, checked
// against its API description; the guest's memory (the stand-in agent's
// state, which only the snapshot keeps) is back after each resume; a
// paused VM holds no process and its jail the snapshot; the jailer finds
// the jail as on a first run; and Stop leaves nothing.
func TestPauseResumeConversation(t *testing.T) {
	fake := newFake(t)
	d := newFakeDriver(t, fake, testLimits)
	spec := testSpec(testImage(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	p := d.paths(spec.ID)
	for round, mem := range []string{"the typed text", "more typed text"} {
		if got := guestMemory(t, db, mem); got != "ok" {
			t.Fatalf("set guest memory: %q", got)
		}
		n := len(fake.requests())
		paused, err := d.Pause(ctx, db)
		if err != nil {
			t.Fatalf("round %d: pause: %v", round, err)
		}
		want := []request{
			{"PATCH", "/vm", map[string]any{"state": "Paused"}},
			{"PUT", "/snapshot/create", map[string]any{"snapshot_type": "Full", "snapshot_path": "/vm.snap.part", "mem_file_path": "/vm.mem.part"}},
		}
		if diff := cmp.Diff(want, fake.requests()[n:]); diff != "" {
			t.Errorf("round %d: pause conversation (-want +got):\n%s", round, diff)
		}
		select {
		case <-db.Wait():
		default:
			t.Errorf("round %d: the paused box's Wait is open", round)
		}
		var data boxData
		if d, err := d.decode(paused.State); err != nil {
			t.Fatal(err)
		} else {
			data = d
		}
		if !data.Paused || data.Pid != 0 {
			t.Errorf("round %d: paused state %+v", round, data)
		}
		old := db.(*box).data
		if _, ok := processStart(old.Pid); ok {
			t.Errorf("round %d: firecracker pid %d still running while paused", round, old.Pid)
		}
		if got := jailHas(p, snapshotNames...); !cmp.Equal(got, []string{snapshotFile, memoryFile}) {
			t.Errorf("round %d: snapshot files in the jail: %q", round, got)
		}
		if got := jailHas(p, "/dev", "/firecracker", apiSockName, vsockName, "/firecracker.pid"); len(got) > 0 {
			t.Errorf("round %d: a paused jail keeps %q", round, got)
		}
		if got := jailHas(p, diskName, configName, kernelName); len(got) != 3 {
			t.Errorf("round %d: the paused jail lost its disk or config: has %q", round, got)
		}
		if paused.Bytes < 1<<20 {
			t.Errorf("round %d: paused bytes %d, want at least the memory file's 1 MiB", round, paused.Bytes)
		}
		if _, err := db.DialAgent(ctx); err == nil {
			t.Errorf("round %d: the paused box's agent still answers", round)
		}
		if err := db.Stop(ctx); err != nil {
			t.Errorf("round %d: Stop of the paused box: %v", round, err)
		}
		if _, err := os.Stat(p.host(snapshotFile)); err != nil {
			t.Fatalf("round %d: Stop of the paused box removed its snapshot: %v", round, err)
		}

		n = len(fake.requests())
		taps := len(fake.tapsGiven)
		db, err = d.Resume(ctx, paused)
		if err != nil {
			t.Fatalf("round %d: resume: %v", round, err)
		}
		want = []request{
			{"GET", "/", nil},
			{"PUT", "/logger", map[string]any{"log_path": "/firecracker.log", "level": "Warning", "show_level": true, "show_log_origin": false}},
			{"PUT", "/metrics", map[string]any{"metrics_path": "/metrics.json"}},
			{"PUT", "/snapshot/load", map[string]any{
				"snapshot_path": "/vm.snap", "mem_backend": map[string]any{"backend_type": "File", "backend_path": "/vm.mem"},
				"enable_diff_snapshots": false, "resume_vm": false,
			}},
			{"PATCH", "/vm", map[string]any{"state": "Resumed"}},
		}
		if diff := cmp.Diff(want, fake.requests()[n:]); diff != "" {
			t.Errorf("round %d: resume conversation (-want +got):\n%s", round, diff)
		}
		if got := fake.tapsGiven[taps:]; len(got) != 1 || !strings.Contains(got[0], "tap-fc1") {
			t.Errorf("round %d: TAP given on resume: %q", round, got)
		}
		if !strings.Contains(strings.Join(fake.args, " "), "--id fc1 ") || !strings.Contains(strings.Join(fake.args, " "), "memory.max=") {
			t.Errorf("round %d: jailer args on resume %q", round, fake.args)
		}
		if got := guestMemory(t, db, ""); got != mem {
			t.Errorf("round %d: guest memory after resume %q, want %q", round, got, mem)
		}
		if got := jailHas(p, snapshotNames...); len(got) > 0 {
			t.Errorf("round %d: a resumed VM's jail keeps %q", round, got)
		}
	}
	data := db.(*box).data
	if err := db.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s := d.strays(data); len(s) > 0 {
		t.Errorf("after Stop: %q", s)
	}
}

// TestPauseFailureRunsOn: a snapshot Firecracker refuses leaves the VM
// running as it was, its vCPUs let go again and no file of the attempt
// left.
func TestPauseFailureRunsOn(t *testing.T) {
	fake := newFake(t)
	d := newFakeDriver(t, fake, testLimits)
	spec := testSpec(testImage(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	guestMemory(t, b, "kept")
	fake.mu.Lock()
	fake.fail["/snapshot/create"] = "No space left on device (os error 28)"
	fake.mu.Unlock()
	n := len(fake.requests())
	if _, err := d.Pause(ctx, b); err == nil || !strings.Contains(err.Error(), "No space left") {
		t.Fatalf("pause with a failing snapshot: %v", err)
	}
	reqs := fake.requests()[n:]
	if len(reqs) != 3 || reqs[2].Path != "/vm" || reqs[2].Body.(map[string]any)["state"] != "Resumed" {
		t.Errorf("after the refused snapshot, requests %v; want the vCPUs resumed", reqs)
	}
	select {
	case <-b.Wait():
		t.Fatal("the box died")
	default:
	}
	if got := guestMemory(t, b, ""); got != "kept" {
		t.Errorf("guest memory %q after the failed pause", got)
	}
	if got := jailHas(d.paths(spec.ID), snapshotNames...); len(got) > 0 {
		t.Errorf("the failed pause left %q", got)
	}
}

// TestResumeFailureKeepsSnapshot: a snapshot Firecracker fails to load
// (it then exits, as Firecracker does) leaves no process and the
// snapshot as it was, so a second Resume succeeds.
func TestResumeFailureKeepsSnapshot(t *testing.T) {
	fake := newFake(t)
	d := newFakeDriver(t, fake, testLimits)
	spec := testSpec(testImage(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	guestMemory(t, b, "saved")
	paused, err := d.Pause(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	fake.fail["/snapshot/load"] = "Cannot restore devices"
	fake.mu.Unlock()
	if _, err := d.Resume(ctx, paused); err == nil || errors.Is(err, driver.ErrResumeLost) {
		t.Fatalf("resume with a failing load: %v, want an error that keeps the snapshot", err)
	}
	fake.mu.Lock()
	pid := fake.proc.Process.Pid
	delete(fake.fail, "/snapshot/load")
	fake.mu.Unlock()
	if _, ok := processStart(pid); ok {
		t.Errorf("the failed resume left firecracker pid %d running", pid)
	}
	p := d.paths(spec.ID)
	if got := jailHas(p, snapshotNames...); !cmp.Equal(got, []string{snapshotFile, memoryFile}) {
		t.Errorf("after the failed resume the jail has %q", got)
	}
	b, err = d.Resume(ctx, paused)
	if err != nil {
		t.Fatalf("second resume: %v", err)
	}
	if got := guestMemory(t, b, ""); got != "saved" {
		t.Errorf("guest memory %q", got)
	}
	data := b.(*box).data
	b.Stop(ctx)
	if s := d.strays(data); len(s) > 0 {
		t.Errorf("after Stop: %q", s)
	}
}

// TestSettle covers what a daemon killed in the middle of a pause
// leaves, as a new driver (the restarted daemon) finds it from the
// running box's State: vCPUs stopped and a half-written snapshot (the
// VM runs on), a complete snapshot and no VMM (paused), and no VMM and
// no snapshot (a dead box, which Stop frees).
func TestSettle(t *testing.T) {
	for _, tc := range []string{"vcpus stopped", "snapshot complete", "gone"} {
		t.Run(tc, func(t *testing.T) {
			fake := newFake(t)
			base := t.TempDir()
			cfg := testLimits
			cfg.ChrootBase = base
			d := newFakeDriver(t, fake, cfg)
			spec := testSpec(testImage(t))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b, err := d.Create(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			guestMemory(t, b, "before the crash")
			st := b.State()
			p := d.paths(spec.ID)
			switch tc {
			case "vcpus stopped":
				if err := newAPIClient(p.host(apiSockName)).setVMState(ctx, vmPaused); err != nil {
					t.Fatal(err)
				}
				os.WriteFile(p.host(snapshotPart), []byte("half"), 0o600)
			case "snapshot complete":
				if _, err := d.Pause(ctx, b); err != nil {
					t.Fatal(err)
				}
			case "gone":
				b.(*box).kill()
			}
			b.(*box).stopWatch() // the old daemon is gone

			d2 := newFakeDriver(t, fake, cfg)
			n := len(fake.requests())
			nb, paused, err := d2.Settle(ctx, st)
			if err != nil {
				t.Fatal(err)
			}
			switch tc {
			case "vcpus stopped":
				if nb == nil || paused != nil || isClosed(nb.Wait()) {
					t.Fatalf("settle: box %v, paused %v; want the VM running", nb, paused)
				}
				if reqs := fake.requests()[n:]; len(reqs) != 2 || reqs[1].Path != "/vm" {
					t.Errorf("settle requests %v; want GET / and the vCPUs resumed", reqs)
				}
				if got := guestMemory(t, nb, ""); got != "before the crash" {
					t.Errorf("guest memory %q", got)
				}
				if got := jailHas(p, snapshotNames...); len(got) > 0 {
					t.Errorf("settled jail keeps %q", got)
				}
				nb.Stop(ctx)
			case "snapshot complete":
				if nb != nil || paused == nil {
					t.Fatalf("settle: box %v, paused %v; want paused", nb, paused)
				}
				rb, err := d2.Resume(ctx, *paused)
				if err != nil {
					t.Fatal(err)
				}
				if got := guestMemory(t, rb, ""); got != "before the crash" {
					t.Errorf("guest memory after resume %q", got)
				}
				rb.Stop(ctx)
			case "gone":
				if nb == nil || paused != nil || !isClosed(nb.Wait()) {
					t.Fatalf("settle: box %v, paused %v; want a dead box", nb, paused)
				}
				if err := nb.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(p.JailDir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("jail after Stop: %v", err)
				}
			}
		})
	}
}

// TestResumeAdoptsInterrupted: a daemon killed after a resume loaded
// the snapshot (its store still says paused) finds the VM running on a
// second Resume, which adopts it rather than loading the snapshot over
// a disk that has gone on. The stand-in VMM is pivoted into the jail,
// as the jailer leaves Firecracker, so the driver can tell it is the
// jail's.
func TestResumeAdoptsInterrupted(t *testing.T) {
	fake := newFake(t)
	fake.pivot = true
	cfg := testLimits
	cfg.ChrootBase = t.TempDir()
	d := newFakeDriver(t, fake, cfg)
	spec := testSpec(testImage(t))
	spec.Net = nil
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	guestMemory(t, b, "x")
	paused, err := d.Pause(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := d.Resume(ctx, paused)
	if err != nil {
		t.Fatal(err)
	}
	rb.(*box).stopWatch() // the daemon dies; its store still says paused
	n := len(fake.requests())
	ab, err := newFakeDriver(t, fake, cfg).Resume(ctx, paused)
	if err != nil {
		t.Fatalf("second resume: %v", err)
	}
	if got := ab.(*box).data.Pid; got != rb.(*box).data.Pid {
		t.Errorf("adopted pid %d, want the running VMM's %d", got, rb.(*box).data.Pid)
	}
	for _, r := range fake.requests()[n:] {
		if r.Path == "/snapshot/load" {
			t.Errorf("the snapshot was loaded again")
		}
	}
	if got := guestMemory(t, ab, ""); got != "x" {
		t.Errorf("guest memory %q", got)
	}
	data := ab.(*box).data
	if err := ab.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s := d.strays(data); len(s) > 0 {
		t.Errorf("after Stop: %q", s)
	}
}

// TestDiscard removes a paused VM's jail.
func TestDiscard(t *testing.T) {
	fake := newFake(t)
	d := newFakeDriver(t, fake, testLimits)
	spec := testSpec(testImage(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	paused, err := d.Pause(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := d.Discard(ctx, paused); err != nil {
			t.Fatalf("discard %d: %v", i, err)
		}
	}
	if _, err := os.Stat(d.paths(spec.ID).JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail after Discard: %v", err)
	}
	if _, err := d.Resume(ctx, paused); err == nil {
		t.Error("resume after Discard succeeded")
	}
}
