package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
)

// TestSnapshot takes a snapshot of a logged-in desktop, on real QEMU and
// real gVisor, destroys the desktop, and starts sandboxes from the
// snapshot, as a user would to "log in once, start ready many times":
// each shows the logged-in page and reloads it from the site logged in;
// each has the file written before the snapshot and none written after;
// their machine-ids and addresses are their own; the snapshot survives a
// kill -9 of cubicled (and another sandbox starts from it after the
// restart); bad requests are refused and change nothing; deleting the
// snapshot removes its files while the sandboxes from it run on, and
// destroying those leaves nothing. (runc's refusal: TestFork.)
func TestSnapshot(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Command(t, "nft")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	site := serveLoginSite(t)
	for i, backend := range selectedBackends("qemu", "gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testSnapshot(t, site, backend, i)
		})
	}
}

func testSnapshot(t *testing.T, site *loginSite, backend string, i int) {
	d, c := startDaemonArgs(t, backend, "--net", "--net-bridge", "cbsnap"+strconv.Itoa(i), "--net-cidr", "10.92."+strconv.Itoa(i)+".0/24")
	bg := context.Background()
	dataDir := filepath.Dir(d.Log)

	src, err := c.Create(bg, client.CreateRequest{Backend: backend, StartURL: "http://192.0.2.1:8080/login",
		Network: &client.Network{Allow: []string{"192.0.2.1/32"}}})
	if err != nil {
		t.Fatal(err)
	}
	vmShows(t, c, src.ID, loginBlue, "the source's login page")
	if _, err := c.Actions(bg, src.ID, client.ClickAt(512, 400)); err != nil {
		t.Fatal(err)
	}
	vmShows(t, c, src.ID, inGreen, "the source, logged in")
	sh := func(id, script string) string {
		t.Helper()
		res, err := c.Exec(bg, id, client.ExecRequest{Argv: []string{"sh", "-c", script}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q in %s: %+v, %v", script, id, res, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	sh(src.ID, "echo before > /root/note; sync")
	srcMachineID := sh(src.ID, "cat /etc/machine-id")

	t0 := time.Now()
	snap, err := c.CreateSnapshot(bg, src.ID, client.SnapshotOptions{Name: "alice-in", Metadata: map[string]string{"site": "192.0.2.1"}})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Logf("snapshot of a logged-in %s desktop in %v: %d MiB", backend, time.Since(t0).Round(time.Millisecond), snap.SizeBytes>>20)
	if snap.SandboxID != src.ID || snap.Name != "alice-in" || snap.Backend != backend || snap.SizeBytes < 10<<20 || snap.Metadata["site"] != "192.0.2.1" {
		t.Errorf("snapshot %+v", snap)
	}
	// The source runs on, and what it does from now on is its own.
	sh(src.ID, "echo after > /root/note; sync")
	vmShows(t, c, src.ID, inGreen, "the source after the snapshot")
	if _, err := c.CreateSnapshot(bg, src.ID, client.SnapshotOptions{Name: "alice-in"}); !client.IsConflict(err) {
		t.Errorf("a second snapshot named alice-in: %v, want conflict", err)
	}
	if err := c.Destroy(bg, src.ID); err != nil {
		t.Fatal(err)
	}

	// Bad creates from it change nothing.
	for _, req := range []client.CreateRequest{
		{FromSnapshot: "alice-in", Resolution: &client.Resolution{Width: 800, Height: 600}},
		{FromSnapshot: "alice-in", StartURL: "http://192.0.2.1:8080/"},
		{FromSnapshot: "alice-in", Env: map[string]string{"A": "b"}},
	} {
		if _, err := c.Create(bg, req); !client.IsInvalidArgument(err) {
			t.Errorf("create %+v: %v, want invalid_argument", req, err)
		}
	}
	if _, err := c.Create(bg, client.CreateRequest{FromSnapshot: "nobody"}); !client.IsNotFound(err) {
		t.Errorf("create from an unknown snapshot: %v, want not_found", err)
	}
	if live, err := c.List(bg, client.ListOptions{State: client.StateRunning}); err != nil || len(live) != 0 {
		t.Errorf("refused creates left %+v (%v)", live, err)
	}

	machineIDs := map[string]string{srcMachineID: src.ID}
	ips := map[string]bool{}
	check := func(sb client.Sandbox) {
		t.Helper()
		if sb.State != client.StateRunning || sb.FromSnapshot != snap.ID || sb.IP == "" || ips[sb.IP] {
			t.Errorf("sandbox from the snapshot: %+v", sb)
		}
		ips[sb.IP] = true
		vmShows(t, c, sb.ID, inGreen, "sandbox "+sb.ID+" from the snapshot")
		if got := sh(sb.ID, "cat /root/note"); got != "before" {
			t.Errorf("%s: /root/note holds %q, want the snapshot's %q", sb.ID, got, "before")
		}
		out := strings.Fields(sh(sb.ID, "cat /etc/machine-id; hostname"))
		if len(out) != 2 || out[1] != "cubicle-"+sb.ID[:12] {
			t.Errorf("%s: machine-id and hostname %q", sb.ID, out)
		} else if other, dup := machineIDs[out[0]]; dup {
			t.Errorf("%s has the machine-id of %s", sb.ID, other)
		} else {
			machineIDs[out[0]] = sb.ID
		}
		// The page reloads from the site, logged in, from the
		// sandbox's own address.
		site.mu.Lock()
		n := len(site.seen)
		site.mu.Unlock()
		if _, err := c.Actions(bg, sb.ID, client.PressKey("F5")); err != nil {
			t.Fatal(err)
		}
		if !eventually(90*time.Second, func() bool {
			site.mu.Lock()
			defer site.mu.Unlock()
			return slices.Contains(site.seen[n:], "GET / in")
		}) {
			t.Errorf("%s: a reload did not reach the site logged in", sb.ID)
		}
	}
	// Saying nothing of egress, they have the snapshot's policy (the
	// site allowed), as the reloads below show.
	var made []client.Sandbox
	for i := range 2 {
		t0 := time.Now()
		sb, err := c.Create(bg, client.CreateRequest{FromSnapshot: []string{"alice-in", snap.ID}[i]})
		if err != nil {
			t.Fatalf("create from the snapshot: %v", err)
		}
		t.Logf("create from the snapshot on %s: %v", backend, time.Since(t0).Round(time.Millisecond))
		check(sb)
		made = append(made, sb)
	}

	// The snapshot survives the daemon's death.
	d.Kill9()
	rctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	if err := d.Restart(rctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetSnapshot(bg, "alice-in")
	if err != nil || got.ID != snap.ID || got.SizeBytes != snap.SizeBytes {
		t.Fatalf("after a restart: %+v, %v; want %+v", got, err, snap)
	}
	sb, err := c.Create(bg, client.CreateRequest{FromSnapshot: "alice-in"})
	if err != nil {
		t.Fatalf("create from the snapshot after a restart: %v", err)
	}
	check(sb)

	// A sandbox from a snapshot forks, and its fork lives on its own:
	// through a pause and resume of its parent, the parent's end, and
	// a pause and resume of its own (which boots its own kernel and
	// initramfs again).
	forks, err := c.Fork(bg, sb.ID, 1)
	if err != nil {
		t.Fatalf("fork of a sandbox from the snapshot: %v", err)
	}
	child := forks[0]
	if _, err := c.Pause(bg, sb.ID); err != nil {
		t.Fatalf("pause the fork's parent: %v", err)
	}
	if _, err := c.Resume(bg, sb.ID, 0); err != nil {
		t.Fatalf("resume the fork's parent: %v", err)
	}
	if got := sh(child.ID, "cat /root/note"); got != "before" {
		t.Errorf("the fork after its parent's pause and resume: %q", got)
	}
	if err := c.Destroy(bg, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, d, backend, sb.ID)
	if _, err := c.Pause(bg, child.ID); err != nil {
		t.Fatalf("pause the fork once its parent is gone: %v", err)
	}
	if _, err := c.Resume(bg, child.ID, 0); err != nil {
		t.Fatalf("resume the fork once its parent is gone: %v", err)
	}
	vmShows(t, c, child.ID, inGreen, "the fork of a sandbox from the snapshot")
	made = append(made, child)

	// A policy of its own wins: with egress none the site is out of reach.
	closed, err := c.Create(bg, client.CreateRequest{FromSnapshot: "alice-in", Network: &client.Network{Egress: client.EgressNone}})
	if err != nil {
		t.Fatalf("create from the snapshot with egress none: %v", err)
	}
	if got := sh(closed.ID, "timeout 5 bash -c 'echo > /dev/tcp/192.0.2.1/8080' 2>/dev/null && echo open || echo closed"); got != "closed" {
		t.Errorf("from the snapshot with egress none, the site is %s", got)
	}
	made = append(made, closed)

	// Deleting it frees its files; what started from it runs on.
	if err := c.DeleteSnapshot(bg, "alice-in"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "snapshots", snap.ID)); !os.IsNotExist(err) {
		t.Errorf("the snapshot's directory after delete: %v", err)
	}
	if list, _ := c.ListSnapshots(bg, ""); len(list) != 0 {
		t.Errorf("snapshots after delete: %+v", list)
	}
	for _, sb := range made {
		if got := sh(sb.ID, "cat /root/note"); got != "before" {
			t.Errorf("%s after its snapshot was deleted: %q", sb.ID, got)
		}
	}
	for _, sb := range made {
		if err := c.Destroy(bg, sb.ID); err != nil {
			t.Fatal(err)
		}
		assertNoTrace(t, d, backend, sb.ID)
	}
	assertNoTrace(t, d, backend, src.ID)
}
