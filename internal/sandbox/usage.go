package sandbox

import (
	"context"
	"math"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
)

// Defaults of Config.UsageInterval and Config.UsageWindow.
const (
	DefaultUsageInterval = 5 * time.Second
	DefaultUsageWindow   = 10 * time.Minute
	// maxUsageSamples bounds one sandbox's history whatever the
	// configuration: 120 samples is the default, about 14 KiB.
	maxUsageSamples = 10_000
)

// NetMeter is implemented by a NetPool that can tell the counters of a
// sandbox's network device (internal/netpool does).
type NetMeter interface {
	Usage(ctx context.Context, id string) (driver.NetUsage, error)
}

// Usage is a sandbox's resource figures: the latest sample and the
// history the manager keeps (GET /v1/sandboxes/{id}/metrics).
type Usage struct {
	SandboxID       string  `json:"sandbox_id"`
	Backend         string  `json:"backend"`
	State           State   `json:"state"`
	IntervalSeconds float64 `json:"interval_seconds"`
	WindowSeconds   float64 `json:"window_seconds"`
	// Latest is the newest sample, whatever Since said; nil until the
	// first one (a sample needs two readings of the CPU counter, one
	// interval apart) and for a backend that cannot measure.
	Latest *UsageSample `json:"latest"`
	// Samples are the kept samples after Since, oldest first.
	Samples []UsageSample `json:"samples"`
}

// UsageSample is one sample of a sandbox's figures.
type UsageSample struct {
	Timestamp time.Time     `json:"timestamp"`
	CPU       CPUUsage      `json:"cpu"`
	Memory    MemoryUsage   `json:"memory"`
	Disk      DiskUsage     `json:"disk"`
	Network   *NetworkUsage `json:"network,omitempty"` // nil: no network
}

// CPUUsage is a sample's CPU figures.
type CPUUsage struct {
	// UsedSeconds is the CPU time the box has used since it started (a
	// resumed box starts again from zero).
	UsedSeconds float64 `json:"used_seconds"`
	// Percent is the share of the sandbox's CPUs (Count) it used since
	// the previous sample, 0 to 100: one busy core of two is 50.
	Percent float64 `json:"percent"`
	// Count is how many CPUs' worth the sandbox may use.
	Count float64 `json:"count"`
}

// MemoryUsage is a sample's memory figures, in bytes.
type MemoryUsage struct {
	UsedBytes  int64 `json:"used_bytes"`
	CacheBytes int64 `json:"cache_bytes"`
	LimitBytes int64 `json:"limit_bytes"` // 0: no limit known
}

// DiskUsage is a sample's disk figures, in bytes: the sandbox's own
// writable disk, not the shared image.
type DiskUsage struct {
	UsedBytes  int64 `json:"used_bytes"`
	LimitBytes int64 `json:"limit_bytes"` // 0: unbounded
}

// NetworkUsage are the counters of the sandbox's network device, seen
// from the sandbox (rx: received by it).
type NetworkUsage struct {
	RxBytes   uint64 `json:"rx_bytes"`
	TxBytes   uint64 `json:"tx_bytes"`
	RxPackets uint64 `json:"rx_packets"`
	TxPackets uint64 `json:"tx_packets"`
}

// hostCPUs is the CPUs of a box whose backend cannot tell its share.
var hostCPUs = runtime.NumCPU

// usageStore keeps each live sandbox's ring of samples. Its lock comes
// after Manager.mu when both are held.
type usageStore struct {
	size int // samples a ring holds

	mu    sync.Mutex
	rings map[string]*usageRing // by sandbox ID
}

// usageRing is one sandbox's samples, a fixed-size ring.
type usageRing struct {
	backend string
	buf     []UsageSample // len = store size; the oldest at next when full
	next, n int
	// active: the box ran at the last sampling (not paused); only active
	// rings are exported to Prometheus.
	active bool
	// The previous reading of the box's CPU counter, for Percent; box
	// tells when it belongs to another box (a resume starts anew).
	box        driver.Box
	prevCPU    float64
	prevAt     time.Time
	hasReading bool
}

func newUsageStore(interval, window time.Duration) *usageStore {
	n := int(math.Ceil(float64(window) / float64(interval)))
	return &usageStore{size: min(max(n, 1), maxUsageSamples), rings: make(map[string]*usageRing)}
}

// forget frees sandbox id's samples; from then on nothing of it is kept
// or exported.
func (s *usageStore) forget(id string) {
	s.mu.Lock()
	delete(s.rings, id)
	s.mu.Unlock()
}

// add records a reading of box (sandbox id) taken at now. The first
// reading of a box is its CPU baseline and makes no sample. Readings of
// a sandbox forgotten meanwhile are dropped.
func (s *usageStore) add(id string, box driver.Box, now time.Time, u driver.Usage, net *driver.NetUsage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rings[id]
	if !ok {
		return
	}
	if !r.hasReading || r.box != box || u.CPUSeconds < r.prevCPU || !now.After(r.prevAt) {
		r.box, r.prevCPU, r.prevAt, r.hasReading = box, u.CPUSeconds, now, true
		return
	}
	cpus := u.CPUs
	pct := 0.0
	if cpus > 0 {
		pct = (u.CPUSeconds - r.prevCPU) / now.Sub(r.prevAt).Seconds() / cpus * 100
		// Read one after the other, the counter and the clock can
		// make a fully busy box look a hair over its share.
		pct = math.Round(min(max(pct, 0), 100)*10) / 10
	}
	r.prevCPU, r.prevAt = u.CPUSeconds, now
	sm := UsageSample{
		Timestamp: now,
		CPU:       CPUUsage{UsedSeconds: math.Round(u.CPUSeconds*1000) / 1000, Percent: pct, Count: cpus},
		Memory:    MemoryUsage{UsedBytes: u.MemoryBytes, CacheBytes: u.MemoryCacheBytes, LimitBytes: u.MemoryLimitBytes},
		Disk:      DiskUsage{UsedBytes: u.DiskBytes, LimitBytes: u.DiskLimitBytes},
	}
	if net != nil {
		sm.Network = &NetworkUsage{RxBytes: net.RxBytes, TxBytes: net.TxBytes, RxPackets: net.RxPackets, TxPackets: net.TxPackets}
	}
	r.buf[r.next] = sm
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// samples returns the kept samples of r after since, oldest first.
func (r *usageRing) samples(since time.Time) []UsageSample {
	out := make([]UsageSample, 0, r.n)
	for i := range r.n {
		sm := r.buf[(r.next-r.n+i+len(r.buf))%len(r.buf)]
		if sm.Timestamp.After(since) {
			out = append(out, sm)
		}
	}
	return out
}

// latest is r's newest sample, or nil.
func (r *usageRing) latest() *UsageSample {
	if r.n == 0 {
		return nil
	}
	sm := r.buf[(r.next-1+len(r.buf))%len(r.buf)]
	return &sm
}

// usageLoop samples every running sandbox each UsageInterval until the
// manager closes.
func (m *Manager) usageLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.UsageInterval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			m.sampleUsage(m.ctx)
			m.readConsoles()
		}
	}
}

// usageTimeout bounds one box's reading: a few file reads, unless the
// host is in trouble.
const usageTimeout = 2 * time.Second

// sampleUsage takes one reading of every running sandbox whose box can
// be measured, one after the other (a reading is a few small file
// reads), and marks the rings of sandboxes that are live but not
// running (paused) inactive.
func (m *Manager) sampleUsage(ctx context.Context) {
	type target struct {
		id    string
		box   driver.Box
		meter driver.Meter
	}
	var targets []target
	m.mu.Lock()
	m.usage.mu.Lock()
	for id, e := range m.entries {
		st := e.rec.Sandbox.State
		r := m.usage.rings[id]
		if r == nil && st.live() {
			r = &usageRing{backend: e.rec.Sandbox.Backend, buf: make([]UsageSample, m.usage.size)}
			m.usage.rings[id] = r
		}
		if r == nil {
			continue
		}
		r.active = false
		if st != StateRunning || e.box == nil {
			continue
		}
		if meter, ok := e.box.(driver.Meter); ok {
			r.active = true
			targets = append(targets, target{id: id, box: e.box, meter: meter})
		}
	}
	m.usage.mu.Unlock()
	m.mu.Unlock()
	netMeter, _ := m.cfg.Network.(NetMeter)
	for _, tg := range targets {
		rctx, cancel := context.WithTimeout(ctx, usageTimeout)
		u, err := tg.meter.Usage(rctx)
		var net *driver.NetUsage
		if err == nil && netMeter != nil {
			if n, nerr := netMeter.Usage(rctx, tg.id); nerr == nil {
				net = &n
			}
		}
		cancel()
		if err != nil {
			// A box going away as it is read: its teardown forgets it.
			m.log.Debug("sample sandbox usage", "sandbox", tg.id, "err", err)
			continue
		}
		if u.CPUs <= 0 {
			u.CPUs = float64(hostCPUs())
		}
		m.usage.add(tg.id, tg.box, m.cfg.Clock.Now(), u, net)
	}
}

// live reports whether a sandbox in state s still exists for its user:
// its figures are kept until it begins to stop.
func (s State) live() bool {
	switch s {
	case StateStarting, StateRunning, StatePausing, StatePaused, StateResuming:
		return true
	}
	return false
}

// Usage returns sandbox id's latest figures and those of its history
// after since (zero: all of it). A sandbox that is stopping or gone has
// none: ErrConflict; an unknown one ErrNotFound.
func (m *Manager) Usage(ctx context.Context, id string, since time.Time) (Usage, error) {
	m.mu.Lock()
	e, ok := m.entries[id]
	if !ok {
		m.mu.Unlock()
		return Usage{}, errdefs.NotFound("sandbox %s not found", id)
	}
	st, backend := e.rec.Sandbox.State, e.rec.Sandbox.Backend
	m.mu.Unlock()
	if !st.live() {
		return Usage{}, errdefs.Conflict("sandbox %s is %s; its figures went with it", id, st)
	}
	out := Usage{SandboxID: id, Backend: backend, State: st,
		IntervalSeconds: m.cfg.UsageInterval.Seconds(),
		WindowSeconds:   (time.Duration(m.usage.size) * m.cfg.UsageInterval).Seconds(),
		Samples:         []UsageSample{}}
	m.usage.mu.Lock()
	defer m.usage.mu.Unlock()
	if r := m.usage.rings[id]; r != nil {
		out.Latest = r.latest()
		out.Samples = r.samples(since)
	}
	return out, nil
}

// exportUsage is the source of the per-sandbox Prometheus series: the
// latest sample of each sandbox running now. Rings are freed when their
// sandbox begins to stop, so there are never more series than live
// sandboxes (Config.MaxSandboxes).
func (m *Manager) exportUsage() []metrics.SandboxUsage {
	m.usage.mu.Lock()
	defer m.usage.mu.Unlock()
	out := make([]metrics.SandboxUsage, 0, len(m.usage.rings))
	for id, r := range m.usage.rings {
		sm := r.latest()
		if !r.active || sm == nil {
			continue
		}
		su := metrics.SandboxUsage{
			ID: id, Backend: r.backend,
			CPUSeconds: sm.CPU.UsedSeconds, CPUs: sm.CPU.Count,
			MemoryBytes: sm.Memory.UsedBytes, MemoryLimitBytes: sm.Memory.LimitBytes,
			DiskBytes: sm.Disk.UsedBytes, DiskLimitBytes: sm.Disk.LimitBytes,
		}
		if n := sm.Network; n != nil {
			su.Net = &metrics.NetCounters{RxBytes: n.RxBytes, TxBytes: n.TxBytes, RxPackets: n.RxPackets, TxPackets: n.TxPackets}
		}
		out = append(out, su)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
