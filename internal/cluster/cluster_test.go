package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cubicle-dev/cubicle/internal/cluster/etcdtest"
)

// fakeLocal is a node's store in these tests: the cluster code is
// driver-agnostic, so no sandbox runs.
type fakeLocal struct {
	mu      sync.Mutex
	load    Load
	entries map[string]Entry
}

func newFakeLocal(max int, backends ...string) *fakeLocal {
	return &fakeLocal{load: Load{Backends: backends, MaxSandboxes: max, FreeMemoryMB: 1000}, entries: map[string]Entry{}}
}

func (f *fakeLocal) Load(context.Context) Load {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.load
	l.Live = len(f.entries)
	return l
}

func (f *fakeLocal) Sandboxes(context.Context) []Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Entry
	for _, e := range f.entries {
		out = append(out, e)
	}
	return out
}

func (f *fakeLocal) add(e Entry) {
	f.mu.Lock()
	f.entries[e.ID] = e
	f.mu.Unlock()
}

func (f *fakeLocal) remove(id string) {
	f.mu.Lock()
	delete(f.entries, id)
	f.mu.Unlock()
}

// node is one Cluster run by a test.
type node struct {
	*Cluster
	local  *fakeLocal
	cancel context.CancelFunc
	done   chan struct{}
}

func startNode(t *testing.T, endpoints []string, name string, local *fakeLocal, ttl time.Duration) *node {
	t.Helper()
	c, err := New(Config{Endpoints: endpoints, Name: name, URL: "http://" + name + ".test", Version: "test",
		LeaseTTL: ttl, Local: local, Refresh: 200 * time.Millisecond, Reconcile: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{Cluster: c, local: local, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(n.done); _ = c.Run(ctx) }()
	t.Cleanup(n.stop)
	return n
}

// stop ends the node as a crash would: its lease is left to expire.
func (n *node) stop() {
	n.cancel()
	<-n.done
	_ = n.cli.Close()
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func TestMembershipCatalogAndLoss(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := startNode(t, etcd.Endpoints(), "a", newFakeLocal(4, "gvisor", "runc"), 2*time.Second)
	b := startNode(t, etcd.Endpoints(), "b", newFakeLocal(4, "gvisor"), 2*time.Second)
	waitUntil(t, 10*time.Second, "both nodes in both views", func() bool {
		return len(a.Nodes()) == 2 && len(b.Nodes()) == 2 && a.Degraded() == "" && b.Degraded() == ""
	})
	if n, _ := a.Node("b"); n.URL != "http://b.test" || n.MaxSandboxes != 4 || n.Version != "test" {
		t.Fatalf("a sees b as %+v", n)
	}

	// A sandbox on b is found from a, via the watch or etcd.
	now := time.Now().UTC().Truncate(time.Second)
	e := Entry{ID: "sb1", State: "running", Owner: "key-1", Backend: "gvisor", Created: now, Sandbox: []byte(`{"id":"sb1","state":"running"}`)}
	b.local.add(e)
	if err := b.Put(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	loc, found, err := a.Locate(context.Background(), "sb1", true)
	if err != nil || !found || loc.Node != "b" || !loc.Alive || loc.URL != "http://b.test" {
		t.Fatalf("Locate(sb1) from a = %+v, %v, %v", loc, found, err)
	}
	if _, found, err := a.Locate(context.Background(), "nosuch", true); err != nil || found {
		t.Fatalf("Locate(nosuch) = found %v, %v", found, err)
	}

	// Reconcile: b's store has one more and has lost sb1.
	b.local.add(Entry{ID: "sb2", State: "starting", Created: now})
	b.local.remove("sb1")
	waitUntil(t, 5*time.Second, "the catalog to follow b's store", func() bool {
		_, f1, _ := a.Locate(context.Background(), "sb1", true)
		l2, f2, _ := a.Locate(context.Background(), "sb2", true)
		return !f1 && f2 && l2.State == "starting"
	})
	b.local.add(Entry{ID: "sb2", State: "running", Created: now})
	waitUntil(t, 5*time.Second, "sb2's state change in a's view", func() bool {
		l, _, _ := a.Locate(context.Background(), "sb2", true)
		return l.State == "running"
	})

	// b dies without a word: within the lease (2 s, plus the refresh),
	// a sees its sandbox lost, and places nothing there.
	b.stop()
	took := waitUntil(t, 10*time.Second, "sb2 lost", func() bool {
		l, found, _ := a.Locate(context.Background(), "sb2", true)
		return found && !l.Alive
	})
	t.Logf("b's sandbox seen lost %v after b stopped (lease 2 s)", took)
	for range 3 { // a has 4 slots; each placement holds one until a's next record
		nodes, err := a.Place("")
		if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
			t.Fatalf("Place with b gone = %+v, %v", nodes, err)
		}
	}

	// b comes back with the same store: its entry is its own again.
	b2 := startNode(t, etcd.Endpoints(), "b", b.local, 2*time.Second)
	waitUntil(t, 10*time.Second, "sb2 alive again", func() bool {
		l, found, _ := a.Locate(context.Background(), "sb2", true)
		return found && l.Alive && b2.Degraded() == ""
	})
}

func TestPlace(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := startNode(t, etcd.Endpoints(), "a", newFakeLocal(10, "gvisor", "runc"), 5*time.Second)
	b := startNode(t, etcd.Endpoints(), "b", newFakeLocal(10, "gvisor"), 5*time.Second)
	c := startNode(t, etcd.Endpoints(), "c", newFakeLocal(0, "gvisor"), 5*time.Second)
	waitUntil(t, 10*time.Second, "three nodes", func() bool { return len(a.Nodes()) == 3 && a.Degraded() == "" })
	_ = b
	_ = c

	// runc only on a; c has no room.
	for range 5 {
		nodes, err := a.Place("runc")
		if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
			t.Fatalf("Place(runc) = %+v, %v", nodes, err)
		}
	}
	// A burst of gvisor creates spreads over a and b by the pending
	// counts, though no record changed meanwhile.
	counts := map[string]int{}
	for range 10 {
		nodes, err := a.Place("gvisor")
		if err != nil || len(nodes) == 0 {
			t.Fatalf("Place(gvisor) = %+v, %v", nodes, err)
		}
		if nodes[0].Name == "c" {
			t.Fatal("placed on c, which has no room")
		}
		counts[nodes[0].Name]++
	}
	if counts["a"] == 0 || counts["b"] == 0 {
		t.Fatalf("a burst of 10 went %v; want both a and b", counts)
	}
	if nodes, err := a.Place("firecracker"); err != nil || len(nodes) != 0 {
		t.Fatalf("Place(firecracker) = %+v, %v; want no node", nodes, err)
	}
	a.Drain(true)
	waitUntil(t, 5*time.Second, "a draining in its record", func() bool { n, _ := a.Node("a"); return n.Draining })
	for range 10 {
		nodes, err := a.Place("gvisor")
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if n.Name == "a" {
				t.Fatal("placed on a draining node")
			}
		}
	}
}

func TestQuorumLoss(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	a := startNode(t, etcd.Endpoints(), "a", newFakeLocal(4, "gvisor"), 3*time.Second)
	b := startNode(t, etcd.Endpoints(), "b", newFakeLocal(4, "gvisor"), 3*time.Second)
	e := Entry{ID: "sb1", State: "running", Created: time.Now().UTC()}
	b.local.add(e)
	waitUntil(t, 10*time.Second, "sb1 in a's view", func() bool {
		l, found, _ := a.Locate(context.Background(), "sb1", true)
		return found && l.Alive && a.Degraded() == ""
	})

	// One member down: nothing changes.
	etcd.Stop(0)
	time.Sleep(3 * time.Second)
	if why := a.Degraded(); why != "" {
		t.Fatalf("degraded with 2 of 3 members: %s", why)
	}
	if _, err := a.Place("gvisor"); err != nil {
		t.Fatal(err)
	}

	// Two down: no quorum. Both nodes say so, placement refuses, and the
	// catalog a already holds still locates b's sandbox.
	etcd.Stop(1)
	waitUntil(t, 15*time.Second, "a degraded", func() bool { return a.Degraded() != "" })
	t.Logf("a says: %s", a.Degraded())
	if _, err := a.Place("gvisor"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Place without quorum = %v, want ErrUnavailable", err)
	}
	if l, found, _ := a.Locate(context.Background(), "sb1", true); !found || l.Node != "b" {
		t.Fatalf("Locate without quorum = %+v, %v", l, found)
	}

	// Meanwhile b's store changed; once the members are back the catalog
	// converges.
	b.local.add(Entry{ID: "sb2", State: "running", Created: time.Now().UTC()})
	b.local.remove("sb1")
	etcd.StartNoWait(0)
	etcd.StartNoWait(1)
	took := waitUntil(t, 30*time.Second, "the catalog to converge", func() bool {
		_, f1, _ := a.Locate(context.Background(), "sb1", true)
		l2, f2, _ := a.Locate(context.Background(), "sb2", true)
		return a.Degraded() == "" && b.Degraded() == "" && !f1 && f2 && l2.Alive
	})
	t.Logf("converged %v after the members were started again", took)
}

func TestConfigRejects(t *testing.T) {
	for _, cfg := range []Config{
		{Name: "a"},
		{Endpoints: []string{"http://127.0.0.1:1"}},
		{Endpoints: []string{"http://127.0.0.1:1"}, Name: "a/b"},
		{Endpoints: []string{"http://127.0.0.1:1"}, Name: "a", LeaseTTL: time.Second},
	} {
		if c, err := New(cfg); err == nil {
			c.Close()
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// TestNameTaken checks that a second node under a live node's name
// writes nothing and says why, that the same node restarted (same URL,
// its old lease still running) takes its record back at once, and that
// the name is free again once its holder's lease ends.
func TestNameTaken(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := startNode(t, etcd.Endpoints(), "a", newFakeLocal(4, "gvisor"), 10*time.Second)
	waitUntil(t, 10*time.Second, "a registered", func() bool { return a.Degraded() == "" })

	// Another host, also told it is "a".
	c, err := New(Config{Endpoints: etcd.Endpoints(), Name: "a", URL: "http://other.test", Version: "test",
		LeaseTTL: 2 * time.Second, Local: newFakeLocal(4, "gvisor"), Refresh: 200 * time.Millisecond, Reconcile: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = c.Close() })
	waitUntil(t, 10*time.Second, "the second a to say its name is taken", func() bool {
		return strings.Contains(c.Degraded(), "node name taken") && strings.Contains(c.Degraded(), "http://a.test")
	})
	if err := c.Put(context.Background(), Entry{ID: "x", State: "running"}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Put by the second a = %v, want ErrUnavailable", err)
	}
	// The first a's sandbox, which the second sees under its own name
	// and does not hold: the second's reconcile must leave it.
	own := Entry{ID: "sbA", State: "running", Created: time.Now().UTC().Truncate(time.Second)}
	a.local.add(own)
	if err := a.Put(context.Background(), own); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the second a to see sbA", func() bool {
		loc, found, _ := c.Locate(context.Background(), "sbA", false)
		return found && loc.Node == "a"
	})
	if err := c.Sync(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Sync by the second a = %v, want ErrUnavailable", err)
	}
	time.Sleep(time.Second)
	if n, _ := a.Node("a"); n.URL != "http://a.test" {
		t.Fatalf("a's record was overwritten: %+v", n)
	}
	if _, found, _ := a.Locate(context.Background(), "x", true); found {
		t.Error("the second a's entry reached the catalog")
	}
	if _, found, _ := a.Locate(context.Background(), "sbA", true); !found {
		t.Error("the second a's reconcile deleted the first a's sandbox from the catalog")
	}

	// a restarts (crash: lease left running) at its own URL: it takes
	// its record back without waiting for the old lease (10 s).
	a.stop()
	a2 := startNode(t, etcd.Endpoints(), "a", newFakeLocal(4, "gvisor"), 10*time.Second)
	if took := waitUntil(t, 15*time.Second, "a back", func() bool { return a2.Degraded() == "" }); took > 5*time.Second {
		t.Errorf("a restarted at its own URL waited %v for its name", took)
	}
	a2.stop()
	// With the name's holder gone for its lease, the other host joins.
	waitUntil(t, 25*time.Second, "the second a to join once the name is free", func() bool { return c.Degraded() == "" })
	if n, _ := c.Node("a"); n.URL != "http://other.test" {
		t.Fatalf("a is now %+v", n)
	}
}

// TestTakeCreate checks that a key's create budget is one for the whole
// cluster: what one node took, the other cannot, under a race of both
// too, and that it refills at its rate. Both nodes read one clock that
// the test moves, so a refill is a step of that clock, not a sleep.
func TestTakeCreate(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := startNode(t, etcd.Endpoints(), "a", newFakeLocal(4, "gvisor"), 2*time.Second)
	b := startNode(t, etcd.Endpoints(), "b", newFakeLocal(4, "gvisor"), 2*time.Second)
	var clock atomic.Int64 // unix nanoseconds
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	a.now, b.now = now, now
	advance := func(d time.Duration) { clock.Add(int64(d)) }
	waitUntil(t, 10*time.Second, "both registered", func() bool { return a.Degraded() == "" && b.Degraded() == "" })
	ctx := context.Background()

	// 12 takes at once, 6 from each node, from a budget of 5 that
	// refills at one every 100 s: exactly 5 are allowed.
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for i := range 12 {
		n := a
		if i%2 == 1 {
			n = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := n.TakeCreate(ctx, "key-race", 0.01, 5)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if allowed != 5 {
		t.Errorf("%d of 12 racing takes allowed from a budget of 5", allowed)
	}

	// Taken on a, missing on b; another key's budget is its own.
	for i, want := range []bool{true, true, false} {
		ok, err := a.TakeCreate(ctx, "key-2", 5, 2)
		if err != nil || ok != want {
			t.Fatalf("a's take %d = %v, %v; want %v", i, ok, err, want)
		}
	}
	if ok, err := b.TakeCreate(ctx, "key-2", 5, 2); err != nil || ok {
		t.Errorf("b's take of a spent budget = %v, %v", ok, err)
	}
	if ok, err := b.TakeCreate(ctx, "key-3", 5, 2); err != nil || !ok {
		t.Errorf("b's take of another key = %v, %v", ok, err)
	}
	// 5 a second: half a create after 100 ms, one after 200 ms, on
	// either node.
	advance(100 * time.Millisecond)
	if ok, err := a.TakeCreate(ctx, "key-2", 5, 2); err != nil || ok {
		t.Errorf("a's take 100 ms after the budget was spent = %v, %v; want none yet", ok, err)
	}
	advance(100 * time.Millisecond)
	if ok, err := b.TakeCreate(ctx, "key-2", 5, 2); err != nil || !ok {
		t.Errorf("b's take 200 ms after the budget was spent = %v, %v; want the one refilled", ok, err)
	}
	if ok, err := a.TakeCreate(ctx, "key-2", 5, 2); err != nil || ok {
		t.Errorf("a's take after b took the refill = %v, %v; want none", ok, err)
	}

	// etcd away: the caller is told, to fall back to its own limit.
	etcd.Stop(0)
	waitUntil(t, 10*time.Second, "a degraded", func() bool { return a.Degraded() != "" })
	if _, err := a.TakeCreate(ctx, "key-4", 5, 2); !errors.Is(err, ErrUnavailable) {
		t.Errorf("take without etcd: %v, want ErrUnavailable", err)
	}
}

// BenchmarkTakeCreate is what a shared per-key create rate adds to a
// create: one read and one compare-and-swap in a real (one-member) etcd.
func BenchmarkTakeCreate(b *testing.B) {
	etcd := etcdtest.Start(b, 1)
	c, err := New(Config{Endpoints: etcd.Endpoints(), Name: "a", URL: "http://a.test", Version: "test",
		LeaseTTL: 10 * time.Second, Local: newFakeLocal(4, "gvisor")})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done; _ = c.Close() })
	for c.Degraded() != "" {
		time.Sleep(20 * time.Millisecond)
	}
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		if ok, err := c.TakeCreate(context.Background(), "key-bench", 1e9, 1000); err != nil || !ok {
			b.Fatalf("TakeCreate = %v, %v", ok, err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
}

// TestTLSAndAuth runs a node against etcd on https that asks for client
// certificates, with etcd's auth on and a user whose role reaches only
// cubicle's prefix: it registers and writes its catalog. Without the
// client certificate, or with a wrong password, it cannot, and says so.
func TestTLSAndAuth(t *testing.T) {
	etcd := etcdtest.StartTLS(t, 1)
	ctx := context.Background()
	root, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), TLS: etcd.ClientTLS(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	steps := []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "cubicle"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "cubicle", DefaultPrefix, clientv3.GetPrefixRangeEnd(DefaultPrefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "cubicle", "node-pw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "cubicle", "cubicle"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("etcd auth set-up step %d: %v", i, err)
		}
	}
	start := func(name string, tc *tls.Config, pass string) (*Cluster, error) {
		c, err := New(Config{Endpoints: etcd.Endpoints(), Name: name, URL: "http://" + name + ".test", Version: "test",
			LeaseTTL: 2 * time.Second, Local: newFakeLocal(4, "gvisor"), Refresh: 200 * time.Millisecond, Reconcile: 500 * time.Millisecond,
			TLS: tc, Username: "cubicle", Password: pass})
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(cctx) }()
		t.Cleanup(func() { cancel(); <-done; _ = c.Close() })
		return c, nil
	}
	good, err := start("good", etcd.ClientTLS(), "node-pw")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 15*time.Second, "the node with certificate and password registered", func() bool { return good.Degraded() == "" })
	if err := good.Put(ctx, Entry{ID: "sb1", State: "running"}); err != nil {
		t.Fatalf("catalog put over TLS with auth: %v", err)
	}
	if ok, err := good.TakeCreate(ctx, "key-1", 1, 1); err != nil || !ok {
		t.Fatalf("create budget over TLS with auth: %v, %v", ok, err)
	}

	// A wrong password is refused as the client starts (cubicled does
	// not start), and so is a client without a certificate.
	if _, err := start("badpass", etcd.ClientTLS(), "wrong"); err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("a wrong password: %v", err)
	}
	noCert := etcd.ClientTLS()
	noCert.Certificates = nil
	if anon, err := start("nocert", noCert, "node-pw"); err == nil {
		time.Sleep(3 * time.Second)
		if anon.Degraded() == "" {
			t.Error("a node without a client certificate registered")
		}
	}
	time.Sleep(500 * time.Millisecond)
	for _, name := range []string{"badpass", "nocert"} {
		if _, ok := good.Node(name); ok {
			t.Errorf("node %s is a member", name)
		}
	}
}

// TestPlaceBeforeOwnRecord: a node whose state is loaded but whose own
// record has not come back through its watch yet (the moment after a
// start) places on itself, as its record will say; it did once refuse the
// first create on a cluster of one with "no node has room".
func TestPlaceBeforeOwnRecord(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	c, err := New(Config{Endpoints: etcd.Endpoints(), Name: "solo", URL: "http://solo.test", Version: "test",
		LeaseTTL: 5 * time.Second, Local: newFakeLocal(2, "gvisor")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cli.Close() })
	// Not Run: as just after a start, etcd answers and the state is
	// loaded, but the node's own record is not in its view.
	c.mu.Lock()
	c.synced, c.problem, c.lastOK = true, "", time.Now()
	c.mu.Unlock()
	nodes, err := c.Place("gvisor")
	if err != nil || len(nodes) != 1 || nodes[0].Name != "solo" || nodes[0].URL != "http://solo.test" {
		t.Fatalf("Place(gvisor) before the own record = %+v, %v; want this node", nodes, err)
	}
	if nodes, err := c.Place("runc"); err != nil || len(nodes) != 0 {
		t.Fatalf("Place(runc) = %+v, %v; want no node (this one has no runc)", nodes, err)
	}
}
