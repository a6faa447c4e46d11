package sandbox

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
)

func newPoolManager(t *testing.T, d *fakeDriver, dataDir string, cfg Config) *Manager {
	t.Helper()
	cfg.DataDir = dataDir
	cfg.Drivers = map[string]driver.Driver{"gvisor": d}
	cfg.DefaultBackend = "auto"
	cfg.Images = func(string) (string, error) { return "/nonexistent", nil }
	if cfg.MaxSandboxes == 0 {
		cfg.MaxSandboxes = 8
	}
	cfg.IdleTimeout, cfg.MaxLifetime, cfg.ReapInterval = time.Minute, time.Hour, time.Hour
	cfg.Metrics = metrics.New()
	m, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitPoolReady waits until the pools have n booted boxes in all.
func waitPoolReady(t *testing.T, m *Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := 0
		for _, p := range m.Pools() {
			got += p.Ready
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pools have %d booted boxes, want %d: %+v", got, n, m.Pools())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (d *fakeDriver) appliedTo(id string) (appliedSession, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, ok := d.applied[id]
	return a, ok
}

func (d *fakeDriver) spec(id string) driver.Spec {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.specs[id]
}

var desktopPool = PoolSpec{Template: "desktop", Width: 1024, Height: 768, Size: 2}

func TestPoolClaim(t *testing.T) {
	d := newFakeDriver(t)
	dir := t.TempDir()
	m := newPoolManager(t, d, dir, Config{Pools: []PoolSpec{desktopPool}})
	defer m.Close()
	ctx := context.Background()
	waitPoolReady(t, m, 2)
	if got := m.List(ctx, Filter{}); len(got) != 0 {
		t.Fatalf("pool boxes are listed: %+v", got)
	}
	if live := d.live(); live != 2 {
		t.Fatalf("%d boxes booted, want 2", live)
	}

	req := CreateRequest{Owner: "key-a", Env: map[string]string{"A": "1"}, StartURL: "http://site.test/", Metadata: map[string]string{"k": "v"}, TimeoutSeconds: 600}
	sb, err := m.Create(ctx, req, true)
	if err != nil {
		t.Fatal(err)
	}
	spec := d.spec(sb.ID)
	if spec.Session.Env["CUBICLE_POOLED"] != "1" || spec.StartURL != "" || spec.Session.Env["A"] != "" {
		t.Fatalf("the sandbox was not booted for the pool: its spec is %+v", spec)
	}
	a, ok := d.appliedTo(sb.ID)
	if !ok {
		t.Fatal("the claimed box was given no session")
	}
	if a.req.StartUrl != req.StartURL || a.req.Env["A"] != "1" {
		t.Errorf("applied session %+v, want the create's start URL and env", a.req)
	}
	if a.callToken != spec.Token || a.req.Token == spec.Token || a.req.Token == "" {
		t.Errorf("the session was applied with token %q to replace %q by %q: want the pool's token replaced by a new one", a.callToken, spec.Token, a.req.Token)
	}
	if sb.State != StateRunning || sb.Metadata["k"] != "v" || sb.ExpiresAt.Sub(sb.CreatedAt) != 10*time.Minute {
		t.Errorf("claimed sandbox %+v", sb)
	}
	if got := m.List(ctx, Filter{}); len(got) != 1 || got[0].ID != sb.ID {
		t.Errorf("listed %+v, want only the claimed sandbox", got)
	}
	if _, err := m.Agent(ctx, sb.ID); err != nil {
		t.Errorf("Agent of the claimed sandbox: %v", err)
	}
	m.mu.Lock()
	tok := m.entries[sb.ID].rec.Token
	m.mu.Unlock()
	if tok != a.req.Token {
		t.Errorf("the manager talks to the box with %q, want the applied token %q", tok, a.req.Token)
	}
	if got := testutil.ToFloat64(m.m.PoolClaims.WithLabelValues(desktopPool.String(), "hit")); got != 1 {
		t.Errorf("hits = %v, want 1", got)
	}
	// The pool boots a replacement; the claimed box is never given back.
	waitPoolReady(t, m, 2)
	if live := d.live(); live != 3 {
		t.Errorf("%d boxes, want the claimed one and 2 in the pool", live)
	}

	// The store knows the claimed sandbox, and only it: after a restart
	// it is adopted with its own token and the pool's boxes are orphans.
	st := m.store
	recs, err := st.all()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Sandbox.ID != sb.ID || recs[0].Token != a.req.Token || recs[0].Pool != "" {
		t.Fatalf("stored records %+v, want the claimed sandbox alone", recs)
	}
	if err := m.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.boxes[sb.ID]; ok {
		t.Error("the destroyed sandbox's box is still there")
	}
}

func TestPoolMisses(t *testing.T) {
	d := newFakeDriver(t)
	m := newPoolManager(t, d, t.TempDir(), Config{Pools: []PoolSpec{{Template: "desktop", Width: 1024, Height: 768, Size: 1}}})
	defer m.Close()
	ctx := context.Background()
	waitPoolReady(t, m, 1)
	pooled := slices.Collect(func(yield func(string) bool) {
		d.mu.Lock()
		defer d.mu.Unlock()
		for id := range d.boxes {
			if !yield(id) {
				return
			}
		}
	})
	// Creates the pool cannot serve boot cold and leave the pool alone.
	for _, req := range []CreateRequest{
		{Resolution: Resolution{Width: 1280, Height: 800}},
		{VCPUs: 2},
		{MemoryMB: 1024},
		{DPI: 120},
		{Template: "other"},
		// Pool boxes run DevTools (the default): one that turns it off
		// boots without.
		{Env: map[string]string{DevToolsEnv: "0"}},
	} {
		sb, err := m.Create(ctx, req, true)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(pooled, sb.ID) {
			t.Errorf("create %+v took the pool's box", req)
		}
		if _, ok := d.appliedTo(sb.ID); ok || d.spec(sb.ID).Env["CUBICLE_POOLED"] != "" {
			t.Errorf("create %+v: a cold box was booted or treated as a pool's", req)
		}
		if err := m.Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.m.PoolClaims.WithLabelValues("desktop:1024x768=1", "miss")); got != 0 {
		t.Errorf("creates no pool serves counted %v misses", got)
	}
	waitPoolReady(t, m, 1)

	// A box that will not take its session is destroyed and the create
	// boots cold, as a miss.
	d.mu.Lock()
	d.failApply = true
	d.mu.Unlock()
	sb, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pooled, sb.ID) {
		t.Error("a box that refused the session became the sandbox")
	}
	d.mu.Lock()
	_, alive := d.boxes[pooled[0]]
	d.mu.Unlock()
	if alive {
		t.Error("the box that refused the session was not destroyed")
	}
	if got := testutil.ToFloat64(m.m.PoolClaims.WithLabelValues("desktop:1024x768=1", "miss")); got != 1 {
		t.Errorf("misses = %v, want 1", got)
	}
}

func TestPoolCapacityAndQuota(t *testing.T) {
	d := newFakeDriver(t)
	m := newPoolManager(t, d, t.TempDir(), Config{MaxSandboxes: 2, MaxPerOwner: 1, Pools: []PoolSpec{desktopPool}})
	defer m.Close()
	ctx := context.Background()
	waitPoolReady(t, m, 2)

	// The pool holds both slots; a create it cannot serve takes one.
	cold, err := m.Create(ctx, CreateRequest{Resolution: Resolution{Width: 800, Height: 600}}, true)
	if err != nil {
		t.Fatalf("a create no pool serves, with the pool holding every slot: %v", err)
	}
	if got := d.live(); got != 2 {
		t.Errorf("%d boxes, want 2 (one pool box made room)", got)
	}
	// One pool box is left; key-a claims it, and then has its limit.
	sb, err := m.Create(ctx, CreateRequest{Owner: "key-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.appliedTo(sb.ID); !ok {
		t.Fatal("the create did not claim the pool box")
	}
	if err := m.Destroy(ctx, cold.ID); err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, m, 1)
	_, err = m.Create(ctx, CreateRequest{Owner: "key-a"}, true)
	if !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a second sandbox of key-a: %v, want its quota refused", err)
	}
	if got := m.Pools()[0].Ready; got != 1 {
		t.Errorf("a refused create changed the pool: %d ready, want 1", got)
	}
	// Capacity is full (key-a's sandbox and the pool box): another key's
	// create takes the pool box.
	other, err := m.Create(ctx, CreateRequest{Owner: "key-b"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.appliedTo(other.ID); !ok {
		t.Error("key-b's create did not claim the pool box")
	}
}

func TestPoolRestartAndClose(t *testing.T) {
	d := newFakeDriver(t)
	dir := t.TempDir()
	m := newPoolManager(t, d, dir, Config{Pools: []PoolSpec{desktopPool}})
	waitPoolReady(t, m, 2)
	sb, err := m.Create(context.Background(), CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, m, 2)
	// A daemon that dies leaves its pool's boxes unknown to the store:
	// the next one cleans them as orphans, and keeps the claimed one.
	m.cancel()
	m.wg.Wait()
	m.store.close()
	if got := d.live(); got != 3 {
		t.Fatalf("%d boxes before the restart, want 3", got)
	}
	m2 := newPoolManager(t, d, dir, Config{})
	if got := d.live(); got != 1 {
		t.Errorf("%d boxes after the restart, want the claimed sandbox's alone", got)
	}
	if got, err := m2.Get(context.Background(), sb.ID); err != nil || got.State != StateRunning {
		t.Errorf("claimed sandbox after the restart: %+v, %v", got, err)
	}
	m2.Close()

	// Close destroys the pool's boxes and leaves sandboxes running.
	m3 := newPoolManager(t, d, dir, Config{Pools: []PoolSpec{desktopPool}})
	waitPoolReady(t, m3, 2)
	m3.Close()
	if got := d.live(); got != 1 {
		t.Errorf("%d boxes after Close, want the sandbox's alone", got)
	}
}

func TestPoolEgress(t *testing.T) {
	d := newFakeDriver(t)
	n := newFakeNet()
	m := newPoolManager(t, d, t.TempDir(), Config{Network: n, Pools: []PoolSpec{desktopPool}})
	defer m.Close()
	waitPoolReady(t, m, 2)
	sb, err := m.Create(context.Background(), CreateRequest{Network: Network{Allow: []string{"192.0.2.0/24"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.appliedTo(sb.ID); !ok {
		t.Fatal("a create with an egress policy did not claim the pool box")
	}
	n.mu.Lock()
	got := n.allow[sb.ID]
	n.mu.Unlock()
	if want := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}; !slices.Equal(got, want) {
		t.Errorf("egress of the claimed box = %v, want %v", got, want)
	}
}

func TestParsePoolSpec(t *testing.T) {
	for _, c := range []struct {
		in   string
		want PoolSpec
		err  bool
	}{
		{in: "desktop:1024x768=4", want: PoolSpec{Template: "desktop", Width: 1024, Height: 768, Size: 4}},
		{in: "gvisor/desktop:1280x800=2", want: PoolSpec{Backend: "gvisor", Template: "desktop", Width: 1280, Height: 800, Size: 2}},
		{in: "auto/desktop:1024x768=1", want: PoolSpec{Template: "desktop", Width: 1024, Height: 768, Size: 1}},
		{in: "desktop:1024x768", err: true},
		{in: "desktop:1024x768=0", err: true},
		{in: "desktop:1024x768=1001", err: true},
		{in: "desktop:10x768=1", err: true},
		{in: "desktop:0x0=1", err: true},
		{in: "desktop:00x00000=1", err: true},
		{in: "xen/desktop:1024x768=1", err: true},
		{in: "Desktop:1024x768=1", err: true},
		{in: "desktop:1024*768=1", err: true},
		{in: " desktop:1024x768=1", err: true},
	} {
		got, err := ParsePoolSpec(c.in)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("ParsePoolSpec(%q) = %+v, %v; want %+v, error %v", c.in, got, err, c.want, c.err)
		}
		if err == nil {
			if back, err := ParsePoolSpec(got.String()); err != nil || back != got {
				t.Errorf("%q: String %q does not parse back: %+v, %v", c.in, got.String(), back, err)
			}
		}
	}
}

func FuzzParsePoolSpec(f *testing.F) {
	f.Add("gvisor/desktop:1280x800=2")
	f.Add("desktop:1024x768=4")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePoolSpec(s)
		if err != nil {
			return
		}
		if p.Size < 1 || p.Size > MaxPoolSize || p.Width < MinWidth || p.Height < MinHeight {
			t.Fatalf("%q parsed to %+v", s, p)
		}
		if back, err := ParsePoolSpec(p.String()); err != nil || back != p {
			t.Fatalf("%q: %q does not parse back: %+v, %v", s, p.String(), back, err)
		}
	})
}

// TestPoolBoxDiesDuringClaim: a box that dies while its session is
// applied is given up, the create boots cold, and the claim's count of
// slots and of its key's sandboxes is back where it was.
func TestPoolBoxDiesDuringClaim(t *testing.T) {
	d := newFakeDriver(t)
	m := newPoolManager(t, d, t.TempDir(), Config{MaxPerOwner: 1, Pools: []PoolSpec{{Template: "desktop", Width: 1024, Height: 768, Size: 1}}})
	defer m.Close()
	ctx := context.Background()
	waitPoolReady(t, m, 1)
	d.mu.Lock()
	d.dieOnApply = true
	d.mu.Unlock()
	sb, err := m.Create(ctx, CreateRequest{Owner: "key-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.appliedTo(sb.ID); ok {
		t.Error("the sandbox is the box that died during its claim")
	}
	m.mu.Lock()
	claiming, claims := m.claiming, len(m.claims)
	m.mu.Unlock()
	if claiming != 0 || claims != 0 {
		t.Errorf("after the claim: %d claims counted in progress, %d keys with claims; want none", claiming, claims)
	}
	// key-a has its one sandbox, exactly.
	if _, err := m.Create(ctx, CreateRequest{Owner: "key-a"}, true); !errors.Is(err, errdefs.ErrQuota) {
		t.Errorf("a second sandbox of key-a: %v, want its quota refused", err)
	}
}
