package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
)

// fakeNet is a NetPool test double that records what it is asked and hands
// out 10.0.0.N addresses.
type fakeNet struct {
	mu       sync.Mutex
	attached map[string]string // id → kind
	allow    map[string][]netip.Prefix
	next     int
	failErr  error
	cleanups []map[string]bool
}

func newFakeNet() *fakeNet {
	return &fakeNet{attached: map[string]string{}, allow: map[string][]netip.Prefix{}, next: 2}
}

func (n *fakeNet) Attach(ctx context.Context, id, kind string, allow []netip.Prefix) (*driver.Net, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.failErr != nil {
		return nil, n.failErr
	}
	n.attached[id] = kind
	n.allow[id] = allow
	a := netip.MustParseAddr(fmt.Sprintf("10.0.0.%d", n.next))
	n.next++
	return &driver.Net{Netns: "/run/netns/cubicle-" + id, Addr: netip.PrefixFrom(a, 24), Gateway: netip.MustParseAddr("10.0.0.1")}, nil
}

func (n *fakeNet) Detach(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.attached, id)
	return nil
}

func (n *fakeNet) SetEgress(ctx context.Context, id string, allow []netip.Prefix) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.attached[id]; !ok {
		return fmt.Errorf("%s is not attached", id)
	}
	n.allow[id] = allow
	return nil
}

func (n *fakeNet) Cleanup(ctx context.Context, keep map[string]bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cleanups = append(n.cleanups, keep)
	for id := range n.attached {
		if !keep[id] {
			delete(n.attached, id)
		}
	}
	return nil
}

func (n *fakeNet) Free() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return 100 - len(n.attached)
}

func (n *fakeNet) has(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.attached[id]
	return ok
}

// netDriver records the Spec.Net its boxes got.
type netDriver struct {
	*fakeDriver
	iso  string
	nets sync.Map // id → *driver.Net
}

func (d *netDriver) Isolation() string { return d.iso }
func (d *netDriver) Create(ctx context.Context, spec driver.Spec) (driver.Box, error) {
	d.nets.Store(spec.ID, spec.Net)
	return d.fakeDriver.Create(ctx, spec)
}

func newNetManager(t *testing.T, d driver.Driver, n NetPool, dataDir string) (*Manager, *metrics.Metrics) {
	t.Helper()
	mt := metrics.New()
	m, err := New(context.Background(), Config{
		DataDir: dataDir, Drivers: map[string]driver.Driver{"gvisor": d},
		Images:       func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes: 4, ReapInterval: time.Hour, Network: n, Metrics: mt,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, mt
}

func TestEgressAllow(t *testing.T) {
	for _, tc := range []struct {
		in   Network
		want string // prefixes joined by " ", or "error"
	}{
		{Network{}, ""},
		{Network{Egress: "none"}, ""},
		{Network{Egress: "all"}, "0.0.0.0/0 ::/0"},
		{Network{Allow: []string{"192.0.2.7/24", "2001:db8::1", "198.51.100.1"}}, "192.0.2.0/24 2001:db8::1/128 198.51.100.1/32"},
		{Network{Egress: "some"}, "error"},
		{Network{Egress: "all", Allow: []string{"10.0.0.0/8"}}, "error"},
		{Network{Allow: []string{"not-a-cidr"}}, "error"},
	} {
		got, err := egressAllow(tc.in)
		var s []string
		for _, p := range got {
			s = append(s, p.String())
		}
		g := strings.Join(s, " ")
		if err != nil {
			g = "error"
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%+v: error %v is not ErrInvalid", tc.in, err)
			}
		}
		if g != tc.want {
			t.Errorf("egressAllow(%+v) = %q, want %q", tc.in, g, tc.want)
		}
	}
}

func TestNetworkLifecycle(t *testing.T) {
	d := &netDriver{fakeDriver: newFakeDriver(t), iso: driver.IsolationGVisor}
	n := newFakeNet()
	dataDir := t.TempDir()
	m, mt := newNetManager(t, d, n, dataDir)
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateRequest{Network: Network{Allow: []string{"192.0.2.1/32"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if sb.IP != "10.0.0.2" {
		t.Errorf("IP = %q, want 10.0.0.2", sb.IP)
	}
	if got, _ := d.nets.Load(sb.ID); got.(*driver.Net) == nil || got.(*driver.Net).Addr.Addr().String() != "10.0.0.2" {
		t.Errorf("driver got Net %+v", got)
	}
	if n.attached[sb.ID] != NetKindVeth || !slices.Equal(n.allow[sb.ID], []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")}) {
		t.Errorf("attach kind %q allow %v", n.attached[sb.ID], n.allow[sb.ID])
	}
	if got := gaugeValue(t, mt, "cubicle_netpool_free"); got != 99 {
		t.Errorf("netpool_free = %v, want 99", got)
	}
	// Default egress is none.
	sb2, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(n.allow[sb2.ID]) != 0 {
		t.Errorf("default egress allows %v", n.allow[sb2.ID])
	}
	if err := m.Destroy(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	if n.has(sb2.ID) {
		t.Error("network still attached after destroy")
	}
	if got := gaugeValue(t, mt, "cubicle_netpool_free"); got != 99 {
		t.Errorf("netpool_free = %v, want 99", got)
	}

	// A restart keeps the live sandbox's network and cleans the rest.
	m.Close()
	n.attached["orphan"] = NetKindVeth
	m2, _ := newNetManager(t, d, n, dataDir)
	defer m2.Close()
	if last := n.cleanups[len(n.cleanups)-1]; !last[sb.ID] || len(last) != 1 {
		t.Errorf("Cleanup keep = %v, want just %s", last, sb.ID)
	}
	if !n.has(sb.ID) || n.has("orphan") {
		t.Errorf("after restart attached = %v", n.attached)
	}
	if got, _ := m2.Get(ctx, sb.ID); got.IP != "10.0.0.2" {
		t.Errorf("IP after restart = %q", got.IP)
	}
	// A sandbox that dies is detached too.
	d.mu.Lock()
	box := d.boxes[sb.ID]
	d.mu.Unlock()
	box.crash()
	waitState(t, m2, sb.ID, StateStopped)
	if n.has(sb.ID) {
		t.Error("network of a dead sandbox still attached")
	}
}

func TestNetworkFailuresLeaveNothing(t *testing.T) {
	d := &netDriver{fakeDriver: newFakeDriver(t), iso: driver.IsolationVM}
	n := newFakeNet()
	m, _ := newNetManager(t, d, n, t.TempDir())
	defer m.Close()
	ctx := context.Background()

	d.failErr = errors.New("boom")
	if _, err := m.Create(ctx, CreateRequest{Network: Network{Egress: "all"}}, true); err == nil {
		t.Fatal("create with a failing driver succeeded")
	}
	if len(n.attached) != 0 {
		t.Errorf("failed create left networks %v", n.attached)
	}
	d.failErr = nil
	n.failErr = errors.New("pool exhausted")
	if _, err := m.Create(ctx, CreateRequest{}, true); err == nil || !strings.Contains(err.Error(), "pool exhausted") {
		t.Fatalf("create with a failing pool: %v", err)
	}
	if d.live() != 0 {
		t.Errorf("failed attach left %d boxes", d.live())
	}
	n.failErr = nil
	sb, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if n.attached[sb.ID] != NetKindTAP {
		t.Errorf("VM backend got kind %q, want tap", n.attached[sb.ID])
	}
	if _, err := m.Create(ctx, CreateRequest{Network: Network{Egress: "bogus"}}, true); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad egress: %v, want ErrInvalid", err)
	}
}

func TestEgressWithoutNetworkRefused(t *testing.T) {
	d := newFakeDriver(t)
	m := newTestManager(t, d, t.TempDir(), &fakeClock{now: time.Now()})
	defer m.Close()
	if _, err := m.Create(context.Background(), CreateRequest{Network: Network{Egress: "all"}}, true); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("egress all without a pool: %v, want ErrUnavailable", err)
	}
	if _, err := m.Create(context.Background(), CreateRequest{Network: Network{Egress: "none"}}, true); err != nil {
		t.Errorf("egress none without a pool: %v", err)
	}
}

func gaugeValue(t *testing.T, mt *metrics.Metrics, name string) float64 {
	t.Helper()
	mfs, err := mt.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
