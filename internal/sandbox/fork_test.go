package sandbox

import (
	"context"
	"errors"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
)

// forkingDriver is fakeDriver that forks: each child is a new fake box
// (a test double; the qemu driver's real fork runs in test/e2e).
type forkingDriver struct {
	*fakeDriver
	forkErr error
	forked  [][]driver.Spec // the children of each Fork
}

func (d *forkingDriver) CanFork(context.Context) error { return nil }

func (d *forkingDriver) Fork(ctx context.Context, parent driver.Box, children []driver.Spec) ([]driver.Box, error) {
	d.mu.Lock()
	d.forked = append(d.forked, children)
	d.mu.Unlock()
	if d.forkErr != nil {
		return nil, d.forkErr
	}
	var out []driver.Box
	for _, c := range children {
		b, err := d.Create(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func newForkManager(t *testing.T, d driver.Driver, n NetPool, max int) *Manager {
	t.Helper()
	cfg := Config{
		DataDir: t.TempDir(), Drivers: map[string]driver.Driver{"gvisor": d}, DefaultBackend: "auto",
		Images: func(string) (string, error) { return "/nonexistent", nil }, MaxSandboxes: max,
		IdleTimeout: time.Minute, MaxLifetime: time.Hour, ReapInterval: time.Hour, Metrics: metrics.New(),
	}
	if n != nil {
		cfg.Network = n
	}
	m, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestFork(t *testing.T) {
	fd := &forkingDriver{fakeDriver: newFakeDriver(t)}
	n := newFakeNet()
	m := newForkManager(t, fd, n, 8)
	ctx := context.Background()
	parent, err := m.Create(ctx, CreateRequest{Owner: "key-a", Metadata: map[string]string{"k": "v"}, Network: Network{Allow: []string{"192.0.2.0/24"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	parentToken := m.entries[parent.ID].rec.Token
	m.mu.Unlock()

	forks, err := m.Fork(ctx, parent.ID, "key-b", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 3 {
		t.Fatalf("%d forks, want 3", len(forks))
	}
	seen := map[string]bool{parent.ID: true}
	tokens := map[string]bool{parentToken: true}
	machineIDs := map[string]bool{}
	entropy := map[string]bool{}
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	for _, f := range forks {
		if f.State != StateRunning || seen[f.ID] || f.Metadata["k"] != "v" || f.IP == "" || f.IP == parent.IP {
			t.Errorf("fork %+v", f)
		}
		seen[f.ID] = true
		rk, ok := fd.rekeyed[f.ID]
		if !ok {
			t.Fatalf("fork %s was not re-keyed", f.ID)
		}
		if rk.callToken != parentToken {
			t.Errorf("fork %s was re-keyed with token %q, want the parent's (its agent's until then)", f.ID, rk.callToken)
		}
		if tokens[rk.req.Token] {
			t.Errorf("fork %s got a token another sandbox has", f.ID)
		}
		tokens[rk.req.Token] = true
		m.mu.Lock()
		e := m.entries[f.ID]
		got, owner := e.rec.Token, e.rec.Request.Owner
		m.mu.Unlock()
		if got != rk.req.Token || owner != "key-b" {
			t.Errorf("fork %s: the manager holds token %q of owner %q, want the re-key's of key-b", f.ID, got, owner)
		}
		if rk.req.Hostname != guestHostname(f.ID) || !hex32.MatchString(rk.req.MachineId) || machineIDs[rk.req.MachineId] {
			t.Errorf("fork %s: hostname %q, machine-id %q", f.ID, rk.req.Hostname, rk.req.MachineId)
		}
		machineIDs[rk.req.MachineId] = true
		if len(rk.req.Entropy) != 64 || entropy[string(rk.req.Entropy)] {
			t.Errorf("fork %s: %d bytes of entropy, or the same as another's", f.ID, len(rk.req.Entropy))
		}
		entropy[string(rk.req.Entropy)] = true
		if rk.req.Addr != f.IP+"/24" || rk.req.OldAddr != parent.IP+"/24" || rk.req.Gateway != "10.0.0.1" {
			t.Errorf("fork %s renumbered %s → %s via %s, want %s/24 → %s/24", f.ID, rk.req.OldAddr, rk.req.Addr, rk.req.Gateway, parent.IP, f.IP)
		}
		n.mu.Lock()
		allow := n.allow[f.ID]
		n.mu.Unlock()
		if !slices.Equal(allow, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}) {
			t.Errorf("fork %s egress %v, want the parent's", f.ID, allow)
		}
		if _, err := m.Agent(ctx, f.ID); err != nil {
			t.Errorf("Agent(%s): %v", f.ID, err)
		}
	}
	recs, _ := m.store.all()
	if len(recs) != 4 {
		t.Errorf("%d records stored, want the parent and 3 forks", len(recs))
	}
	if got, _ := m.Get(ctx, parent.ID); got.State != StateRunning {
		t.Errorf("the parent is %s after the fork", got.State)
	}
}

func TestForkRefusals(t *testing.T) {
	ctx := context.Background()
	fd := &forkingDriver{fakeDriver: newFakeDriver(t)}
	n := newFakeNet()
	m := newForkManager(t, fd, n, 3)
	parent, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	nothingMade := func(what string) {
		t.Helper()
		if got := m.List(ctx, Filter{}); len(got) != 1 {
			t.Errorf("%s: %d sandboxes, want the parent alone", what, len(got))
		}
		if recs, _ := m.store.all(); len(recs) != 1 {
			t.Errorf("%s: %d records, want the parent's", what, len(recs))
		}
		if live := fd.live(); live != 1 {
			t.Errorf("%s: %d boxes, want the parent's", what, live)
		}
		n.mu.Lock()
		att := len(n.attached)
		n.mu.Unlock()
		if att != 1 {
			t.Errorf("%s: %d networks attached, want the parent's", what, att)
		}
		if got, _ := m.Get(ctx, parent.ID); got.State != StateRunning {
			t.Errorf("%s: the parent is %s", what, got.State)
		}
	}
	for _, c := range []struct {
		name  string
		count int
		want  error
	}{
		{"count 0", 0, errdefs.ErrInvalid},
		{"count 11", 11, errdefs.ErrInvalid},
		{"beyond capacity", 3, errdefs.ErrCapacity},
	} {
		if _, err := m.Fork(ctx, parent.ID, "", c.count); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		nothingMade(c.name)
	}
	if _, err := m.Fork(ctx, "nope", "", 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	// No room for the parent's image: refused before anything is made.
	m.freeBytes = func(string) (int64, error) { return 1 << 20, nil }
	if _, err := m.Fork(ctx, parent.ID, "", 1); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "data directory is full") {
		t.Errorf("fork on a full data directory: %v, want unavailable saying so", err)
	}
	m.freeBytes = freeSpace
	nothingMade("a fork on a full data directory")
	fd.forkErr = errors.New("fake: migration failed")
	if _, err := m.Fork(ctx, parent.ID, "", 2); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("failed fork: %v", err)
	}
	nothingMade("a failed fork")
	fd.forkErr = nil
	fd.mu.Lock()
	fd.failRekey = true
	fd.mu.Unlock()
	if _, err := m.Fork(ctx, parent.ID, "", 2); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("fork whose re-key fails: %v", err)
	}
	nothingMade("a fork whose re-key failed")

	// A backend that cannot fork, and a sandbox that is not running.
	plain := newForkManager(t, newFakeDriver(t), nil, 4)
	sb, err := plain.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Fork(ctx, sb.ID, "", 1); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("fork on a backend without Fork: %v", err)
	}
	if err := m.Destroy(ctx, parent.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Fork(ctx, parent.ID, "", 1); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("fork of a stopped sandbox: %v", err)
	}
}
