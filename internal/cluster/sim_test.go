package cluster

import (
	"context"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cubicle-dev/cubicle/internal/cluster/etcdtest"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// The simulation's shape: 100 nodes with fake drivers, 10 000 sandboxes
// created by 16 clients at once, a 3-member etcd, and 10 nodes crashing
// together at the end.
const (
	simMembers   = 3
	simNodes     = 100
	simSandboxes = 10000
	simWorkers   = 16
	simDead      = 10
	simCapacity  = 250 // slots per node: 2.5 times the mean it gets
	simTTL       = 3 * time.Second
	simRefresh   = time.Second
	simReconcile = 2 * time.Second
)

// TestSimulation runs the real placement and catalog code — every node a
// *Cluster with its own etcd client, both watches and its refresh loop —
// against a real etcd, so that the design's limits are figures rather
// than guesses. The figures are logged, and written as a markdown table
// to the file named by CUBICLE_SIM_REPORT when it is set.
func TestSimulation(t *testing.T) {
	needs.Long(t, "the 100-node simulation takes a minute or two")
	began := time.Now()
	rep := &simReport{}
	rep.add("etcd members", "%d (Debian etcd-server 3.4, loopback, one disk)", simMembers)
	rep.add("nodes × sandboxes", "%d × %d, %d clients creating at once", simNodes, simSandboxes, simWorkers)
	rep.add("lease TTL / refresh / reconcile", "%v / %v / %v", simTTL, simRefresh, simReconcile)

	etcd := etcdtest.Start(t, simMembers)
	logs := newCountingHandler()
	log := slog.New(logs)

	// Start: every node registers and loads both prefixes.
	t0 := time.Now()
	nodes := make([]*node, simNodes)
	byName := make(map[string]*node, simNodes)
	for i := range nodes {
		name := fmt.Sprintf("n%03d", i)
		nodes[i] = startSimNode(t, etcd.Endpoints(), name, log)
		byName[name] = nodes[i]
	}
	waitUntil(t, 60*time.Second, "every node to see every node", func() bool {
		for _, n := range nodes {
			if n.Degraded() != "" || n.Stats().Nodes != simNodes {
				return false
			}
		}
		return true
	})
	rep.add("start: all nodes see all nodes", "%v", time.Since(t0).Round(time.Millisecond))

	// Create: a random front node places, the chosen node takes the
	// sandbox into its store and writes its catalog entry.
	ctx := context.Background()
	watchBefore := sumWatchEvents(nodes)
	placeLat := make([][]time.Duration, simWorkers)
	putLat := make([][]time.Duration, simWorkers)
	var next atomic.Int64
	// A front node that cannot place (degraded: etcd slow to answer its
	// refresh) sends the client to another, as a load balancer would; a
	// Put that fails leaves the entry to the chosen node's reconcile.
	// Both are counted; a sandbox that no front placed in 10 s fails.
	var refused, putFailed atomic.Int64
	var unplacedMu sync.Mutex
	var unplaced []error
	created := time.Now().UTC()
	t0 = time.Now()
	var wg sync.WaitGroup
	for w := range simWorkers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for next.Add(1) <= simSandboxes {
				var cands []Node
				var err error
				for deadline := time.Now().Add(10 * time.Second); ; {
					front := nodes[rng.IntN(len(nodes))]
					start := time.Now()
					cands, err = front.Place("")
					placeLat[w] = append(placeLat[w], time.Since(start))
					if (err == nil && len(cands) > 0) || time.Now().After(deadline) {
						break
					}
					refused.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
				if err != nil || len(cands) == 0 {
					unplacedMu.Lock()
					unplaced = append(unplaced, fmt.Errorf("Place = %v, %v", cands, err))
					unplacedMu.Unlock()
					continue
				}
				chosen := byName[cands[0].Name]
				e := simEntry(rng, chosen.Name(), created)
				chosen.local.add(e)
				start := time.Now()
				err = chosen.Put(ctx, e)
				putLat[w] = append(putLat[w], time.Since(start))
				if err != nil {
					putFailed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	createTook := time.Since(t0)
	watchDuring := sumWatchEvents(nodes) - watchBefore
	if len(unplaced) > 0 {
		t.Fatalf("%d of %d sandboxes found no node in 10 s; the first: %v", len(unplaced), simSandboxes, unplaced[0])
	}
	pl, pu := slices.Concat(placeLat...), slices.Concat(putLat...)
	rep.add("create phase", "%v, %.0f creates/s", createTook.Round(time.Millisecond), simSandboxes/createTook.Seconds())
	rep.add("Place() latency p50 / p95 / p99 / max", "%s", percentiles(pl))
	rep.add("Put() latency p50 / p95 / p99 / max", "%s", percentiles(pu))
	rep.add("Place refused (front degraded) / Put failed", "%d / %d", refused.Load(), putFailed.Load())
	rep.add("watch events, create phase (all nodes)", "%d: %.0f/s, %d per node",
		watchDuring, float64(watchDuring)/createTook.Seconds(), watchDuring/simNodes)

	// Every view holds the whole catalog soon after the last write.
	t0 = time.Now()
	waitUntil(t, 60*time.Second, "every node's view to hold the whole catalog", func() bool {
		for _, n := range nodes {
			if n.Stats().Entries != simSandboxes {
				return false
			}
		}
		return true
	})
	rep.add("whole catalog in every view, after the last create", "%v", time.Since(t0).Round(time.Millisecond))

	// The catalog in etcd: one entry per sandbox, on the node that has it.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	resp, err := nodes[0].cli.Get(cctx, DefaultPrefix+"sandboxes/", clientv3.WithPrefix())
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	where := map[string]string{}
	for _, n := range nodes {
		for _, e := range n.local.Sandboxes(ctx) {
			where[e.ID] = n.Name()
		}
	}
	if got := len(resp.Kvs); got != simSandboxes || len(where) != simSandboxes {
		t.Fatalf("the catalog holds %d entries and the nodes %d sandboxes; want %d", got, len(where), simSandboxes)
	}
	var keyBytes, valBytes, sbBytes int
	for _, kv := range resp.Kvs {
		keyBytes += len(kv.Key)
		valBytes += len(kv.Value)
		var e Entry
		if err := json.Unmarshal(kv.Value, &e); err != nil {
			t.Fatalf("entry %s: %v", kv.Key, err)
		}
		if want := where[e.ID]; e.Node != want {
			t.Fatalf("entry %s names node %q; the sandbox is on %q", e.ID, e.Node, want)
		}
		sbBytes += len(e.Sandbox)
	}
	rep.add("catalog keys", "%d", len(resp.Kvs))
	rep.add("catalog bytes (values / keys)", "%.2f MB / %.2f MB", mb(valBytes), mb(keyBytes))
	rep.add("bytes per entry (value / key)", "%d / %d", valBytes/len(resp.Kvs), keyBytes/len(resp.Kvs))
	rep.add("of which the Sandbox object", "%d bytes", sbBytes/len(resp.Kvs))
	st0, err := nodes[0].cli.Status(ctx, etcd.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	rep.add("etcd database size (member 0)", "%.1f MB", mb(int(st0.DbSize)))

	// Idle: no creates, yet every node rewrites its record each refresh,
	// a revision that etcd keeps until compacted and an event for every
	// node's watch.
	recs, err := nodes[0].cli.Get(ctx, DefaultPrefix+"nodes/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var recBytes int
	for _, kv := range recs.Kvs {
		recBytes += len(kv.Key) + len(kv.Value)
	}
	recBytes /= len(recs.Kvs)
	const idle = 5 * time.Second
	watch0 := sumWatchEvents(nodes)
	time.Sleep(idle)
	watchIdle := sumWatchEvents(nodes) - watch0
	st1, err := nodes[0].cli.Status(ctx, etcd.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	revs := float64(st1.Header.Revision-recs.Header.Revision) / idle.Seconds()
	rep.add("idle: node records written / watch events", "%.0f/s (%d bytes each) / %.0f/s",
		revs, recBytes, float64(watchIdle)/idle.Seconds())
	rep.add("idle: etcd history growth without compaction", "≈ %.0f MB/hour of keys and values (database %.1f → %.1f MB in %v)",
		revs*float64(recBytes)*3600/(1<<20), mb(int(st0.DbSize)), mb(int(st1.DbSize)), idle)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.add("Go heap, all nodes' views and clients", "%.0f MB (%.1f MB per node)",
		mb(int(ms.HeapAlloc)), mb(int(ms.HeapAlloc))/simNodes)

	// Spread: best-of-K over records a second old, plus the pending
	// counts, keeps every node near the mean.
	minN, maxN := simSandboxes, 0
	for _, n := range nodes {
		c := len(n.local.Sandboxes(ctx))
		minN, maxN = min(minN, c), max(maxN, c)
	}
	mean := simSandboxes / simNodes
	rep.add("sandboxes per node min / mean / max", "%d / %d / %d", minN, mean, maxN)
	if maxN > 2*mean || minN == 0 {
		t.Fatalf("placement spread %d..%d sandboxes per node (mean %d); want at most %d and none empty", minN, maxN, mean, 2*mean)
	}

	// Crash: 10 nodes stop at once without revoking their leases. Every
	// survivor must see each of them gone — its sandboxes lost — about
	// a lease TTL later, and place nothing there.
	dead, alive := nodes[simNodes-simDead:], nodes[:simNodes-simDead]
	isDead := map[string]bool{}
	var deadIDs []string // one sandbox of each dead node
	for _, n := range dead {
		isDead[n.Name()] = true
		deadIDs = append(deadIDs, n.local.Sandboxes(ctx)[0].ID)
	}
	rep.add("warnings logged by the nodes before the crash", "%s", logs.String())
	t0 = time.Now()
	for _, n := range dead {
		wg.Go(n.stop)
	}
	wg.Wait()
	rng := rand.New(rand.NewPCG(7, 7))
	var windowPlaces, windowDead int
	limit := 3*simTTL + 5*time.Second
	took := waitUntil(t, limit, "every survivor to see the 10 crashed nodes gone", func() bool {
		// Placements meanwhile may still offer a crashed node: the
		// window the figures show.
		for range 5 {
			cands, err := alive[rng.IntN(len(alive))].Place("")
			if err == nil && len(cands) > 0 {
				windowPlaces++
				if isDead[cands[0].Name] {
					windowDead++
				}
			}
		}
		for _, n := range alive {
			for i, id := range deadIDs {
				loc, found, err := n.Locate(ctx, id, true)
				if err != nil || !found || loc.Alive {
					return false
				}
				if _, ok := n.Node(dead[i].Name()); ok {
					return false
				}
			}
		}
		return true
	})
	rep.add("convergence after 10 nodes crash", "%v (lease TTL %v)", took.Round(time.Millisecond), simTTL)
	rep.add("placements in that window choosing a crashed node", "%d of %d", windowDead, windowPlaces)
	// A survivor whose lease ran out under the load registers again
	// within a refresh; one missing for longer is a fault.
	waitUntil(t, simTTL, "every survivor to see the other survivors", func() bool {
		for _, n := range alive {
			if n.Stats().Nodes != len(alive) {
				return false
			}
		}
		return true
	})
	for _, n := range alive {
		for range 20 {
			cands, err := n.Place("")
			if err != nil || len(cands) == 0 {
				t.Fatalf("Place on %s after the crash = %v, %v", n.Name(), cands, err)
			}
			for _, c := range cands {
				if isDead[c.Name] {
					t.Fatalf("Place on %s offered %s, which crashed %v ago", n.Name(), c.Name, time.Since(t0))
				}
			}
		}
	}

	rep.add("warnings logged by the nodes, whole run", "%s", logs.String())
	rep.add("test wall time", "%v", time.Since(began).Round(time.Millisecond))
	for _, r := range rep.rows {
		t.Logf("%-52s %s", r[0], r[1])
	}
	if path := os.Getenv("CUBICLE_SIM_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(rep.markdown()), 0o644); err != nil {
			t.Errorf("write the report: %v", err)
		}
	}
}

func startSimNode(t *testing.T, endpoints []string, name string, log *slog.Logger) *node {
	t.Helper()
	local := newFakeLocal(simCapacity, "gvisor", "runc")
	c, err := New(Config{Endpoints: endpoints, Name: name, URL: "http://" + name + ".test:8080", Version: "sim",
		LeaseTTL: simTTL, Refresh: simRefresh, Reconcile: simReconcile, Local: local, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{Cluster: c, local: local, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(n.done); _ = c.Run(ctx) }()
	t.Cleanup(n.stop)
	return n
}

// simSandbox is API.md's Sandbox object, as the catalog carries it.
type simSandbox struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	Template   string `json:"template"`
	Backend    string `json:"backend"`
	Isolation  string `json:"isolation"`
	Resolution struct {
		Width  int `json:"width"`
		Height int `json:"height"`
	} `json:"resolution"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	LastActiveAt time.Time         `json:"last_active_at"`
	Metadata     map[string]string `json:"metadata"`
	IP           string            `json:"ip,omitempty"`
	Desktop      *bool             `json:"desktop,omitempty"`
	Node         string            `json:"node,omitempty"`
}

// simEntry is a running sandbox on node with an ID like the manager's
// and a Sandbox object of about 600 bytes.
func simEntry(rng *rand.Rand, node string, created time.Time) Entry {
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	id := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
	owner := fmt.Sprintf("key-%016x", rng.Uint64())
	desktop := true
	sb := simSandbox{ID: id, State: "running", Template: "desktop-xfce", Backend: "gvisor", Isolation: "gvisor",
		CreatedAt: created, ExpiresAt: created.Add(time.Hour), LastActiveAt: created.Add(time.Duration(rng.IntN(60)) * time.Second),
		IP: fmt.Sprintf("10.88.%d.%d", rng.IntN(256), 2+rng.IntN(250)), Desktop: &desktop, Node: node,
		Metadata: map[string]string{
			"owner":      "team-browser-agents",
			"purpose":    "computer-use evaluation",
			"run":        fmt.Sprintf("eval-run-%06d", rng.IntN(1000000)),
			"task":       fmt.Sprintf("webarena-task-%04d", rng.IntN(10000)),
			"model":      "agent-model-large-2025-06",
			"session_id": fmt.Sprintf("%032x", rng.Uint64()),
		}}
	sb.Resolution.Width, sb.Resolution.Height = 1280, 800
	raw, err := json.Marshal(sb)
	if err != nil {
		panic(err)
	}
	return Entry{ID: id, Node: node, State: "running", Owner: owner, Backend: "gvisor",
		Created: created, Expires: sb.ExpiresAt, Sandbox: raw}
}

func sumWatchEvents(nodes []*node) int64 {
	var sum int64
	for _, n := range nodes {
		sum += n.Stats().WatchEvents
	}
	return sum
}

// percentiles formats p50, p95, p99 and the maximum of ds.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	slices.Sort(ds)
	at := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1)+0.5)] }
	r := func(d time.Duration) time.Duration {
		if d < time.Millisecond {
			return d.Round(100 * time.Nanosecond)
		}
		return d.Round(10 * time.Microsecond)
	}
	return fmt.Sprintf("%v / %v / %v / %v", r(at(0.50)), r(at(0.95)), r(at(0.99)), r(ds[len(ds)-1]))
}

func mb(n int) float64 { return float64(n) / (1 << 20) }

// simReport is the simulation's figures, in order.
type simReport struct{ rows [][2]string }

func (r *simReport) add(name, format string, args ...any) {
	r.rows = append(r.rows, [2]string{name, fmt.Sprintf(format, args...)})
}

func (r *simReport) markdown() string {
	var b strings.Builder
	b.WriteString("| Figure | Value |\n|---|---|\n")
	for _, row := range r.rows {
		fmt.Fprintf(&b, "| %s | %s |\n", row[0], strings.ReplaceAll(row[1], "|", `\|`))
	}
	return b.String()
}

// countingHandler counts the nodes' warnings by message instead of
// printing a hundred nodes' worth of them.
type countingHandler struct {
	mu     sync.Mutex
	counts map[string]int
}

func newCountingHandler() *countingHandler { return &countingHandler{counts: map[string]int{}} }

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.counts[r.Message]++
	h.mu.Unlock()
	return nil
}

func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.counts) == 0 {
		return "none"
	}
	var out []string
	for msg, n := range h.counts {
		out = append(out, fmt.Sprintf("%q ×%d", msg, n))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// BenchmarkPlace is one placement on a node that knows 100 nodes: it
// reads the in-memory view only, no etcd.
func BenchmarkPlace(b *testing.B) {
	c := &Cluster{cfg: Config{Candidates: DefaultCandidates}, nodes: map[string]Node{},
		catalog: map[string]Entry{}, pending: map[string]pending{}, synced: true, log: slog.Default()}
	for i := range simNodes {
		name := fmt.Sprintf("n%03d", i)
		c.nodes[name] = Node{Name: name, URL: "http://" + name + ".test:8080",
			Load: Load{Backends: []string{"gvisor", "runc"}, MaxSandboxes: 1 << 30, Live: i, FreeMemoryMB: 1000}}
	}
	b.ReportAllocs()
	for b.Loop() {
		if nodes, err := c.Place("gvisor"); err != nil || len(nodes) != DefaultCandidates {
			b.Fatalf("Place = %v, %v", nodes, err)
		}
	}
}
