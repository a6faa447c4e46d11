// Package cluster joins cubicled nodes into one service through etcd:
// each node registers itself under a lease (address, version, backends,
// capacity and load), the sandbox catalog (id → node, state, owner,
// times) lives under one prefix, and every node watches both, so that
// finding a sandbox's node or placing a new one costs no round trip to
// etcd. The node's own store (bbolt, internal/sandbox) stays the truth
// for what runs on it; the catalog is reconciled from it at start and on
// a schedule.
//
// etcd runs as its own cluster (Debian's etcd-server), not embedded in
// cubicled: an operator can stop, upgrade or move an etcd member without
// touching the sandboxes of the node beside it, three members survive
// the loss of one, and a cubicled crash never takes a Raft member down
// with it. The client is etcd's own (go.etcd.io/etcd/client/v3): leases,
// keep-alives, watches with revisions and transactions are exactly what
// membership and the catalog need, and writing them by hand over the
// gRPC gateway would repeat that client badly. It brings gRPC and zap;
// both stay inside this package.
package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Defaults of Config.
const (
	DefaultLeaseTTL   = 10 * time.Second
	DefaultCandidates = 3
	DefaultPrefix     = "/cubicle/"
	DefaultRefresh    = 2 * time.Second
	DefaultReconcile  = 10 * time.Second
	// callTimeout bounds one etcd call: with etcd away, a request that
	// needs it fails in this time instead of hanging.
	callTimeout = 3 * time.Second
)

// ErrUnavailable is returned by what needs etcd while this node cannot
// reach a quorum of it.
var ErrUnavailable = errors.New("the cluster's store (etcd) is unreachable")

// Load is what a node tells the others about itself.
type Load struct {
	// Backends are the backends this node can create sandboxes on.
	Backends []string `json:"backends"`
	// MaxSandboxes is the node's capacity and Live what it holds now
	// (sandboxes that take a slot: starting, running, pausing, resuming).
	MaxSandboxes int `json:"max_sandboxes"`
	Live         int `json:"live"`
	// FreeMemoryMB is the host's available memory.
	FreeMemoryMB int64 `json:"free_memory_mb"`
	// Pools are the warm desktops ready, by pool name.
	Pools map[string]int `json:"pools,omitempty"`
	// Draining nodes take no new sandboxes.
	Draining bool `json:"draining,omitempty"`
}

// Node is one member, as registered in etcd.
type Node struct {
	Name    string    `json:"name"`
	URL     string    `json:"url"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
	Load
}

// Entry is one sandbox in the catalog.
type Entry struct {
	ID      string    `json:"id"`
	Node    string    `json:"node"`
	State   string    `json:"state"`
	Owner   string    `json:"owner,omitempty"`
	Backend string    `json:"backend,omitempty"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires,omitzero"`
	// Sandbox is the sandbox as its node last showed it (API.md's
	// Sandbox object), answered for a node that is gone.
	Sandbox json.RawMessage `json:"sandbox,omitempty"`
}

func (e Entry) same(o Entry) bool {
	return e.ID == o.ID && e.Node == o.Node && e.State == o.State && e.Owner == o.Owner &&
		e.Backend == o.Backend && e.Created.Equal(o.Created) && e.Expires.Equal(o.Expires) &&
		string(e.Sandbox) == string(o.Sandbox)
}

// Local is what the cluster needs of this node: its load and what runs
// on it.
type Local interface {
	Load(ctx context.Context) Load
	Sandboxes(ctx context.Context) []Entry
}

// Config configures a node's membership.
type Config struct {
	// Endpoints are etcd's client URLs.
	Endpoints []string
	// Name is this node's name, unique in the cluster; URL the base URL
	// the other nodes reach its API at.
	Name, URL string
	// Version is cubicled's version, shown in the node list.
	Version string
	// LeaseTTL is how long a node that stopped renewing stays a member:
	// its sandboxes turn lost after it.
	LeaseTTL time.Duration
	// Candidates is K of the best-of-K placement.
	Candidates int
	// Prefix is where cubicle's keys live in etcd.
	Prefix string
	// Refresh is how often the node's load is written; Reconcile how
	// often the catalog is checked against the node's store.
	Refresh, Reconcile time.Duration
	// TLS, when set, is how the client reaches etcd's https endpoints
	// (the CA that signed them, and this node's client certificate when
	// etcd asks for one).
	TLS *tls.Config
	// Username and Password authenticate to etcd when its auth is on.
	Username, Password string
	// Local is this node; nil for a client that only reads (tests).
	Local Local
	Log   *slog.Logger
}

// Cluster is this node's view of the cluster.
type Cluster struct {
	cfg Config
	cli *clientv3.Client
	log *slog.Logger

	mu         sync.Mutex
	nodes      map[string]Node
	catalog    map[string]Entry
	pending    map[string]pending // creates placed on a node lately (pendingOf)
	lease      clientv3.LeaseID
	lastOK     time.Time // last time etcd answered this node
	problem    string    // why the node is degraded, "" when it is not
	synced     bool      // the watches have loaded the state once
	registered bool      // etcd has answered this node once
	written    struct {  // the node record last written
		lease clientv3.LeaseID
		load  Load
	}
	compacted time.Time // when this node last compacted etcd's history
	draining  bool
	started   time.Time
	watchRevs int64 // events seen by the watches, for the simulation's figures

	// now is the clock of the create budget (TakeCreate): time.Now, or a
	// test's clock that it moves instead of sleeping for a refill.
	now func() time.Time
}

// New connects to etcd; it does not block on it (Run does the work).
func New(cfg Config) (*Cluster, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("cluster: no etcd endpoints")
	}
	if cfg.Name == "" || strings.ContainsAny(cfg.Name, "/ \t\n") {
		return nil, fmt.Errorf("cluster: node name %q must be non-empty, without slashes or spaces", cfg.Name)
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeaseTTL < 2*time.Second {
		return nil, fmt.Errorf("cluster: lease TTL %v is below etcd's 2 s minimum", cfg.LeaseTTL)
	}
	if cfg.Candidates <= 0 {
		cfg.Candidates = DefaultCandidates
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Reconcile <= 0 {
		cfg.Reconcile = DefaultReconcile
	}
	if cfg.Refresh > cfg.LeaseTTL/3 {
		cfg.Refresh = cfg.LeaseTTL / 3 // three keep-alives per lease
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          callTimeout,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		TLS:                  cfg.TLS,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: etcd client: %w", err)
	}
	return &Cluster{
		cfg:     cfg,
		cli:     cli,
		log:     cfg.Log,
		nodes:   map[string]Node{},
		catalog: map[string]Entry{},
		pending: map[string]pending{},
		problem: "not yet registered with etcd",
		started: time.Now().UTC(),
		now:     time.Now,
	}, nil
}

// Close closes the etcd client. The node's lease is not revoked: a node
// restarted (a rolling upgrade) within its TTL never shows its sandboxes
// lost; one that stays away loses them when the lease runs out.
func (c *Cluster) Close() error { return c.cli.Close() }

// Name is this node's name.
func (c *Cluster) Name() string { return c.cfg.Name }

// LeaseTTL is how long a silent node stays a member.
func (c *Cluster) LeaseTTL() time.Duration { return c.cfg.LeaseTTL }

func (c *Cluster) nodeKey(name string) string { return c.cfg.Prefix + "nodes/" + name }
func (c *Cluster) entryKey(id string) string  { return c.cfg.Prefix + "sandboxes/" + id }

// Run keeps the node registered, its load current, the catalog
// reconciled and the watches running until ctx ends. etcd going away is
// not an error: Run keeps trying, and Degraded says why meanwhile.
func (c *Cluster) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.watchLoop(ctx, "nodes/", c.applyNode, c.resetNodes) }()
	go func() { defer wg.Done(); c.watchLoop(ctx, "sandboxes/", c.applyEntry, c.resetCatalog) }()
	defer wg.Wait()
	if c.cfg.Local == nil {
		<-ctx.Done()
		return nil
	}
	// Reconciling has a loop of its own: its writes, one per changed
	// sandbox, must never hold up the lease's keep-alive.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			wait := c.cfg.Refresh // until registered, then every Reconcile
			if c.Degraded() == "" {
				if err := c.Reconcile(ctx); err != nil && ctx.Err() == nil {
					c.log.Warn("cluster: reconcile", "err", err)
				} else {
					wait = c.cfg.Reconcile
				}
			}
			sleepCtx(ctx, wait)
		}
	}()
	refresh := time.NewTicker(c.cfg.Refresh)
	defer refresh.Stop()
	for {
		if err := c.register(ctx); err != nil {
			c.setProblem(err)
		} else {
			c.setOK()
			c.maybeCompact(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-refresh.C:
		}
	}
}

// register writes the node's record under its lease, granting a new
// lease when it has none or the old one expired.
func (c *Cluster) register(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	c.mu.Lock()
	lease := c.lease
	draining := c.draining
	c.mu.Unlock()
	if lease != 0 {
		// A keep-alive per refresh: a lost lease (etcd away longer than
		// the TTL) shows here as ErrLeaseNotFound, and a new one is taken.
		if _, err := c.cli.KeepAliveOnce(cctx, lease); err != nil {
			if !isLeaseGone(err) {
				return fmt.Errorf("renew lease: %w", err)
			}
			c.log.Warn("cluster: lease expired; registering again", "node", c.cfg.Name)
			lease = 0
		}
	}
	if lease == 0 {
		g, err := c.cli.Grant(cctx, int64(c.cfg.LeaseTTL/time.Second))
		if err != nil {
			return fmt.Errorf("grant lease: %w", err)
		}
		lease = g.ID
		c.mu.Lock()
		c.lease = lease
		c.mu.Unlock()
	}
	load := c.cfg.Local.Load(cctx)
	load.Draining = load.Draining || draining
	// Free memory in steps of 256 MiB: the record is written only when
	// the load changed (or with a new lease), since every write is an
	// event for every node's watch and a revision etcd keeps until
	// compacted; the lease's keep-alive alone keeps the node a member.
	load.FreeMemoryMB = load.FreeMemoryMB / 256 * 256
	c.mu.Lock()
	// Written again when the record is gone from the watched view too
	// (deleted by hand, or by another node's lease under the same name).
	own, present := c.nodes[c.cfg.Name]
	same := lease == c.written.lease && loadEqual(load, c.written.load) &&
		(!c.synced || (present && own.URL == c.cfg.URL && own.Started.Equal(c.started)))
	fresh := lease != c.written.lease
	c.mu.Unlock()
	if same {
		return nil
	}
	n := Node{Name: c.cfg.Name, URL: c.cfg.URL, Version: c.cfg.Version, Started: c.started,
		Updated: time.Now().UTC().Truncate(time.Millisecond), Load: load}
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	if fresh {
		// A new lease claims the name first: two nodes under one name
		// would each reconcile the other's sandboxes out of the catalog.
		if err := c.claim(cctx, lease, string(b)); err != nil {
			return err
		}
	} else {
		// Written only while the record there is still under this
		// node's lease: one deleted meanwhile (by hand, or expired) may
		// have been claimed by another node of the same name, and the
		// name is then claimed again, not taken.
		key := c.nodeKey(c.cfg.Name)
		resp, err := c.cli.Txn(cctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).
			Then(clientv3.OpPut(key, string(b), clientv3.WithLease(lease))).Commit()
		if err != nil {
			if isLeaseGone(err) {
				c.mu.Lock()
				c.lease = 0
				c.mu.Unlock()
			}
			return fmt.Errorf("register node: %w", err)
		}
		if !resp.Succeeded {
			if err := c.claim(cctx, lease, string(b)); err != nil {
				c.mu.Lock()
				c.written.lease = 0 // not a member until a claim succeeds
				c.mu.Unlock()
				return err
			}
		}
	}
	c.mu.Lock()
	c.written.lease, c.written.load = lease, load
	c.mu.Unlock()
	return nil
}

// ErrNameTaken is the problem of a node whose name a live node at
// another URL holds.
var ErrNameTaken = errors.New("node name taken")

// claim writes the node's record under a new lease if no record holds
// its name, or the record there is this node's own (the same URL: this
// node before a restart, its old lease not yet expired). A live record
// of another URL is another node: nothing is written, and the node
// stays degraded, saying so, until that one's lease ends.
func (c *Cluster) claim(ctx context.Context, lease clientv3.LeaseID, record string) error {
	key := c.nodeKey(c.cfg.Name)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, record, clientv3.WithLease(lease))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		if isLeaseGone(err) {
			c.mu.Lock()
			c.lease = 0
			c.mu.Unlock()
		}
		return fmt.Errorf("register node: %w", err)
	}
	if resp.Succeeded {
		return nil
	}
	var other Node
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		_ = json.Unmarshal(kvs[0].Value, &other)
		if other.URL != c.cfg.URL {
			return fmt.Errorf("%w: the live node at %s is registered as %q; give this one another --node-name (if that was this node under another --advertise-url, it joins once the old record's lease of at most %v ends)",
				ErrNameTaken, other.URL, c.cfg.Name, c.cfg.LeaseTTL)
		}
	}
	// This node's own record of before, or one that just expired: the
	// put takes it over (a record deleted meanwhile is simply written).
	if _, err := c.cli.Put(ctx, key, record, clientv3.WithLease(lease)); err != nil {
		if isLeaseGone(err) {
			c.mu.Lock()
			c.lease = 0
			c.mu.Unlock()
		}
		return fmt.Errorf("register node: %w", err)
	}
	return nil
}

func loadEqual(a, b Load) bool {
	return slices.Equal(a.Backends, b.Backends) && a.MaxSandboxes == b.MaxSandboxes && a.Live == b.Live &&
		a.FreeMemoryMB == b.FreeMemoryMB && a.Draining == b.Draining && maps.Equal(a.Pools, b.Pools)
}

// compactEvery is how often etcd's history is compacted, and
// compactKeep how many revisions are kept behind the newest: enough for a
// watch that broke a moment ago to resume, little enough that the node
// records' and catalog's old versions do not fill etcd's quota.
const (
	compactEvery = 5 * time.Minute
	compactKeep  = 10000
)

// maybeCompact compacts etcd's history every compactEvery, from one node
// only: the live member whose name sorts first.
func (c *Cluster) maybeCompact(ctx context.Context) {
	c.mu.Lock()
	first := c.cfg.Name
	for name := range c.nodes {
		if name < first {
			first = name
		}
	}
	due := time.Since(c.compacted) > compactEvery
	c.mu.Unlock()
	if first != c.cfg.Name || !due {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.cli.Get(cctx, c.nodeKey(c.cfg.Name))
	if err != nil {
		return
	}
	c.mu.Lock()
	c.compacted = time.Now()
	c.mu.Unlock()
	if rev := resp.Header.Revision - compactKeep; rev > 0 {
		if _, err := c.cli.Compact(cctx, rev); err != nil && !strings.Contains(err.Error(), "compacted") {
			c.log.Warn("cluster: compact etcd's history", "revision", rev, "err", err)
		}
	}
}

func isLeaseGone(err error) bool {
	return err != nil && strings.Contains(err.Error(), "requested lease not found")
}

func (c *Cluster) setProblem(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.problem
	c.problem = err.Error()
	if was == "" {
		c.log.Warn("cluster: degraded", "err", err)
	}
}

func (c *Cluster) setOK() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.problem != "" && c.registered {
		c.log.Info("cluster: etcd reachable again", "node", c.cfg.Name)
	}
	c.registered = true
	c.problem = ""
	c.lastOK = time.Now()
}

// Degraded says why this node cannot act for the cluster now (etcd
// unreachable, no quorum, not registered), or "" when it can.
func (c *Cluster) Degraded() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	// One failed call is not a degraded node: etcd answering again
	// within half a lease (its own elections take a second or so) is
	// ordinary.
	if c.problem != "" && (c.lastOK.IsZero() || time.Since(c.lastOK) > c.cfg.LeaseTTL/2) {
		return c.problem
	}
	if !c.synced {
		return "the cluster's state is not loaded yet"
	}
	return ""
}

// Drain marks this node as taking no new sandboxes (true) or taking them
// again; the others see it at the next refresh.
func (c *Cluster) Drain(on bool) {
	c.mu.Lock()
	c.draining = on
	c.mu.Unlock()
}

// Draining reports whether this node is draining (by Drain, or as its
// Local's load says).
func (c *Cluster) Draining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining || c.written.load.Draining
}

// watchLoop loads a prefix and follows it, starting again from a fresh
// load whenever the watch breaks (etcd away, compaction).
func (c *Cluster) watchLoop(ctx context.Context, sub string, apply func(key string, val []byte), reset func(map[string][]byte)) {
	prefix := c.cfg.Prefix + sub
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		resp, err := c.cli.Get(cctx, prefix, clientv3.WithPrefix())
		cancel()
		if err != nil {
			c.setProblem(fmt.Errorf("load %s: %w", sub, err))
			sleepCtx(ctx, time.Second)
			continue
		}
		all := make(map[string][]byte, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			all[strings.TrimPrefix(string(kv.Key), prefix)] = kv.Value
		}
		reset(all)
		c.mu.Lock()
		c.synced = true
		c.mu.Unlock()
		if c.cfg.Local == nil {
			c.setOK() // a reader has no registration to say so
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := c.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if err := wr.Err(); err != nil {
				c.log.Debug("cluster: watch ended", "prefix", sub, "err", err)
				break
			}
			for _, ev := range wr.Events {
				key := strings.TrimPrefix(string(ev.Kv.Key), prefix)
				if ev.Type == clientv3.EventTypeDelete {
					apply(key, nil)
				} else {
					apply(key, ev.Kv.Value)
				}
			}
			c.mu.Lock()
			c.watchRevs += int64(len(wr.Events))
			c.mu.Unlock()
		}
		wcancel()
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (c *Cluster) applyNode(name string, val []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if val == nil {
		delete(c.nodes, name)
		delete(c.pending, name)
		return
	}
	var n Node
	if err := json.Unmarshal(val, &n); err != nil || n.Name != name {
		c.log.Warn("cluster: bad node record", "node", name, "err", err)
		return
	}
	c.nodes[name] = n
	delete(c.pending, name)
}

// resetNodes replaces the view of the members at once: never empty in
// between, which would show every sandbox lost for a moment.
func (c *Cluster) resetNodes(all map[string][]byte) {
	nodes := make(map[string]Node, len(all))
	for name, v := range all {
		var n Node
		if err := json.Unmarshal(v, &n); err != nil || n.Name != name {
			c.log.Warn("cluster: bad node record", "node", name, "err", err)
			continue
		}
		nodes[name] = n
	}
	c.mu.Lock()
	c.nodes = nodes
	c.mu.Unlock()
}

func (c *Cluster) applyEntry(id string, val []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if val == nil {
		delete(c.catalog, id)
		return
	}
	var e Entry
	if err := json.Unmarshal(val, &e); err != nil || e.ID != id {
		c.log.Warn("cluster: bad catalog entry", "sandbox", id, "err", err)
		return
	}
	c.catalog[id] = e
}

func (c *Cluster) resetCatalog(all map[string][]byte) {
	catalog := make(map[string]Entry, len(all))
	for id, v := range all {
		var e Entry
		if err := json.Unmarshal(v, &e); err != nil || e.ID != id {
			c.log.Warn("cluster: bad catalog entry", "sandbox", id, "err", err)
			continue
		}
		catalog[id] = e
	}
	c.mu.Lock()
	c.catalog = catalog
	c.mu.Unlock()
}

// Nodes lists the live members, by name.
func (c *Cluster) Nodes() []Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Node returns a live member by name.
func (c *Cluster) Node(name string) (Node, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[name]
	return n, ok
}

// Location is where a sandbox is.
type Location struct {
	Entry
	// Alive is false when the sandbox's node is not a member: its lease
	// expired, so its sandboxes are lost until it comes back.
	Alive bool
	// URL is the node's API when Alive.
	URL string
}

// Locate finds sandbox id in the catalog: from the watched copy, or,
// with remote, from etcd for one created a moment ago that the watch has
// not brought yet. found is false for an id the catalog does not hold.
func (c *Cluster) Locate(ctx context.Context, id string, remote bool) (loc Location, found bool, err error) {
	c.mu.Lock()
	e, ok := c.catalog[id]
	c.mu.Unlock()
	if !ok && !remote {
		return Location{}, false, nil
	}
	if !ok {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		resp, gerr := c.cli.Get(cctx, c.entryKey(id))
		cancel()
		if gerr != nil {
			return Location{}, false, fmt.Errorf("%w: %v", ErrUnavailable, gerr)
		}
		if len(resp.Kvs) == 0 {
			return Location{}, false, nil
		}
		if err := json.Unmarshal(resp.Kvs[0].Value, &e); err != nil {
			return Location{}, false, fmt.Errorf("catalog entry %s: %w", id, err)
		}
	}
	c.mu.Lock()
	n, alive := c.nodes[e.Node]
	c.mu.Unlock()
	return Location{Entry: e, Alive: alive, URL: n.URL}, true, nil
}

// LiveOf counts owner's sandboxes that take a slot (starting, running,
// pausing, resuming) on the live nodes other than this one: the rest of
// the cluster's part of a per-key quota. A lost node's sandboxes do not
// count while it is gone.
func (c *Cluster) LiveOf(owner string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, e := range c.catalog {
		if e.Owner != owner || e.Node == c.cfg.Name {
			continue
		}
		if _, alive := c.nodes[e.Node]; !alive {
			continue
		}
		switch e.State {
		case "starting", "running", "pausing", "resuming":
			n++
		}
	}
	return n
}

// Entries returns the catalog's entries that keep returns true for.
func (c *Cluster) Entries(keep func(Entry) bool) []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Entry
	for _, e := range c.catalog {
		if keep == nil || keep(e) {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Put writes one of this node's sandboxes to the catalog at once (after
// a create); Reconcile would bring it within its period anyway.
func (c *Cluster) Put(ctx context.Context, e Entry) error {
	if !c.member() {
		// Not yet registered, or the name is another node's: an entry
		// under that name would be its to reconcile away.
		return fmt.Errorf("%w: put %s: this node is not registered yet", ErrUnavailable, e.ID)
	}
	e.Node = c.cfg.Name
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := c.cli.Put(cctx, c.entryKey(e.ID), string(b)); err != nil {
		return fmt.Errorf("%w: put %s: %v", ErrUnavailable, e.ID, err)
	}
	c.mu.Lock()
	c.catalog[e.ID] = e
	c.mu.Unlock()
	return nil
}

// Remove deletes one of this node's sandboxes from the catalog, unless
// another node holds its entry now.
func (c *Cluster) Remove(ctx context.Context, id string) error {
	if !c.member() {
		return fmt.Errorf("%w: remove %s: this node is not registered", ErrUnavailable, id)
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := c.removeIfMine(cctx, id); err != nil {
		return fmt.Errorf("%w: remove %s: %v", ErrUnavailable, id, err)
	}
	c.mu.Lock()
	if e, ok := c.catalog[id]; ok && e.Node == c.cfg.Name {
		delete(c.catalog, id)
	}
	c.mu.Unlock()
	return nil
}

func (c *Cluster) removeIfMine(ctx context.Context, id string) error {
	key := c.entryKey(id)
	resp, err := c.cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return err
	}
	var e Entry
	if json.Unmarshal(resp.Kvs[0].Value, &e) == nil && e.Node != c.cfg.Name {
		return nil
	}
	_, err = c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(key)).Commit()
	return err
}

// rateState is one key's create budget, kept in etcd for all nodes: a
// token bucket, as golang.org/x/time/rate keeps one in memory.
type rateState struct {
	Tokens float64 `json:"tokens"`
	At     int64   `json:"at"` // unix nanoseconds of the last take
}

// TakeCreate takes one create from owner's budget of r a second, in
// bursts of at most burst, shared by every node: one read and one
// compare-and-swap in etcd, retried when another node took from the same
// budget in between. It answers false when the budget is spent, and an
// error (ErrUnavailable) when etcd cannot be asked or the budget kept
// changing under it through 8 tries, for the caller to fall back to a
// limit of its own.
func (c *Cluster) TakeCreate(ctx context.Context, owner string, r float64, burst int) (bool, error) {
	if p := c.Degraded(); p != "" {
		return false, fmt.Errorf("%w: %s", ErrUnavailable, p)
	}
	key := c.cfg.Prefix + "rates/" + owner
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	for range 8 {
		resp, err := c.cli.Get(cctx, key)
		if err != nil {
			return false, fmt.Errorf("%w: create budget: %v", ErrUnavailable, err)
		}
		now := c.now().UnixNano()
		st := rateState{Tokens: float64(burst), At: now}
		var rev int64 // 0: no budget yet (etcd compares a missing key's revision as 0)
		if len(resp.Kvs) == 1 {
			rev = resp.Kvs[0].ModRevision
			var old rateState
			if json.Unmarshal(resp.Kvs[0].Value, &old) == nil {
				// A node whose clock is behind the last taker's adds
				// nothing; its own time is written, so that a node
				// whose clock ran ahead holds no one up for long.
				elapsed := max(float64(now-old.At)/1e9, 0)
				st.Tokens = min(float64(burst), old.Tokens+elapsed*r)
			}
		}
		if st.Tokens < 1 {
			return false, nil
		}
		st.Tokens--
		b, err := json.Marshal(st)
		if err != nil {
			return false, err
		}
		txn, err := c.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return false, fmt.Errorf("%w: create budget: %v", ErrUnavailable, err)
		}
		if txn.Succeeded {
			return true, nil
		}
		// Another take came first: again, after a short random wait, so
		// that racing takes spread out.
		sleepCtx(cctx, time.Duration(rand.IntN(20)+1)*time.Millisecond)
	}
	// Many creates of one key at once, across nodes: the caller's own
	// limit decides this one.
	return false, fmt.Errorf("%w: the create budget of a key kept changing under this node", ErrUnavailable)
}

// Sync is Reconcile, for a caller that just changed what runs here.
func (c *Cluster) Sync(ctx context.Context) error {
	if c.cfg.Local == nil {
		return nil
	}
	return c.Reconcile(ctx)
}

// Reconcile makes the catalog's entries of this node what its store
// holds: entries of sandboxes it has are written where they differ, and
// entries of sandboxes it no longer has are deleted. It returns how many
// were written and deleted.
func (c *Cluster) Reconcile(ctx context.Context) error {
	_, _, err := c.reconcile(ctx)
	return err
}

// member reports whether this node holds its name in etcd now (its
// record written under its current lease): only then are the catalog's
// entries under its name its own to write and delete.
func (c *Cluster) member() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lease != 0 && c.lease == c.written.lease
}

func (c *Cluster) reconcile(ctx context.Context) (put, deleted int, err error) {
	if !c.member() {
		// A node refused its name sees another node's entries as its
		// own, and would delete them.
		return 0, 0, fmt.Errorf("%w: this node is not registered", ErrUnavailable)
	}
	local := c.cfg.Local.Sandboxes(ctx)
	have := make(map[string]bool, len(local))
	c.mu.Lock()
	var stale []string
	var changed []Entry
	for _, e := range local {
		e.Node = c.cfg.Name
		have[e.ID] = true
		if old, ok := c.catalog[e.ID]; !ok || !old.same(e) {
			changed = append(changed, e)
		}
	}
	for id, e := range c.catalog {
		if e.Node == c.cfg.Name && !have[id] {
			stale = append(stale, id)
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, e := range changed {
		if err := c.Put(ctx, e); err != nil {
			errs = append(errs, err)
			continue
		}
		put++
	}
	for _, id := range stale {
		if err := c.Remove(ctx, id); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted++
	}
	if put+deleted > 0 {
		c.log.Debug("cluster: catalog reconciled", "node", c.cfg.Name, "written", put, "deleted", deleted)
	}
	return put, deleted, errors.Join(errs...)
}

// Place chooses nodes for a new sandbox of backend ("" for any): K live,
// undrained members with a free slot that offer the backend, drawn at
// random, best first (most free slots, then most free memory). The first
// is the choice; the rest are where to try next when it refuses. It
// needs the cluster: ErrUnavailable while this node is degraded.
func (c *Cluster) Place(backend string) ([]Node, error) {
	if why := c.Degraded(); why != "" {
		return nil, fmt.Errorf("%w (%s)", ErrUnavailable, why)
	}
	// A node that has just started may not see its own record yet (its
	// first write is on its way, or not yet back through the watch): it
	// is a member all the same and places on itself as its record will
	// say. Without this the first create after a start could find no
	// node with room on a cluster of one.
	c.mu.Lock()
	_, known := c.nodes[c.cfg.Name]
	c.mu.Unlock()
	var self *Node
	if !known {
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		self = &Node{Name: c.cfg.Name, URL: c.cfg.URL, Version: c.cfg.Version, Started: c.started, Load: c.cfg.Local.Load(lctx)}
		cancel()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	members := make([]Node, 0, len(c.nodes)+1)
	for _, n := range c.nodes {
		members = append(members, n)
	}
	if _, ok := c.nodes[c.cfg.Name]; !ok && self != nil {
		members = append(members, *self)
	}
	fits := func(withPending bool) []Node {
		var fit []Node
		for _, n := range members {
			room := n.MaxSandboxes - n.Live
			if withPending {
				room -= c.pendingOf(n.Name)
			}
			if n.Draining || n.URL == "" || room <= 0 {
				continue
			}
			if backend != "" && !slices.Contains(n.Backends, backend) {
				continue
			}
			fit = append(fit, n)
		}
		return fit
	}
	fit := fits(true)
	if len(fit) == 0 {
		// The creates placed since the records were written may not all
		// have come (refused, failed, or still to be counted): the
		// records alone decide, and a full node refuses for itself.
		fit = fits(false)
	}
	rand.Shuffle(len(fit), func(i, j int) { fit[i], fit[j] = fit[j], fit[i] })
	if len(fit) > c.cfg.Candidates {
		fit = fit[:c.cfg.Candidates]
	}
	free := func(n Node) int { return n.MaxSandboxes - n.Live - c.pendingOf(n.Name) }
	sort.SliceStable(fit, func(i, j int) bool {
		if fi, fj := free(fit[i]), free(fit[j]); fi != fj {
			return fi > fj
		}
		return fit[i].FreeMemoryMB > fit[j].FreeMemoryMB
	})
	if len(fit) > 0 {
		// Until the node's next record counts it, the sandbox placed
		// there now is counted here, so a burst of creates spreads.
		p := c.pending[fit[0].Name]
		if p.n == 0 || time.Since(p.since) > 2*c.cfg.Refresh {
			p = pending{since: time.Now()}
		}
		p.n++
		c.pending[fit[0].Name] = p
	}
	return fit, nil
}

// pending counts the creates placed on a node since since: until its
// record counts them. A node whose record has not changed within two
// refreshes did not get them (they failed, or went elsewhere), so they
// stop counting.
type pending struct {
	n     int
	since time.Time
}

func (c *Cluster) pendingOf(name string) int {
	p := c.pending[name]
	if time.Since(p.since) > 2*c.cfg.Refresh {
		return 0
	}
	return p.n
}

// Stats are figures of this node's view, for metrics and the simulation.
type Stats struct {
	Nodes, Entries int
	// WatchEvents counts the events both watches brought.
	WatchEvents int64
}

// Stats returns figures of this node's view.
func (c *Cluster) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Nodes: len(c.nodes), Entries: len(c.catalog), WatchEvents: c.watchRevs}
}
