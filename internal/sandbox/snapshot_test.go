package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
)

// snapDriver is fakeDriver that snapshots: a snapshot is a file in its
// directory naming the box it was taken of, and a restore is a new fake
// box made once that file is read (a test double; the qemu driver's real
// snapshots run in test/e2e).
type snapDriver struct {
	*fakeDriver
	snapErr    error
	restoreErr error
	// hold, when set, keeps each Restore waiting until it is closed.
	hold     chan struct{}
	restored []restoreCall
}

type restoreCall struct {
	from string // the box the snapshot was taken of, read from its file
	dir  string
	spec driver.Spec
}

func (d *snapDriver) CanSnapshot(context.Context) error { return nil }

func (d *snapDriver) Snapshot(ctx context.Context, b driver.Box, dir string) (driver.Snapshot, error) {
	if d.snapErr != nil {
		// What a real driver wrote before it failed is the caller's to
		// remove.
		os.WriteFile(filepath.Join(dir, "memory.part"), []byte("half"), 0o600)
		return driver.Snapshot{}, d.snapErr
	}
	id := b.(*fakeBox).id
	if err := os.WriteFile(filepath.Join(dir, "memory"), []byte(id), 0o600); err != nil {
		return driver.Snapshot{}, err
	}
	data, _ := json.Marshal(id)
	// The fake's boxes have 2 vCPUs and 1 GiB unless the create said.
	return driver.Snapshot{State: driver.State{Version: 7, Driver: "gvisor", Data: data}, Bytes: 4096, VCPUs: 2, MemoryMB: 1024}, nil
}

func (d *snapDriver) Restore(ctx context.Context, s driver.State, dir string, spec driver.Spec) (driver.Box, error) {
	if d.hold != nil {
		<-d.hold
	}
	if d.restoreErr != nil {
		return nil, d.restoreErr
	}
	from, err := os.ReadFile(filepath.Join(dir, "memory"))
	if err != nil {
		return nil, fmt.Errorf("fake restore: %w", err)
	}
	var id string
	if s.Version != 7 || json.Unmarshal(s.Data, &id) != nil || id != string(from) {
		return nil, fmt.Errorf("fake restore: state %+v is not the snapshot's (%s)", s, from)
	}
	d.mu.Lock()
	d.restored = append(d.restored, restoreCall{from: id, dir: dir, spec: spec})
	d.mu.Unlock()
	return d.Create(ctx, spec)
}

func newSnapManager(t *testing.T, d driver.Driver, n NetPool, dataDir string, maxSnaps int) *Manager {
	t.Helper()
	cfg := Config{
		DataDir: dataDir, Drivers: map[string]driver.Driver{"gvisor": d}, DefaultBackend: "auto",
		Images: func(string) (string, error) { return "/nonexistent", nil }, MaxSandboxes: 8,
		IdleTimeout: time.Minute, MaxLifetime: time.Hour, ReapInterval: time.Hour, Metrics: metrics.New(),
		MaxSnapshotsPerOwner: maxSnaps,
		// These tests count restores of users' snapshots; boot
		// templates have theirs (template_test.go).
		NoTemplates: true,
	}
	if n != nil {
		cfg.Network = n
	}
	m, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSnapshotRestore(t *testing.T) {
	ctx := context.Background()
	sd := &snapDriver{fakeDriver: newFakeDriver(t)}
	n := newFakeNet()
	dataDir := t.TempDir()
	m := newSnapManager(t, sd, n, dataDir, 0)
	defer m.Close()
	src, err := m.Create(ctx, CreateRequest{Owner: "key-a", Resolution: Resolution{Width: 800, Height: 600}, DPI: 120,
		Env: map[string]string{"SESSION": "one"}, Metadata: map[string]string{"who": "source"},
		Network: Network{Allow: []string{"192.0.2.0/24"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	srcToken := m.entries[src.ID].rec.Token
	m.mu.Unlock()

	s, err := m.CreateSnapshot(ctx, src.ID, "key-a", "logged-in", map[string]string{"step": "1"})
	if err != nil {
		t.Fatal(err)
	}
	if s.SandboxID != src.ID || s.Name != "logged-in" || s.Resolution != src.Resolution || s.Backend != "gvisor" ||
		s.Template != "desktop" || s.SizeBytes != 4096 || s.Metadata["step"] != "1" || s.ID == src.ID ||
		s.VCPUs != 2 || s.MemoryMB != 1024 {
		t.Errorf("snapshot %+v", s)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "snapshots", s.ID, "memory")); err != nil {
		t.Errorf("the snapshot's files: %v", err)
	}
	if got, _ := m.Get(ctx, src.ID); got.State != StateRunning {
		t.Errorf("the source is %s after the snapshot", got.State)
	}
	// The source can go: the snapshot does not need it.
	if err := m.Destroy(ctx, src.ID); err != nil {
		t.Fatal(err)
	}

	tokens := map[string]bool{srcToken: true}
	var made []Sandbox
	for i, ref := range []string{s.ID, "logged-in"} {
		// The second names the shape the snapshot has (its defaults):
		// that is no mismatch.
		req := CreateRequest{Owner: "key-a", FromSnapshot: ref, Metadata: map[string]string{"n": fmt.Sprint(i)}}
		if i == 1 {
			req.VCPUs, req.MemoryMB = 2, 1024
		}
		sb, err := m.Create(ctx, req, true)
		if err != nil {
			t.Fatalf("create from %s: %v", ref, err)
		}
		if sb.State != StateRunning || sb.FromSnapshot != s.ID || sb.Resolution != src.Resolution || sb.Metadata["n"] != fmt.Sprint(i) ||
			sb.ID == src.ID || sb.IP == "" {
			t.Errorf("sandbox from %s: %+v", ref, sb)
		}
		rk, ok := sd.rekeyed[sb.ID]
		if !ok {
			t.Fatalf("sandbox %s from the snapshot was not re-keyed", sb.ID)
		}
		if rk.callToken != srcToken {
			t.Errorf("re-keyed with %q, want the source's token (its agent's until then)", rk.callToken)
		}
		if tokens[rk.req.Token] {
			t.Errorf("sandbox %s got a token another has", sb.ID)
		}
		tokens[rk.req.Token] = true
		if rk.req.OldAddr != src.IP+"/24" || rk.req.Addr != sb.IP+"/24" {
			t.Errorf("renumbered %s → %s, want %s/24 → %s/24", rk.req.OldAddr, rk.req.Addr, src.IP, sb.IP)
		}
		m.mu.Lock()
		rec := m.entries[sb.ID].rec
		got, env, dpi := rec.Token, rec.Request.Env["SESSION"], rec.Request.DPI
		m.mu.Unlock()
		if got != rk.req.Token || env != "one" || dpi != 120 {
			t.Errorf("record: token %q env %q dpi %d; want the re-key's token and the snapshot's env and dpi", got, env, dpi)
		}
		if _, err := m.Agent(ctx, sb.ID); err != nil {
			t.Errorf("Agent(%s): %v", sb.ID, err)
		}
		// Saying nothing of egress, it has the source's policy.
		n.mu.Lock()
		allow := n.allow[sb.ID]
		n.mu.Unlock()
		if !slices.Equal(allow, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}) {
			t.Errorf("%s: egress %v, want the source's", sb.ID, allow)
		}
		made = append(made, sb)
	}
	// A policy of its own wins.
	closed, err := m.Create(ctx, CreateRequest{Owner: "key-a", FromSnapshot: s.ID, Network: Network{Egress: "none"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	allow := n.allow[closed.ID]
	n.mu.Unlock()
	if len(allow) != 0 {
		t.Errorf("from the snapshot with egress none: %v", allow)
	}
	sd.mu.Lock()
	calls := slices.Clone(sd.restored)
	sd.mu.Unlock()
	if len(calls) != 3 || calls[0].from != src.ID || calls[0].dir != filepath.Join(dataDir, "snapshots", s.ID) ||
		calls[0].spec.ID != made[0].ID || calls[1].spec.ID != made[1].ID || calls[0].spec.Width != 800 {
		t.Errorf("restores %+v", calls)
	}

	// Another key sees nothing of it.
	if _, err := m.GetSnapshot(ctx, "key-b", s.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's Get: %v", err)
	}
	if _, err := m.Create(ctx, CreateRequest{Owner: "key-b", FromSnapshot: s.ID}, true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's create from it: %v", err)
	}
	if err := m.DeleteSnapshot(ctx, "key-b", "logged-in"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's delete: %v", err)
	}
	if got := m.ListSnapshots(ctx, "key-b", ""); len(got) != 0 {
		t.Errorf("another key lists %+v", got)
	}
	if got := m.ListSnapshots(ctx, "key-a", src.ID); len(got) != 1 || got[0].ID != s.ID {
		t.Errorf("list by sandbox: %+v", got)
	}
	if got := m.ListSnapshots(ctx, "key-a", made[0].ID); len(got) != 0 {
		t.Errorf("list by another sandbox: %+v", got)
	}

	if err := m.DeleteSnapshot(ctx, "key-a", "logged-in"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "snapshots", s.ID)); !os.IsNotExist(err) {
		t.Errorf("the snapshot's directory after delete: %v", err)
	}
	if got := m.ListSnapshots(ctx, "key-a", ""); len(got) != 0 {
		t.Errorf("listed after delete: %+v", got)
	}
	// What was started from it runs on.
	for _, sb := range made {
		if got, _ := m.Get(ctx, sb.ID); got.State != StateRunning {
			t.Errorf("%s is %s after its snapshot was deleted", sb.ID, got.State)
		}
	}
	if err := m.DeleteSnapshot(ctx, "key-a", s.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a second delete: %v", err)
	}
}

func TestSnapshotRefusals(t *testing.T) {
	ctx := context.Background()
	sd := &snapDriver{fakeDriver: newFakeDriver(t)}
	dataDir := t.TempDir()
	m := newSnapManager(t, sd, nil, dataDir, 2)
	defer m.Close()
	src, err := m.Create(ctx, CreateRequest{Owner: "key-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	nothingKept := func(what string, want int) {
		t.Helper()
		got := 0
		m.mu.Lock()
		for range m.snaps {
			got++
		}
		m.mu.Unlock()
		stored, _ := m.store.allSnapshots()
		dirs, _ := filepath.Glob(filepath.Join(dataDir, "snapshots", "*"))
		if got != want || len(stored) != want || len(dirs) != want {
			t.Errorf("%s: %d snapshots, %d stored, %d directories; want %d of each", what, got, len(stored), len(dirs), want)
		}
		if sb, _ := m.Get(ctx, src.ID); sb.State != StateRunning {
			t.Errorf("%s: the source is %s", what, sb.State)
		}
	}
	for _, c := range []struct {
		name, id, snapName string
		md                 map[string]string
		want               error
	}{
		{"unknown sandbox", "nope", "", nil, errdefs.ErrNotFound},
		{"bad name", src.ID, "Bad Name", nil, errdefs.ErrInvalid},
		{"name with ..", src.ID, "a..b", nil, errdefs.ErrInvalid},
		{"bad metadata", src.ID, "", map[string]string{"": "x"}, errdefs.ErrInvalid},
		{"a name of an ID's form", src.ID, "abcdefghijklmnopqrstuvwxyz", nil, errdefs.ErrInvalid},
	} {
		if _, err := m.CreateSnapshot(ctx, c.id, "key-a", c.snapName, c.md); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		nothingKept(c.name, 0)
	}
	sd.snapErr = errors.New("fake: migration failed")
	if _, err := m.CreateSnapshot(ctx, src.ID, "key-a", "", nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a failed snapshot: %v", err)
	}
	nothingKept("a failed snapshot", 0)
	m.freeBytes = func(string) (int64, error) { return 1 << 20, nil }
	if _, err := m.CreateSnapshot(ctx, src.ID, "key-a", "", nil); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "data directory is full") {
		t.Errorf("a snapshot on a full data directory: %v, want unavailable saying so", err)
	}
	nothingKept("a full data directory", 0)
	m.freeBytes = freeSpace
	sd.snapErr = fmt.Errorf("%w: the VM was started by a cubicled without pause", driver.ErrCannotCopy)
	if _, err := m.CreateSnapshot(ctx, src.ID, "key-a", "", nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a snapshot the driver cannot take of that box: %v, want conflict", err)
	}
	nothingKept("a box that cannot be copied", 0)
	sd.snapErr = nil

	first, err := m.CreateSnapshot(ctx, src.ID, "key-a", "one", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateSnapshot(ctx, src.ID, "key-a", "one", nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second snapshot named one: %v", err)
	}
	nothingKept("a name taken", 1)
	if _, err := m.CreateSnapshot(ctx, src.ID, "key-b", "one", nil); err != nil {
		t.Errorf("another key's snapshot named one: %v", err)
	}
	if _, err := m.CreateSnapshot(ctx, src.ID, "key-a", "", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateSnapshot(ctx, src.ID, "key-a", "", nil); !errors.Is(err, errdefs.ErrQuota) {
		t.Errorf("a third snapshot of a key allowed 2: %v", err)
	}
	nothingKept("beyond the quota", 3)

	// Creates from it that ask for another shape or session.
	for _, c := range []struct {
		name string
		req  CreateRequest
		want error
	}{
		{"resolution", CreateRequest{Resolution: Resolution{Width: 1280, Height: 800}}, errdefs.ErrInvalid},
		{"vcpus", CreateRequest{VCPUs: 4}, errdefs.ErrInvalid},
		{"memory_mb", CreateRequest{MemoryMB: 512}, errdefs.ErrInvalid},
		{"backend", CreateRequest{Backend: "qemu"}, errdefs.ErrInvalid},
		{"template", CreateRequest{Template: "other"}, errdefs.ErrInvalid},
		{"env", CreateRequest{Env: map[string]string{"A": "b"}}, errdefs.ErrInvalid},
		{"start_url", CreateRequest{StartURL: "http://192.0.2.1/"}, errdefs.ErrInvalid},
		{"volumes", CreateRequest{Volumes: []VolumeMount{{Name: "v", Path: "/home/user"}}}, errdefs.ErrInvalid},
		{"unknown snapshot", CreateRequest{FromSnapshot: "nope"}, errdefs.ErrNotFound},
	} {
		req := c.req
		req.Owner = "key-a"
		if req.FromSnapshot == "" {
			req.FromSnapshot = first.ID
		}
		if _, err := m.Create(ctx, req, true); !errors.Is(err, c.want) {
			t.Errorf("from the snapshot with %s: %v, want %v", c.name, err, c.want)
		}
	}
	if got := m.List(ctx, Filter{}); len(got) != 1 {
		t.Errorf("%d sandboxes after refused creates, want the source alone", len(got))
	}

	// A restore that fails leaves no sandbox and the snapshot as it was;
	// one refused as stale says so.
	for _, c := range []struct {
		err  error
		want error
	}{
		{errors.New("fake: qemu exited"), errdefs.ErrUnavailable},
		{fmt.Errorf("restore: %w", driver.ErrSnapshotStale), errdefs.ErrConflict},
	} {
		sd.restoreErr = c.err
		if _, err := m.Create(ctx, CreateRequest{Owner: "key-a", FromSnapshot: "one"}, true); !errors.Is(err, c.want) {
			t.Errorf("restore failing with %v: %v, want %v", c.err, err, c.want)
		}
		if got := m.List(ctx, Filter{}); len(got) != 1 {
			t.Errorf("%d sandboxes after a failed restore, want the source alone", len(got))
		}
		if recs, _ := m.store.all(); len(recs) != 1 {
			t.Errorf("%d records after a failed restore", len(recs))
		}
		if live := sd.live(); live != 1 {
			t.Errorf("%d boxes after a failed restore", live)
		}
		nothingKept("a failed restore", 3)
	}
	sd.restoreErr = nil
	sd.mu.Lock()
	sd.failRekey = true
	sd.mu.Unlock()
	if _, err := m.Create(ctx, CreateRequest{Owner: "key-a", FromSnapshot: "one"}, true); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a restore whose re-key fails: %v", err)
	}
	if live := sd.live(); live != 1 {
		t.Errorf("%d boxes after a failed re-key, want the source's", live)
	}
	sd.mu.Lock()
	sd.failRekey = false
	sd.mu.Unlock()

	// A sandbox that is not running, or holds volumes; a backend that
	// cannot snapshot.
	if _, err := m.CreateVolume(ctx, "key-a", "vol", MinVolumeMB); err != nil {
		t.Fatal(err)
	}
	withVol, err := m.Create(ctx, CreateRequest{Owner: "key-a", Volumes: []VolumeMount{{Name: "vol", Path: "/home/user"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateSnapshot(ctx, withVol.ID, "key-b", "", nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a snapshot of a sandbox with volumes: %v", err)
	}
	if err := m.Destroy(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateSnapshot(ctx, src.ID, "key-b", "", nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a snapshot of a stopped sandbox: %v", err)
	}
	plain := newSnapManager(t, newFakeDriver(t), nil, t.TempDir(), 0)
	defer plain.Close()
	sb, err := plain.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.CreateSnapshot(ctx, sb.ID, "", "", nil); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("a snapshot on a backend without snapshots: %v", err)
	}
	if ok, reason := plain.SnapshotInfo(ctx, "gvisor"); ok || reason == "" {
		t.Errorf("SnapshotInfo of a backend without snapshots: %v %q", ok, reason)
	}
}

// A snapshot a sandbox is starting from cannot be deleted; once the start
// has ended it can.
func TestSnapshotDeleteWhileRestoring(t *testing.T) {
	ctx := context.Background()
	sd := &snapDriver{fakeDriver: newFakeDriver(t)}
	m := newSnapManager(t, sd, nil, t.TempDir(), 0)
	defer m.Close()
	src, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.CreateSnapshot(ctx, src.ID, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	sd.hold = make(chan struct{})
	sb, err := m.Create(ctx, CreateRequest{FromSnapshot: s.ID}, false)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != StateStarting || sb.FromSnapshot != s.ID {
		t.Errorf("without wait: %+v", sb)
	}
	if err := m.DeleteSnapshot(ctx, "", s.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete while a sandbox starts from it: %v", err)
	}
	close(sd.hold)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := m.Get(ctx, sb.ID)
		if got.State == StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox from the snapshot is %s", got.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		err := m.DeleteSnapshot(ctx, "", s.ID)
		if err == nil {
			break
		}
		if !errors.Is(err, errdefs.ErrConflict) || time.Now().After(deadline) {
			t.Fatalf("delete once the start ended: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Snapshots survive a restart; a directory no snapshot names (a daemon
// killed while it took one) is removed at start.
func TestSnapshotRestart(t *testing.T) {
	ctx := context.Background()
	sd := &snapDriver{fakeDriver: newFakeDriver(t)}
	n := newFakeNet()
	dataDir := t.TempDir()
	m := newSnapManager(t, sd, n, dataDir, 0)
	src, err := m.Create(ctx, CreateRequest{Owner: "key-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.CreateSnapshot(ctx, src.ID, "key-a", "kept", map[string]string{"a": "b"})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	orphan := filepath.Join(dataDir, "snapshots", "half-written")
	if err := os.MkdirAll(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	m = newSnapManager(t, sd, n, dataDir, 0)
	second := m
	got, err := m.GetSnapshot(ctx, "key-a", "kept")
	if err != nil {
		t.Fatal(err)
	}
	want := s
	if got.ID != want.ID || got.Name != want.Name || got.SandboxID != want.SandboxID || !got.CreatedAt.Equal(want.CreatedAt) ||
		got.SizeBytes != want.SizeBytes || got.Metadata["a"] != "b" || got.Resolution != want.Resolution {
		t.Errorf("after a restart: %+v, want %+v", got, want)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("an orphan snapshot directory after a restart: %v", err)
	}
	sb, err := m.Create(ctx, CreateRequest{Owner: "key-a", FromSnapshot: "kept"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if rk := sd.rekeyed[sb.ID]; rk.req.OldAddr != src.IP+"/24" || netip.MustParsePrefix(rk.req.Addr).Addr().String() != sb.IP {
		t.Errorf("after a restart, re-keyed %s → %s; want from the source's %s", rk.req.OldAddr, rk.req.Addr, src.IP)
	}

	// A daemon started without networking cannot give the copy of a
	// sandbox that had an address what its guest expects: refused, and
	// nothing made.
	second.Close()
	m = newSnapManager(t, sd, nil, dataDir, 0)
	defer m.Close()
	if _, err := m.Create(ctx, CreateRequest{Owner: "key-a", FromSnapshot: "kept"}, true); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a snapshot with a network, on a daemon without: %v, want conflict", err)
	}
	if got := m.List(ctx, Filter{State: StateStarting}); len(got) != 0 {
		t.Errorf("the refused create left %+v", got)
	}
}
