package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// Clock tells the time; tests give the reaper a fake one.
type Clock interface {
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// ImageResolver maps a template name to the rootfs directory of its image.
type ImageResolver func(template string) (string, error)

// Config configures a Manager. Zero values get the defaults noted.
type Config struct {
	DataDir        string                   // store location (required)
	Drivers        map[string]driver.Driver // backends by name (required)
	DefaultBackend string                   // "auto" (default) or a backend name
	Images         ImageResolver            // template → rootfs (required)
	// DefaultTemplate is the image of a create that names none (default
	// "desktop"; "desktop-lite" trades XFCE for density).
	DefaultTemplate string
	MaxSandboxes    int // default 16
	// MaxPerOwner caps the live sandboxes of one owner (one API key, see
	// CreateRequest.Owner); 0 means only MaxSandboxes applies.
	MaxPerOwner int
	// OwnerCreateRate and OwnerCreateBurst limit how fast one owner may
	// create sandboxes (per second; burst default 1); 0 means no limit.
	OwnerCreateRate  rate.Limit
	OwnerCreateBurst int
	IdleTimeout      time.Duration // default 30 min
	// MaxVolumeMB is the largest volume (default DefaultMaxVolumeMB);
	// MaxVolumesPerOwner is how many volumes one API key may have
	// (default DefaultMaxVolumesPerOwner).
	MaxVolumeMB        int
	MaxVolumesPerOwner int
	// MaxSnapshotsPerOwner is how many snapshots one API key may keep
	// (default DefaultMaxSnapshotsPerOwner).
	MaxSnapshotsPerOwner int
	MaxLifetime          time.Duration // default 60 min; < 0 = unlimited
	// PausedLifetime is how long a paused sandbox is kept before it is
	// destroyed (default DefaultPausedLifetime; < 0 = unlimited).
	PausedLifetime time.Duration
	ReadyTimeout   time.Duration // default 90 s: create → desktop ready
	Retention      time.Duration // how long stopped/failed records stay listed; default 10 min
	ReapInterval   time.Duration // default 1 s
	Clock          Clock
	// Pools are the warm pools: desktops booted ahead of the creates
	// that will take them.
	Pools []PoolSpec
	// NoTemplates turns boot templates off (template.go): every create
	// boots cold and waits for its desktop to be usable.
	NoTemplates bool
	// Network gives sandboxes a network; nil means none at all (loopback
	// only), and requests asking for egress are refused.
	Network NetPool
	// UsageInterval is how often each running sandbox's resource
	// figures are sampled (default DefaultUsageInterval), and
	// UsageWindow how much history of them is kept per sandbox
	// (default DefaultUsageWindow); see usage.go.
	UsageInterval time.Duration
	UsageWindow   time.Duration
	// RecordingRetention is how long a stopped recording's file is kept
	// (default DefaultRecordingRetention); MaxRecordingsPerOwner how many
	// recordings one API key may keep (default
	// DefaultMaxRecordingsPerOwner); MaxRecordingDuration when a
	// recording stops by itself (default DefaultMaxRecordingDuration).
	// FFmpeg is the encoder program ("" = ffmpeg on PATH). See
	// recording.go.
	RecordingRetention    time.Duration
	MaxRecordingsPerOwner int
	MaxRecordingDuration  time.Duration
	FFmpeg                string

	Metrics *metrics.Metrics
	Log     *slog.Logger
}

// autoOrder is the preference of "auto": hardware isolation first.
var autoOrder = []string{"firecracker", "qemu", "gvisor", "runc"}

// Manager owns every sandbox of this daemon. It is safe for concurrent use.
type Manager struct {
	cfg   Config
	store *store
	log   *slog.Logger
	m     *metrics.Metrics

	ctx    context.Context // daemon-scoped: boxes and their watchers live under it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	entries map[string]*entry
	// elsewhere counts an owner's live sandboxes on the other nodes of a
	// cluster (SetElsewhere); nil on a single host.
	elsewhere func(owner string) int
	// sharedRate keeps per-owner create rates for a whole cluster
	// (SetSharedRate); nil on a single host.
	sharedRate SharedRate
	limiters   map[string]*rate.Limiter // per owner, with OwnerCreateRate
	volumes    map[string]*volume       // by volumeKey
	snaps      map[string]*snap         // snapshots by ID
	recs       map[string]*recorder     // recordings by ID
	// gaugeKeys are the (state, backend) series of cubicle_sandboxes set
	// last, so that updateGaugesLocked can delete the ones that go away.
	gaugeKeys map[[2]string]int

	availMu sync.Mutex
	avail   map[string]availability

	// freeBytes tells the free space of a directory's filesystem
	// (freeSpace; tests fill the disk with a fake).
	freeBytes func(dir string) (int64, error)

	// usage holds each live sandbox's resource samples (usage.go).
	usage *usageStore

	// pools are the warm pools (Config.Pools), their boxes guarded by
	// mu; claiming and claims (by owner) count the claims in progress,
	// whose boxes are in no pool and not yet in entries.
	pools    []*pool
	poolKick chan struct{}
	tmpls    map[tmplKey]*tmpl // boot templates, guarded by mu
	claiming int
	claims   map[string]int
	closing  bool // Close has begun: the pools boot no more
}

type availability struct {
	err error
	at  time.Time
}

// entry is the in-memory side of one sandbox.
type entry struct {
	rec        *record
	box        driver.Box
	client     *agentclient.Client
	lastActive time.Time
	cancel     context.CancelFunc // cancels the start while starting
	started    chan struct{}      // closed when the start attempt has ended
	stopOnce   sync.Once
	ending     chan struct{} // closed when teardown begins: live viewers leave
	stopped    chan struct{} // closed when teardown has finished
	failErr    error         // why the start failed (set before started closes)
	// op serializes what changes the box under the entry: pause,
	// resume and teardown. paused is the saved box of a paused sandbox
	// (box is nil then).
	op     sync.Mutex
	paused *driver.Paused
	// stopFailed is set when teardown could not free everything; each
	// reaper pass tries again (retrying, while one runs) until it can.
	stopFailed, retrying bool
	// logs is what was read of the box's console (logs.go); nil until
	// first read. Set under Manager.mu.
	logs *consoleTail
}

// New opens the store, re-adopts the sandboxes a previous daemon left
// running, cleans what is dead or unknown, and starts the reaper.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.MaxSandboxes == 0 {
		cfg.MaxSandboxes = 16
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 30 * time.Minute
	}
	if cfg.MaxLifetime == 0 {
		cfg.MaxLifetime = 60 * time.Minute
	}
	if cfg.PausedLifetime == 0 {
		cfg.PausedLifetime = DefaultPausedLifetime
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 90 * time.Second
	}
	if cfg.Retention == 0 {
		cfg.Retention = 10 * time.Minute
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.UsageInterval <= 0 {
		cfg.UsageInterval = DefaultUsageInterval
	}
	if cfg.UsageWindow <= 0 {
		cfg.UsageWindow = DefaultUsageWindow
	}
	if cfg.MaxVolumeMB == 0 {
		cfg.MaxVolumeMB = DefaultMaxVolumeMB
	}
	if cfg.MaxVolumesPerOwner == 0 {
		cfg.MaxVolumesPerOwner = DefaultMaxVolumesPerOwner
	}
	if cfg.MaxSnapshotsPerOwner == 0 {
		cfg.MaxSnapshotsPerOwner = DefaultMaxSnapshotsPerOwner
	}
	if cfg.RecordingRetention <= 0 {
		cfg.RecordingRetention = DefaultRecordingRetention
	}
	if cfg.MaxRecordingsPerOwner <= 0 {
		cfg.MaxRecordingsPerOwner = DefaultMaxRecordingsPerOwner
	}
	if cfg.MaxRecordingDuration <= 0 {
		cfg.MaxRecordingDuration = DefaultMaxRecordingDuration
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.DefaultBackend == "" {
		cfg.DefaultBackend = "auto"
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	st, err := openStore(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m := &Manager{
		cfg: cfg, store: st, log: cfg.Log, m: cfg.Metrics,
		ctx: mctx, cancel: cancel,
		entries:   make(map[string]*entry),
		limiters:  make(map[string]*rate.Limiter),
		volumes:   make(map[string]*volume),
		snaps:     make(map[string]*snap),
		recs:      make(map[string]*recorder),
		avail:     make(map[string]availability),
		freeBytes: freeSpace,
		usage:     newUsageStore(cfg.UsageInterval, cfg.UsageWindow),
		poolKick:  make(chan struct{}, 1),
		claims:    make(map[string]int),
		tmpls:     make(map[tmplKey]*tmpl),
	}
	for _, ps := range cfg.Pools {
		m.pools = append(m.pools, &pool{spec: ps})
	}
	m.m.Capacity.Set(float64(cfg.MaxSandboxes))
	vols, err := st.allVolumes()
	if err != nil {
		cancel()
		st.close()
		return nil, err
	}
	for _, v := range vols {
		m.volumes[volumeKey(v.Owner, v.Name)] = v
	}
	m.sweepVolumeFiles()
	m.sweepTemplates()
	if err := m.loadSnapshots(); err != nil {
		cancel()
		st.close()
		return nil, err
	}
	if err := m.loadRecordings(); err != nil {
		cancel()
		st.close()
		return nil, err
	}
	if err := m.recover(ctx); err != nil {
		cancel()
		st.close()
		return nil, err
	}
	// After recovery: a volume whose sandbox did not survive is free.
	m.reconcileVolumes()
	// Backends that must probe-boot a guest start now, so the first
	// create does not wait for the boot (nor does recovery: orphans are
	// cleaned above whatever the probe says).
	for _, d := range cfg.Drivers {
		if p, ok := d.(driver.Prober); ok && d.Available(mctx) == nil {
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				if err := p.Probe(mctx); err != nil {
					m.log.Warn("probe boot failed; the backend is not used", "backend", d.Name(), "err", err)
				}
			}()
		}
	}
	m.wg.Add(1)
	go m.reapLoop()
	m.wg.Add(1)
	go m.usageLoop()
	m.m.SandboxUsage.SetSource(m.exportUsage)
	if len(m.pools) > 0 {
		m.wg.Add(1)
		go m.poolLoop()
	}
	return m, nil
}

// Close stops the reaper and watchers and closes the store. Running sandboxes
// are left running so that the next daemon re-adopts them.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closing = true
	m.mu.Unlock()
	m.drainPools()
	m.cancel()
	m.wg.Wait()
	m.mu.Lock()
	for _, e := range m.entries {
		if e.client != nil {
			e.client.Close()
		}
	}
	m.mu.Unlock()
	return m.store.close()
}

// recover re-adopts what the store says is alive and removes the rest.
func (m *Manager) recover(ctx context.Context) error {
	recs, err := m.store.all()
	if err != nil {
		return err
	}
	adopted, settled := m.adoptAll(ctx, recs)
	keep := make(map[string]map[string]bool) // backend → ids
	var resume []string                      // paused sandboxes whose resume was cut short
	for _, r := range recs {
		id := r.Sandbox.ID
		log := m.log.With("sandbox", id)
		switch r.Sandbox.State {
		case StateStopped, StateFailed:
			m.entries[id] = &entry{rec: r, started: closedChan(), ending: closedChan(), stopped: closedChan()}
			continue
		}
		if p := settled[id]; p != nil {
			// A pause the daemon's death cut short went far enough.
			if err := r.move(StatePaused); err != nil {
				return err
			}
			m.savedAs(r, *p, m.cfg.Clock.Now())
			if err := m.store.put(r); err != nil {
				return err
			}
			log.Info("a pause cut short by the daemon's stop had saved the sandbox: paused")
		}
		if st := r.Sandbox.State; (st == StatePaused || st == StateResuming) && r.DriverState != nil {
			// Saved on disk: kept as it is. A resume the daemon's end
			// cut short is done again (the driver finds the box it
			// may have started).
			if st == StateResuming {
				if err := r.move(StatePaused); err != nil {
					return err
				}
				if err := m.store.put(r); err != nil {
					return err
				}
				resume = append(resume, id)
			}
			m.entries[id] = &entry{rec: r, paused: &driver.Paused{State: *r.DriverState, Bytes: r.Sandbox.PausedBytes},
				lastActive: r.Sandbox.LastActiveAt, started: closedChan(), ending: make(chan struct{}), stopped: make(chan struct{})}
			if keep[r.Sandbox.Backend] == nil {
				keep[r.Sandbox.Backend] = make(map[string]bool)
			}
			keep[r.Sandbox.Backend][id] = true
			log.Info("kept paused sandbox", "backend", r.Sandbox.Backend)
			continue
		}
		box := adopted[id]
		if box == nil || isClosed(box.Wait()) {
			if box != nil {
				if err := box.Stop(context.WithoutCancel(ctx)); err != nil {
					log.Warn("clean dead sandbox", "err", err)
				}
			}
			r.StoppedAt = m.cfg.Clock.Now()
			if r.Sandbox.State == StateStarting {
				// Its create never finished: to its creator that is
				// a failed create, with the reason to show.
				log.Info("sandbox was starting when the daemon stopped; cleaned")
				if err := r.move(StateFailed); err != nil {
					return err
				}
				r.Sandbox.Error = "cubicled stopped while the sandbox was starting; everything it held was freed"
				r.DriverState = nil
			} else {
				log.Info("sandbox died while the daemon was away; cleaned")
				m.m.Reaped.WithLabelValues("dead").Inc()
				if r.Sandbox.State != StateStopping {
					if err := r.move(StateStopping); err != nil {
						return err
					}
				}
				if err := r.move(StateStopped); err != nil {
					return err
				}
			}
			if err := m.store.put(r); err != nil {
				return err
			}
			m.entries[id] = &entry{rec: r, started: closedChan(), ending: closedChan(), stopped: closedChan()}
			continue
		}
		if r.Sandbox.State == StatePausing {
			// The pause did not finish; the driver's Adopt made the
			// box run on.
			if err := r.move(StateRunning); err != nil {
				return err
			}
			if err := m.store.put(r); err != nil {
				return err
			}
		}
		e := &entry{rec: r, box: box, lastActive: r.Sandbox.LastActiveAt, started: closedChan(), ending: make(chan struct{}), stopped: make(chan struct{})}
		e.client = agentclient.New(box.DialAgent, r.Token)
		m.entries[id] = e
		if keep[r.Sandbox.Backend] == nil {
			keep[r.Sandbox.Backend] = make(map[string]bool)
		}
		keep[r.Sandbox.Backend][id] = true
		m.watch(e)
		log.Info("re-adopted sandbox", "backend", r.Sandbox.Backend)
	}
	for name, d := range m.cfg.Drivers {
		if d.Available(ctx) != nil {
			continue
		}
		if err := d.Cleanup(ctx, keep[name]); err != nil {
			m.log.Warn("orphan cleanup", "backend", name, "err", err)
		}
	}
	if m.cfg.Network != nil {
		// After the boxes: a network is removed only once nothing uses it.
		all := make(map[string]bool)
		for _, ids := range keep {
			for id := range ids {
				all[id] = true
			}
		}
		if err := m.cfg.Network.Cleanup(ctx, all); err != nil {
			m.log.Warn("network orphan cleanup", "err", err)
		}
		m.updateNetGauge()
	}
	m.updateGauges()
	for _, id := range resume {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if _, err := m.Resume(m.ctx, id, 0); err != nil {
				m.log.Warn("resume again a sandbox that was resuming when the daemon stopped", "sandbox", id, "err", err)
			}
		}()
	}
	return nil
}

// adoptAll re-attaches to the boxes of the records that were running, a
// few at a time. Each Adopt asks the runtime about its box (a runsc or
// runc call, which takes a second or more on a loaded host), and the API
// is down until recovery ends: one at a time, a soak saw a restart with
// 13 sandboxes take over 30 s.
func (m *Manager) adoptAll(ctx context.Context, recs []*record) (map[string]driver.Box, map[string]*driver.Paused) {
	const parallel = 8
	var (
		mu     sync.Mutex
		out    = make(map[string]driver.Box)
		paused = make(map[string]*driver.Paused)
		wg     sync.WaitGroup
		sema   = make(chan struct{}, parallel)
	)
	for _, r := range recs {
		d, ok := m.cfg.Drivers[r.Sandbox.Backend]
		if !ok || r.DriverState == nil || (r.Sandbox.State != StateRunning && r.Sandbox.State != StatePausing) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sema <- struct{}{}
			defer func() { <-sema }()
			var (
				box driver.Box
				p   *driver.Paused
				err error
			)
			if pr, ok := d.(driver.Pauser); ok && r.Sandbox.State == StatePausing {
				// What the pause the daemon's death cut short left.
				box, p, err = pr.Settle(ctx, *r.DriverState)
			} else {
				box, err = d.Adopt(ctx, *r.DriverState)
			}
			if err != nil {
				m.log.Warn("cannot re-adopt sandbox", "sandbox", r.Sandbox.ID, "err", err)
				return
			}
			mu.Lock()
			if box != nil {
				out[r.Sandbox.ID] = box
			}
			if p != nil {
				paused[r.Sandbox.ID] = p
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out, paused
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// errFull answers a create that ran out of disk on the host, whichever
// step found it (the store, the sandbox's directory, its network state).
var errFull = errdefs.New(errdefs.ErrUnavailable, "cubicled's data directory is full; no sandbox can be made until space is freed")

// fullBelow is the free space under which a failed create is put down to
// a full data directory: a sandbox's first writes (its disk's ext4
// metadata, runsc's state and logs) need more than this.
const fullBelow = 16 << 20

// diskFull reports whether the filesystem holding dir is all but full.
// Child programs (runsc, mkfs.ext4) report a full disk only as an exit
// status and a line of text, so an ENOSPC in the error chain cannot be
// relied on to say it.
func diskFull(dir string) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false
	}
	return st.Bavail*uint64(st.Bsize) < fullBelow
}

// newID returns 128 bits of randomness as 26 characters of [a-z2-7].
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

func newToken() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// resolveBackend picks the driver for a request.
func (m *Manager) resolveBackend(ctx context.Context, name string) (driver.Driver, error) {
	if name == "" {
		name = m.cfg.DefaultBackend
	}
	if name == "auto" {
		var reasons []string
		for _, n := range autoOrder {
			d, ok := m.cfg.Drivers[n]
			if !ok {
				continue
			}
			if err := m.available(ctx, d); err != nil {
				reasons = append(reasons, n+": "+err.Error())
				continue
			}
			if a, ok := d.(driver.Accelerator); ok && !a.Accelerated(ctx) {
				reasons = append(reasons, n+": no hardware acceleration")
				continue
			}
			if err := probe(ctx, d); err != nil {
				reasons = append(reasons, n+": "+err.Error())
				continue
			}
			return d, nil
		}
		return nil, errdefs.New(errdefs.ErrUnavailable, "no backend is available: %s", strings.Join(reasons, "; "))
	}
	d, ok := m.cfg.Drivers[name]
	if !ok {
		return nil, errdefs.Invalid("unknown backend %q", name)
	}
	if err := m.available(ctx, d); err != nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "backend %s is unavailable: %v", name, err)
	}
	if err := probe(ctx, d); err != nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "backend %s is unavailable: %v", name, err)
	}
	return d, nil
}

// probe is nil unless d is a driver.Prober whose probe boot has failed.
// The driver caches the answer and bounds the boot; it is not asked under
// availMu, so a boot in progress holds up only the callers that need it.
func probe(ctx context.Context, d driver.Driver) error {
	if p, ok := d.(driver.Prober); ok {
		return p.Probe(ctx)
	}
	return nil
}

// available caches Available for a few seconds: it may run a binary.
func (m *Manager) available(ctx context.Context, d driver.Driver) error {
	m.availMu.Lock()
	defer m.availMu.Unlock()
	if a, ok := m.avail[d.Name()]; ok && time.Since(a.at) < 30*time.Second {
		return a.err
	}
	err := d.Available(ctx)
	m.avail[d.Name()] = availability{err: err, at: time.Now()}
	return err
}

// Create starts a sandbox. With wait it returns once the desktop is ready (or
// the start failed, in which case nothing of it is left); without, it returns
// at once in state "starting".
func (m *Manager) Create(ctx context.Context, req CreateRequest, wait bool) (Sandbox, error) {
	if err := m.allowOwnerCreate(ctx, req.Owner); err != nil {
		return Sandbox{}, err
	}
	// from is the snapshot the sandbox starts from, held (release) until
	// its start has ended, so that it is not deleted under the restore.
	var (
		from      *snap
		release   = func() {}
		handedOff bool
		err       error
	)
	if req.FromSnapshot != "" {
		req, from, release, err = m.fromSnapshot(ctx, req)
		if err != nil {
			return Sandbox{}, err
		}
	}
	defer func() {
		if !handedOff {
			release()
		}
	}()
	allow, err := egressAllow(req.Network)
	if err != nil {
		return Sandbox{}, err
	}
	if len(allow) > 0 && m.cfg.Network == nil {
		return Sandbox{}, errdefs.New(errdefs.ErrUnavailable, "network egress was requested but this daemon runs sandboxes without a network (start cubicled with --net)")
	}
	d, err := m.resolveBackend(ctx, req.Backend)
	if err != nil {
		return Sandbox{}, err
	}
	if len(req.Volumes) > 0 {
		if va, ok := d.(driver.VolumeAttacher); !ok || !va.AttachesVolumes() {
			return Sandbox{}, errdefs.New(errdefs.ErrNotSupported, "backend %s cannot attach volumes yet; gvisor, runc and qemu can", d.Name())
		}
	}
	if req.AutoPause {
		if _, err := m.pauser(ctx, d.Name()); err != nil {
			return Sandbox{}, errdefs.New(errdefs.ErrNotSupported, "auto_pause: %s; the sandbox would be destroyed at its timeout instead", errdefs.UserMessage(err))
		}
	}
	if req.Template == "" {
		req.Template = m.cfg.DefaultTemplate
		if req.Template == "" {
			req.Template = "desktop"
		}
	}
	// A box from a snapshot boots nothing: what it runs is the
	// snapshot's, whatever became of its template's image since.
	var rootfs string
	if from == nil {
		if rootfs, err = m.cfg.Images(req.Template); err != nil {
			return Sandbox{}, err
		}
	}
	if req.Resolution.Width == 0 || req.Resolution.Height == 0 {
		req.Resolution = Resolution{Width: 1024, Height: 768}
	}
	now := m.cfg.Clock.Now()
	life := m.cfg.MaxLifetime
	if req.TimeoutSeconds > 0 {
		t := time.Duration(req.TimeoutSeconds) * time.Second
		if life < 0 || t < life {
			life = t
		}
	}
	idle := m.cfg.IdleTimeout
	if req.IdleTimeoutSeconds > 0 {
		idle = time.Duration(req.IdleTimeoutSeconds) * time.Second
	}
	rec := &record{
		Sandbox: Sandbox{
			ID: newID(), State: StateStarting, Template: req.Template,
			Backend: d.Name(), Isolation: d.Isolation(), Resolution: req.Resolution,
			CreatedAt: now, LastActiveAt: now, Metadata: req.Metadata, Volumes: req.Volumes,
			AutoPause: req.AutoPause, FromSnapshot: req.FromSnapshot,
		},
		Request: req, Token: newToken(), IdleTimeout: idle,
	}
	if rec.Sandbox.Metadata == nil {
		rec.Sandbox.Metadata = map[string]string{}
	}
	if life >= 0 {
		rec.Sandbox.ExpiresAt = now.Add(life)
	}
	if p := m.poolFor(req, d); p != nil && from == nil {
		if sb, ok, err := m.claim(ctx, p, rec, allow); ok {
			return sb, err
		}
	}
	m.mu.Lock()
	full := m.activeLocked() >= m.cfg.MaxSandboxes
	m.mu.Unlock()
	if full {
		// A pool box gives its slot to a create no pool serves.
		m.evictPoolBox()
	}
	sctx, cancel := context.WithTimeout(m.ctx, m.cfg.ReadyTimeout)
	e := &entry{rec: rec, lastActive: now, cancel: cancel, started: make(chan struct{}), ending: make(chan struct{}), stopped: make(chan struct{})}

	m.mu.Lock()
	if n := m.activeLocked(); n >= m.cfg.MaxSandboxes {
		m.mu.Unlock()
		cancel()
		return Sandbox{}, errdefs.New(errdefs.ErrCapacity, "all %d sandbox slots are in use", m.cfg.MaxSandboxes)
	}
	if req.Owner != "" && m.cfg.MaxPerOwner > 0 && m.activeOfLocked(req.Owner) >= m.cfg.MaxPerOwner {
		m.mu.Unlock()
		cancel()
		return Sandbox{}, errdefs.New(errdefs.ErrQuota, "this API key already has %d live sandboxes, its limit", m.cfg.MaxPerOwner)
	}
	dvols, took, err := m.attachVolumesLocked(rec.Sandbox.ID, req.Owner, req.Volumes)
	if err != nil {
		m.mu.Unlock()
		cancel()
		return Sandbox{}, err
	}
	m.entries[rec.Sandbox.ID] = e
	m.updateGaugesLocked()
	m.mu.Unlock()
	for _, v := range took {
		if err := m.store.putVolume(v); err != nil {
			m.log.Warn("persist attached volume", "volume", v.Name, "err", err)
		}
	}
	if err := m.store.put(rec); err != nil {
		m.forget(rec.Sandbox.ID)
		m.releaseVolumes(rec.Sandbox.ID)
		cancel()
		if errors.Is(err, syscall.ENOSPC) {
			return Sandbox{}, errFull
		}
		return Sandbox{}, fmt.Errorf("persist new sandbox: %w", err)
	}

	spec := driver.Spec{
		ID:      rec.Sandbox.ID,
		Shape:   driver.Shape{Image: rootfs, VCPUs: req.VCPUs, MemoryMB: req.MemoryMB, Volumes: dvols},
		Session: sessionOf(rec),
	}
	boot := bootCold(d, true)
	if from != nil {
		boot = m.restoreBoot(d.(driver.Snapshotter), from, e) // fromSnapshot checked
	} else if k, sn, ok := m.templateKeyOf(ctx, req, d); ok {
		boot = m.templateBoot(d, sn, k, rootfs, e, true)
	}
	m.wg.Add(1)
	handedOff = true
	go func() {
		defer m.wg.Done()
		defer cancel()
		defer release()
		m.start(sctx, e, d, spec, allow, boot)
	}()
	if !wait {
		return m.snapshot(e), nil
	}
	select {
	case <-e.started:
	case <-ctx.Done():
		// The caller went away before the sandbox was ready: nobody will
		// learn its ID, so nobody could use or destroy it, and it must not
		// hold a slot (and its box) until the ready timeout. It is undone
		// like a failed create, leaving nothing behind.
		m.log.Info("create abandoned by its caller; undoing it", "sandbox", rec.Sandbox.ID, "err", ctx.Err())
		m.teardown(e, "abandoned")
		m.forget(rec.Sandbox.ID)
		if err := m.store.delete(rec.Sandbox.ID); err != nil {
			m.log.Warn("delete abandoned record", "sandbox", rec.Sandbox.ID, "err", err)
		}
		return Sandbox{}, errdefs.New(errdefs.ErrTimeout, "create interrupted before the sandbox was ready (%v); it was undone", ctx.Err())
	}
	sb := m.snapshot(e)
	if sb.State != StateRunning {
		// A failed create leaves nothing behind, not even its record.
		m.forget(sb.ID)
		if err := m.store.delete(sb.ID); err != nil {
			m.log.Warn("delete failed record", "sandbox", sb.ID, "err", err)
		}
		m.mu.Lock()
		ferr := e.failErr
		m.mu.Unlock()
		if errors.Is(ferr, errdefs.ErrCapacity) {
			// Out of a shared resource (addresses): like a full
			// daemon, not a broken one.
			return Sandbox{}, errdefs.New(errdefs.ErrCapacity, "create sandbox: %s", errdefs.UserMessage(ferr))
		}
		if errors.Is(ferr, syscall.ENOSPC) || diskFull(m.cfg.DataDir) {
			return Sandbox{}, errFull
		}
		if errors.Is(ferr, driver.ErrSnapshotStale) {
			return Sandbox{}, errdefs.Conflict("snapshot %s cannot be restored any more: %s; delete it", req.FromSnapshot, sb.Error)
		}
		return Sandbox{}, errdefs.New(errdefs.ErrUnavailable, "create sandbox: %s", sb.Error)
	}
	return sb, nil
}

// sessionOf is the session a record's box is to run: its own token and
// what its create asked for.
func sessionOf(r *record) driver.Session {
	q := r.Request
	return driver.Session{
		Token: r.Token, Env: q.Env,
		Width: q.Resolution.Width, Height: q.Resolution.Height, DPI: q.DPI,
		StartURL: q.StartURL,
	}
}

// bootFunc starts the box of a spec and returns it with a client of its
// agent once the agent (and desktop) are ready, and whether the box has a
// desktop. On error it has stopped what it started.
type bootFunc func(ctx context.Context, spec driver.Spec) (driver.Box, *agentclient.Client, bool, error)

// bootCold is the boot of a create: the driver makes a new box. With
// usable the boot ends once the desktop is usable (every window of the
// image's session is up), else once its screen answers (a warm-pool box,
// whose browser waits for its claim).
func bootCold(d driver.Driver, usable bool) bootFunc {
	return func(ctx context.Context, spec driver.Spec) (driver.Box, *agentclient.Client, bool, error) {
		box, err := d.Create(ctx, spec)
		if err != nil {
			return nil, nil, false, fmt.Errorf("start %s box: %w", d.Name(), err)
		}
		client := agentclient.New(box.DialAgent, spec.Token)
		hasDesktop, err := waitReady(ctx, client, box, usable)
		if err != nil {
			client.Close()
			if serr := box.Stop(context.WithoutCancel(ctx)); serr != nil {
				err = errors.Join(err, fmt.Errorf("stop box: %w", serr))
			}
			return nil, nil, false, err
		}
		return box, client, hasDesktop, nil
	}
}

// start attaches the network, boots the box and waits for the desktop;
// it always closes e.started and leaves the entry running or
// failed-and-cleaned.
func (m *Manager) start(ctx context.Context, e *entry, d driver.Driver, spec driver.Spec, allow []netip.Prefix, boot bootFunc) {
	defer close(e.started)
	t0 := time.Now()
	id := spec.ID
	log := m.log.With("sandbox", id, "backend", d.Name())
	detach := func() error {
		if m.cfg.Network == nil {
			return nil
		}
		defer m.updateNetGauge()
		return m.cfg.Network.Detach(context.WithoutCancel(ctx), id)
	}
	fail := func(err error) {
		if derr := detach(); derr != nil {
			err = errors.Join(err, fmt.Errorf("detach network: %w", derr))
		}
		m.mu.Lock()
		if e.rec.Sandbox.State != StateStarting {
			// Destroyed (or abandoned by its caller) while starting:
			// not a failed create; teardown finishes the record.
			m.mu.Unlock()
			log.Info("start ended by the sandbox's teardown", "err", err)
			return
		}
		log.Error("create failed", "err", err)
		m.m.CreateFailures.WithLabelValues(d.Name()).Inc()
		_ = m.transitionLocked(e, StateFailed) // starting → failed: always legal
		e.rec.Sandbox.Error = err.Error()
		e.failErr = err
		e.rec.StoppedAt = m.cfg.Clock.Now()
		e.rec.DriverState = nil
		m.mu.Unlock()
		close(e.stopped)
		if err := m.persist(e); err != nil {
			log.Warn("persist failed sandbox", "err", err)
		}
		m.releaseVolumes(id) // the driver's failed Create left nothing mounted
	}
	if m.cfg.Network != nil {
		tn := time.Now()
		n, err := m.cfg.Network.Attach(ctx, id, netKind(d), allow)
		m.updateNetGauge()
		if err != nil {
			fail(fmt.Errorf("attach network: %w", err))
			return
		}
		log.Debug("network attached", "ip", n.Addr.Addr().String(), "ms", time.Since(tn).Milliseconds())
		spec.Net = n
		m.mu.Lock()
		e.rec.Sandbox.IP = n.Addr.Addr().String()
		m.mu.Unlock()
		if err := m.persist(e); err != nil {
			log.Warn("persist sandbox address", "err", err)
		}
	}
	box, client, hasDesktop, err := boot(ctx, spec)
	if err != nil {
		fail(err)
		return
	}
	st := box.State()
	m.mu.Lock()
	if e.rec.Sandbox.State != StateStarting { // destroyed meanwhile
		m.mu.Unlock()
		client.Close()
		if err := box.Stop(context.WithoutCancel(ctx)); err != nil {
			log.Warn("stop box destroyed while starting", "err", err)
		}
		if err := detach(); err != nil {
			log.Warn("detach network of box destroyed while starting", "err", err)
		}
		return
	}
	e.box, e.client = box, client
	e.rec.DriverState = &st
	_ = m.transitionLocked(e, StateRunning) // still starting, checked above
	e.rec.Sandbox.Desktop = &hasDesktop
	m.mu.Unlock()
	if err := m.persist(e); err != nil {
		log.Warn("persist running sandbox", "err", err)
	}
	m.m.CreateDuration.WithLabelValues(d.Name()).Observe(time.Since(t0).Seconds())
	log.Info("sandbox ready", "ms", time.Since(t0).Milliseconds())
	m.watch(e)
}

// waitReady polls the agent until its desktop reports ready (and, with
// usable, usable), or until it answers at all for a headless sandbox (no
// X server in its image), and reports which it was.
func waitReady(ctx context.Context, c *agentclient.Client, box driver.Box, usable bool) (desktop bool, err error) {
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := c.Desktop.Info(rctx, connect.NewRequest(&desktoppb.InfoRequest{}))
		cancel()
		switch {
		case err == nil && resp.Msg.Headless:
			return false, nil
		case err == nil && resp.Msg.Ready && (resp.Msg.Usable || !usable):
			return true, nil
		case err == nil && resp.Msg.Ready:
			last = errors.New("desktop answers, but its session is not complete yet (the windows session.json lists under \"usable\")")
		case err != nil:
			last = err
		default:
			last = errors.New("desktop not ready yet")
		}
		select {
		case <-box.Wait():
			return false, fmt.Errorf("sandbox exited while starting (last: %v)", last)
		case <-ctx.Done():
			return false, fmt.Errorf("desktop not ready in time: %v", last)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// watch reaps the sandbox as soon as its box dies.
func (m *Manager) watch(e *entry) {
	box := e.box
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-box.Wait():
			if isClosed(e.ending) {
				return // stopped on purpose: teardown closed ending first
			}
			m.mu.Lock()
			s, current := e.rec.Sandbox.State, e.box == box
			m.mu.Unlock()
			if !current || s == StatePausing || s == StatePaused || s == StateResuming {
				// Paused on purpose (a failed pause that killed the
				// box is torn down by Pause), or a box of before.
				return
			}
			m.mu.Lock()
			id := e.rec.Sandbox.ID // e.rec is replaced when a pool box is claimed
			m.mu.Unlock()
			m.log.Warn("sandbox died", "sandbox", id)
			m.teardown(e, "dead")
		case <-e.stopped:
		case <-m.ctx.Done():
		}
	}()
}

// teardown stops an entry once and records why; reason is "" for a DELETE.
func (m *Manager) teardown(e *entry, reason string) {
	e.stopOnce.Do(func() {
		m.mu.Lock()
		if s := e.rec.Sandbox.State; s == StateStopped || s == StateFailed {
			// Nothing is left to stop (a failed stop is the
			// reaper's to try again).
			m.mu.Unlock()
			return
		}
		_ = m.transitionLocked(e, StateStopping) // from every live state (TestTransitions)
		close(e.ending)
		if e.cancel != nil {
			e.cancel()
		}
		m.mu.Unlock()
		log := m.log.With("sandbox", e.rec.Sandbox.ID)
		if err := m.persist(e); err != nil {
			log.Warn("persist stopping", "err", err)
		}
		// The recording ends first, while the screen is still there,
		// and its file is complete before DELETE answers.
		m.stopRecordingsOf(e.rec.Sandbox.ID)
		<-e.started // a start in progress sees the state change and cleans up itself
		e.op.Lock() // a pause or resume in progress ends first, and says what is left
		defer e.op.Unlock()
		var err error
		if e.client != nil && e.box != nil && len(e.rec.Request.Volumes) > 0 && !isClosed(e.box.Wait()) {
			m.shutdownGracefully(e)
		}
		if e.client != nil {
			e.client.Close()
		}
		if e.box != nil {
			// Its log outlives the box for as long as its record is
			// kept: the last lines before the files go with it.
			m.readConsole(e, true)
		}
		if e.box != nil || e.paused != nil {
			err = m.freeBox(e)
			// The network goes after the box, on every path; a start
			// that failed or was cancelled has detached its own.
			if m.cfg.Network != nil {
				if derr := m.cfg.Network.Detach(context.WithoutCancel(m.ctx), e.rec.Sandbox.ID); derr != nil {
					err = errors.Join(err, fmt.Errorf("detach network: %w", derr))
				}
				m.updateNetGauge()
			}
		}
		m.mu.Lock()
		e.rec.StoppedAt = m.cfg.Clock.Now()
		if err != nil {
			_ = m.transitionLocked(e, StateFailed) // stopping → failed
			e.rec.Sandbox.Error = "stop: " + err.Error()
			e.stopFailed = e.box != nil || e.paused != nil
			log.Error("stop sandbox; the reaper will try again", "err", err)
		} else {
			_ = m.transitionLocked(e, StateStopped) // stopping → stopped
		}
		stopFailed := e.stopFailed
		m.mu.Unlock()
		close(e.stopped)
		if err := m.persist(e); err != nil {
			log.Warn("persist stopped", "err", err)
		}
		if !stopFailed {
			m.releaseVolumes(e.rec.Sandbox.ID)
		}
		if reason != "" {
			m.m.Reaped.WithLabelValues(reason).Inc()
			log.Info("sandbox reaped", "reason", reason)
		} else {
			log.Info("sandbox destroyed")
		}
	})
	<-e.stopped
}

// freeBox stops e's box, or discards its saved one when it is paused.
func (m *Manager) freeBox(e *entry) error {
	ctx := context.WithoutCancel(m.ctx)
	if e.box != nil {
		return e.box.Stop(ctx)
	}
	p, ok := m.cfg.Drivers[e.rec.Sandbox.Backend].(driver.Pauser)
	if !ok {
		return fmt.Errorf("backend %s cannot discard a paused box", e.rec.Sandbox.Backend)
	}
	return p.Discard(ctx, *e.paused)
}

// shutdownGrace bounds the agent's Shutdown: the session's programs get
// 5 s after SIGTERM, then the filesystems are synced.
const shutdownGrace = 15 * time.Second

// shutdownGracefully asks the agent of a sandbox that holds volumes to
// end its programs as a shutdown does and sync, before the box is
// stopped: killed at once, a browser would lose the cookies it had not
// written yet, and the volume the login it was meant to keep. A failure
// is logged; the stop goes on.
func (m *Manager) shutdownGracefully(e *entry) {
	ctx, cancel := context.WithTimeout(m.ctx, shutdownGrace)
	defer cancel()
	t0 := time.Now()
	resp, err := e.client.Desktop.Shutdown(ctx, connect.NewRequest(&desktoppb.ShutdownRequest{}))
	log := m.log.With("sandbox", e.rec.Sandbox.ID)
	switch {
	case err != nil:
		log.Warn("graceful shutdown before stop", "err", err)
	case resp.Msg.Error != "":
		log.Warn("graceful shutdown before stop", "err", resp.Msg.Error)
	default:
		log.Debug("programs ended and synced before stop", "ms", time.Since(t0).Milliseconds())
	}
}

// persist writes a copy of e's record taken under the lock; the record of
// a pool box is never written.
func (m *Manager) persist(e *entry) error {
	m.mu.Lock()
	r := *e.rec
	m.mu.Unlock()
	if r.Pool != "" {
		return nil
	}
	return m.store.put(&r)
}

// Destroy stops a sandbox and frees everything it holds before returning.
// Destroying a stopped sandbox again is a no-op.
func (m *Manager) Destroy(ctx context.Context, id string) error {
	e, err := m.entry(id)
	if err != nil {
		return err
	}
	m.teardown(e, "")
	return nil
}

// Get returns one sandbox.
func (m *Manager) Get(ctx context.Context, id string) (Sandbox, error) {
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	return m.snapshot(e), nil
}

// List returns the sandboxes matching f, oldest first.
func (m *Manager) List(ctx context.Context, f Filter) []Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Sandbox, 0, len(m.entries))
	for _, e := range m.entries {
		sb := m.snapshotLocked(e)
		if f.State != "" && sb.State != f.State {
			continue
		}
		match := true
		for k, v := range f.Metadata {
			if sb.Metadata[k] != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// SetElsewhere makes the per-owner quota (Config.MaxPerOwner) count the
// owner's live sandboxes on the other nodes of a cluster too, as f says.
// f is called with the manager's lock held and must not call back.
func (m *Manager) SetElsewhere(f func(owner string) int) {
	m.mu.Lock()
	m.elsewhere = f
	m.mu.Unlock()
}

// Owners returns the owner (CreateRequest.Owner) of every sandbox the
// manager holds, by ID: the cluster catalog records it, so that per-key
// quotas count a key's sandboxes on every node.
func (m *Manager) Owners() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]string, len(m.entries))
	for id, e := range m.entries {
		out[id] = e.rec.Request.Owner
	}
	return out
}

// SetTimeout sets a running sandbox's expiry to seconds from now (0 = the
// daemon's maximum lifetime), never beyond the maximum lifetime from now.
func (m *Manager) SetTimeout(ctx context.Context, id string, seconds int) (Sandbox, error) {
	if seconds < 0 {
		return Sandbox{}, errdefs.Invalid("timeout_seconds must be >= 0")
	}
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	m.mu.Lock()
	if s := e.rec.Sandbox.State; s != StateRunning && s != StateStarting {
		m.mu.Unlock()
		return Sandbox{}, errdefs.Conflict("sandbox %s is %s", id, s)
	}
	now := m.cfg.Clock.Now()
	life := m.cfg.MaxLifetime
	if seconds > 0 {
		t := time.Duration(seconds) * time.Second
		if life < 0 || t < life {
			life = t
		}
	}
	if life < 0 {
		e.rec.Sandbox.ExpiresAt = time.Time{}
	} else {
		e.rec.Sandbox.ExpiresAt = now.Add(life)
	}
	e.lastActive = now
	m.mu.Unlock()
	if err := m.persist(e); err != nil {
		return Sandbox{}, fmt.Errorf("persist timeout: %w", err)
	}
	return m.snapshot(e), nil
}

// Agent returns the agent client of a running sandbox and marks it active.
func (m *Manager) Agent(ctx context.Context, id string) (*agentclient.Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	if e.rec.Sandbox.State != StateRunning || e.client == nil {
		return nil, errdefs.Conflict("sandbox %s is %s, not running", id, e.rec.Sandbox.State)
	}
	e.lastActive = m.cfg.Clock.Now()
	return e.client, nil
}

// Watch returns the agent client of a running sandbox without marking it
// active, and a channel that is closed as soon as the sandbox begins to stop.
// Long-lived streams (the live view) use it: watching a desktop is not, by
// default, activity that keeps a sandbox from its idle timeout.
func (m *Manager) Watch(ctx context.Context, id string) (*agentclient.Client, <-chan struct{}, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	if !ok {
		return nil, nil, errdefs.NotFound("sandbox %s not found", id)
	}
	if e.rec.Sandbox.State != StateRunning || e.client == nil {
		return nil, nil, errdefs.Conflict("sandbox %s is %s, not running", id, e.rec.Sandbox.State)
	}
	return e.client, e.ending, nil
}

// Touch marks a sandbox active (its idle timer restarts). Unknown or
// stopped sandboxes are ignored.
func (m *Manager) Touch(ctx context.Context, id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[id]; ok && e.rec.Sandbox.State == StateRunning {
		e.lastActive = m.cfg.Clock.Now()
	}
}

// Backends reports every configured backend and whether it can run here.
func (m *Manager) Backends(ctx context.Context) []BackendInfo {
	names := slices.Sorted(maps.Keys(m.cfg.Drivers))
	out := make([]BackendInfo, 0, len(names))
	for _, n := range names {
		d := m.cfg.Drivers[n]
		bi := BackendInfo{Name: n, Isolation: d.Isolation(), Available: true}
		if va, ok := d.(driver.VolumeAttacher); ok {
			bi.Capabilities.Volumes = va.AttachesVolumes()
		}
		bi.Capabilities.Pause, bi.Capabilities.PauseReason = m.PauseInfo(ctx, n)
		bi.Capabilities.Snapshot, bi.Capabilities.SnapshotReason = m.SnapshotInfo(ctx, n)
		if err := m.available(ctx, d); err != nil {
			bi.Available, bi.Reason = false, err.Error()
		} else if err := probe(ctx, d); err != nil {
			bi.Available, bi.Reason = false, err.Error()
		} else if a, ok := d.(driver.Accelerator); ok && !a.Accelerated(ctx) {
			bi.Reason = "no hardware acceleration: runs emulated (slow); \"auto\" does not pick it"
		}
		if rr, ok := d.(driver.RuntimeReporter); ok {
			r := rr.Runtime()
			bi.Runtime = &RuntimeInfo{Name: r.Name, Path: r.Path, Version: r.Version}
		}
		out = append(out, bi)
	}
	return out
}

// DefaultBackend is the configured default ("auto" or a name).
func (m *Manager) DefaultBackend() string { return m.cfg.DefaultBackend }

// Capacity reports the maximum and the number of live sandboxes.
func (m *Manager) Capacity() Capacity {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Capacity{MaxSandboxes: m.cfg.MaxSandboxes, Running: m.activeLocked()}
}

func (m *Manager) entry(id string) (*entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	return e, nil
}

func (m *Manager) forget(id string) {
	m.mu.Lock()
	delete(m.entries, id)
	m.updateGaugesLocked()
	m.mu.Unlock()
}

func (m *Manager) snapshot(e *entry) Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snapshotLocked(e)
}

func (m *Manager) snapshotLocked(e *entry) Sandbox {
	sb := e.rec.Sandbox
	sb.LastActiveAt = e.lastActive
	sb.Metadata = maps.Clone(sb.Metadata)
	sb.Volumes = slices.Clone(sb.Volumes)
	if sb.Desktop != nil {
		d := *sb.Desktop
		sb.Desktop = &d
	}
	return sb
}

// activeLocked counts the sandboxes that hold a slot, the warm pools'
// boxes among them.
func (m *Manager) activeLocked() int {
	n := m.poolBoxesLocked()
	for _, e := range m.entries {
		if e.rec.Sandbox.State.holdsSlot() {
			n++
		}
	}
	return n
}

// activeOfLocked counts the live sandboxes of owner, the ones being
// claimed from a pool among them.
func (m *Manager) activeOfLocked(owner string) int {
	n := m.claims[owner]
	if m.elsewhere != nil {
		n += m.elsewhere(owner)
	}
	for _, e := range m.entries {
		if e.rec.Sandbox.State.holdsSlot() && e.rec.Request.Owner == owner {
			n++
		}
	}
	return n
}

// allowOwnerCreate takes one create from owner's rate budget: the
// cluster's, shared by every node, when SetSharedRate gave one and it
// answers, else this daemon's own.
func (m *Manager) allowOwnerCreate(ctx context.Context, owner string) error {
	if owner == "" || m.cfg.OwnerCreateRate <= 0 {
		return nil
	}
	burst := max(m.cfg.OwnerCreateBurst, 1)
	m.mu.Lock()
	shared := m.sharedRate
	m.mu.Unlock()
	if shared != nil {
		ok, err := shared(ctx, owner, float64(m.cfg.OwnerCreateRate), burst)
		if err == nil {
			if !ok {
				return m.rateLimited()
			}
			return nil
		}
		// The cluster's store unreachable: each node keeps the limit
		// for itself until it answers again.
		m.log.Debug("shared create rate unavailable; this node's own limit applies", "err", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	lim := m.limiters[owner]
	if lim == nil {
		// One limiter per API key: as many as keys are configured.
		lim = rate.NewLimiter(m.cfg.OwnerCreateRate, burst)
		m.limiters[owner] = lim
	}
	if !lim.AllowN(m.cfg.Clock.Now(), 1) {
		return m.rateLimited()
	}
	return nil
}

func (m *Manager) rateLimited() error {
	return errdefs.New(errdefs.ErrRateLimited, "this API key creates sandboxes faster than its limit of %g a second; retry later", float64(m.cfg.OwnerCreateRate))
}

// SharedRate takes one create from owner's budget of r a second (bursts
// of burst) kept for the whole cluster, and says whether there was one;
// an error means the budget could not be reached.
type SharedRate func(ctx context.Context, owner string, r float64, burst int) (bool, error)

// SetSharedRate makes the per-owner create rate (Config.OwnerCreateRate)
// one budget across a cluster's nodes, as f keeps it.
func (m *Manager) SetSharedRate(f SharedRate) {
	m.mu.Lock()
	m.sharedRate = f
	m.mu.Unlock()
}

func (m *Manager) updateGauges() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.updateGaugesLocked()
}

// allStates are the states the sandbox gauge reports for every backend.
var allStates = []State{StateStarting, StateRunning, StatePausing, StatePaused, StateResuming, StateStopping, StateStopped, StateFailed}

// updateGaugesLocked sets cubicle_sandboxes to the current counts. Each
// series is set in place, never cleared first, so a scrape that runs
// meanwhile sees the old count or the new one, not an empty gauge; series of
// a backend that only old records name are deleted once none is left.
func (m *Manager) updateGaugesLocked() {
	counts := make(map[[2]string]int)
	for name := range m.cfg.Drivers {
		for _, s := range allStates {
			counts[[2]string{string(s), name}] = 0
		}
	}
	for _, e := range m.entries {
		counts[[2]string{string(e.rec.Sandbox.State), e.rec.Sandbox.Backend}]++
	}
	for k, n := range counts {
		m.m.Sandboxes.WithLabelValues(k[0], k[1]).Set(float64(n))
	}
	for k := range m.gaugeKeys {
		if _, ok := counts[k]; !ok {
			m.m.Sandboxes.DeleteLabelValues(k[0], k[1])
		}
	}
	m.gaugeKeys = counts
}
