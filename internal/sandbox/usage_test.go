package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
)

// meteredDriver's boxes report the usage the test sets for them.
type meteredDriver struct {
	*fakeDriver
	mu    sync.Mutex
	usage map[string]driver.Usage // by box ID; missing: the reading fails
}

type meteredBox struct {
	driver.Box
	d  *meteredDriver
	id string
}

func (d *meteredDriver) Create(ctx context.Context, spec driver.Spec) (driver.Box, error) {
	b, err := d.fakeDriver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &meteredBox{Box: b, d: d, id: spec.ID}, nil
}

func (d *meteredDriver) set(id string, u driver.Usage) {
	d.mu.Lock()
	d.usage[id] = u
	d.mu.Unlock()
}

func (b *meteredBox) Usage(context.Context) (driver.Usage, error) {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	u, ok := b.d.usage[b.id]
	if !ok {
		return driver.Usage{}, errors.New("cgroup gone")
	}
	return u, nil
}

// meteredNet is a fake NetPool that is also a NetMeter.
type meteredNet struct{ *fakeNet }

func (n meteredNet) Usage(_ context.Context, id string) (driver.NetUsage, error) {
	if !n.has(id) {
		return driver.NetUsage{}, errors.New("not attached")
	}
	return driver.NetUsage{RxBytes: 1000, TxBytes: 2000, RxPackets: 10, TxPackets: 20}, nil
}

// sandboxSeries returns the value of the cubicle_sandbox_NAME series of
// each sandbox.
func sandboxSeries(t *testing.T, mt *metrics.Metrics, name string) map[string]float64 {
	t.Helper()
	mfs, err := mt.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "cubicle_sandbox_"+name {
			continue
		}
		for _, m := range mf.GetMetric() {
			id := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "sandbox" {
					id = l.GetValue()
				}
			}
			out[id] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestUsage(t *testing.T) {
	d := &meteredDriver{fakeDriver: newFakeDriver(t), usage: map[string]driver.Usage{}}
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	mt := metrics.New()
	net := meteredNet{newFakeNet()}
	m, err := New(context.Background(), Config{
		DataDir: t.TempDir(), Drivers: map[string]driver.Driver{"gvisor": d},
		Images:       func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes: 4, ReapInterval: time.Hour, Clock: clock, Metrics: mt, Network: net,
		// The loop never ticks in the test; the window holds 3 samples.
		UsageInterval: time.Hour, UsageWindow: 3 * time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	busy, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}

	// The first reading is the CPU baseline: no sample yet.
	d.set(busy.ID, driver.Usage{CPUSeconds: 1, CPUs: 2, MemoryBytes: 100 << 20, MemoryLimitBytes: 2 << 30, DiskBytes: 5 << 20, DiskLimitBytes: 4 << 30})
	d.set(quiet.ID, driver.Usage{CPUSeconds: 1, CPUs: 2, MemoryBytes: 80 << 20})
	m.sampleUsage(ctx)
	u, err := m.Usage(ctx, busy.ID, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if u.Latest != nil || len(u.Samples) != 0 || u.IntervalSeconds != 3600 || u.WindowSeconds != 3*3600 || u.Backend != "gvisor" {
		t.Fatalf("after the baseline: %+v", u)
	}
	if got := sandboxSeries(t, mt, "cpu_seconds_total"); len(got) != 0 {
		t.Errorf("series before any sample: %v", got)
	}

	// 10 s later the busy box has used 10 CPU-seconds of its 2 CPUs'
	// 20 (50 %), the quiet one 0.2 (1 %).
	clock.Advance(10 * time.Second)
	d.set(busy.ID, driver.Usage{CPUSeconds: 11, CPUs: 2, MemoryBytes: 300 << 20, MemoryCacheBytes: 7, MemoryLimitBytes: 2 << 30, DiskBytes: 6 << 20, DiskLimitBytes: 4 << 30})
	d.set(quiet.ID, driver.Usage{CPUSeconds: 1.2, CPUs: 2, MemoryBytes: 80 << 20})
	m.sampleUsage(ctx)
	u, _ = m.Usage(ctx, busy.ID, time.Time{})
	want := UsageSample{Timestamp: clock.Now(), CPU: CPUUsage{UsedSeconds: 11, Percent: 50, Count: 2},
		Memory:  MemoryUsage{UsedBytes: 300 << 20, CacheBytes: 7, LimitBytes: 2 << 30},
		Disk:    DiskUsage{UsedBytes: 6 << 20, LimitBytes: 4 << 30},
		Network: &NetworkUsage{RxBytes: 1000, TxBytes: 2000, RxPackets: 10, TxPackets: 20}}
	if u.Latest == nil || len(u.Samples) != 1 || *u.Latest.Network != *want.Network {
		t.Fatalf("after one interval: %+v", u)
	}
	got := *u.Latest
	got.Network, want.Network = nil, nil
	if got != want {
		t.Errorf("busy sample:\n got %+v\nwant %+v", got, want)
	}
	if q, _ := m.Usage(ctx, quiet.ID, time.Time{}); q.Latest == nil || q.Latest.CPU.Percent != 1 {
		t.Errorf("quiet sample: %+v", q.Latest)
	}
	cpu := sandboxSeries(t, mt, "cpu_seconds_total")
	if len(cpu) != 2 || cpu[busy.ID] != 11 || cpu[quiet.ID] != 1.2 {
		t.Errorf("cubicle_sandbox_cpu_seconds_total = %v", cpu)
	}
	if mem := sandboxSeries(t, mt, "memory_bytes"); mem[busy.ID] != 300<<20 {
		t.Errorf("cubicle_sandbox_memory_bytes = %v", mem)
	}
	if lim := sandboxSeries(t, mt, "memory_limit_bytes"); len(lim) != 1 || lim[busy.ID] != 2<<30 {
		t.Errorf("cubicle_sandbox_memory_limit_bytes = %v (none for a box without a limit)", lim)
	}
	if tx := sandboxSeries(t, mt, "network_transmit_bytes_total"); tx[busy.ID] != 2000 {
		t.Errorf("cubicle_sandbox_network_transmit_bytes_total = %v", tx)
	}

	// The ring keeps the last 3 samples, oldest first; since filters.
	for i := range 4 {
		clock.Advance(10 * time.Second)
		d.set(busy.ID, driver.Usage{CPUSeconds: 12 + float64(i), CPUs: 2})
		m.sampleUsage(ctx)
	}
	u, _ = m.Usage(ctx, busy.ID, time.Time{})
	if len(u.Samples) != 3 {
		t.Fatalf("%d samples kept, want the window's 3", len(u.Samples))
	}
	for i, s := range u.Samples {
		if want := 13 + float64(i); s.CPU.UsedSeconds != want {
			t.Errorf("sample %d: %v CPU-seconds, want %v (oldest first)", i, s.CPU.UsedSeconds, want)
		}
	}
	if *u.Latest != u.Samples[2] {
		t.Errorf("latest %+v is not the newest sample %+v", *u.Latest, u.Samples[2])
	}
	since, _ := m.Usage(ctx, busy.ID, u.Samples[1].Timestamp)
	if len(since.Samples) != 1 || since.Samples[0] != u.Samples[2] || *since.Latest != u.Samples[2] {
		t.Errorf("since the middle sample: %+v", since.Samples)
	}

	// A counter that went backwards is another box (a resume): a new
	// baseline, no sample.
	clock.Advance(10 * time.Second)
	d.set(busy.ID, driver.Usage{CPUSeconds: 0.5, CPUs: 2})
	m.sampleUsage(ctx)
	if again, _ := m.Usage(ctx, busy.ID, time.Time{}); again.Latest.CPU.UsedSeconds != 15 {
		t.Errorf("a counter reset made a sample: %+v", again.Latest)
	}
	// A failed reading makes none either.
	q0, _ := m.Usage(ctx, quiet.ID, time.Time{})
	d.mu.Lock()
	delete(d.usage, quiet.ID)
	d.mu.Unlock()
	clock.Advance(10 * time.Second)
	m.sampleUsage(ctx)
	if q, _ := m.Usage(ctx, quiet.ID, time.Time{}); *q.Latest != *q0.Latest {
		t.Errorf("a failed reading made a sample: %+v, before %+v", q.Latest, q0.Latest)
	}

	// Destroyed: the figures and series go with the sandbox.
	if err := m.Destroy(ctx, busy.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Usage(ctx, busy.ID, time.Time{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("usage of a destroyed sandbox: %v, want a conflict", err)
	}
	if cpu := sandboxSeries(t, mt, "cpu_seconds_total"); len(cpu) != 1 || cpu[quiet.ID] == 0 {
		t.Errorf("after destroy, cubicle_sandbox_cpu_seconds_total = %v, want only the other sandbox", cpu)
	}
	m.usage.mu.Lock()
	_, kept := m.usage.rings[busy.ID]
	m.usage.mu.Unlock()
	if kept {
		t.Error("the destroyed sandbox's ring is still kept")
	}
	m.sampleUsage(ctx)
	m.usage.mu.Lock()
	_, kept = m.usage.rings[busy.ID]
	m.usage.mu.Unlock()
	if kept {
		t.Error("a sampling after destroy made the destroyed sandbox a ring again")
	}
	if _, err := m.Usage(ctx, "nope", time.Time{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("usage of an unknown sandbox: %v", err)
	}
}

// TestUsageUnmetered: a backend whose boxes cannot be measured gives a
// sandbox with no figures, not an error.
func TestUsageUnmetered(t *testing.T) {
	d := newFakeDriver(t)
	m := newTestManager(t, d, t.TempDir(), &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	defer m.Close()
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	m.sampleUsage(ctx)
	m.sampleUsage(ctx)
	u, err := m.Usage(ctx, sb.ID, time.Time{})
	if err != nil || u.Latest != nil || u.Samples == nil || len(u.Samples) != 0 {
		t.Errorf("unmetered sandbox: %+v, %v; want no latest and an empty list", u, err)
	}
}

func TestUsageStoreSize(t *testing.T) {
	for _, tt := range []struct {
		interval, window time.Duration
		want             int
	}{
		{5 * time.Second, 10 * time.Minute, 120},
		{7 * time.Second, time.Minute, 9},
		{time.Minute, time.Second, 1},
		{time.Millisecond, 24 * time.Hour, maxUsageSamples},
	} {
		if got := newUsageStore(tt.interval, tt.window).size; got != tt.want {
			t.Errorf("interval %v, window %v: %d samples, want %d", tt.interval, tt.window, got, tt.want)
		}
	}
}

// meteredPausingDriver is pausingDriver with metered boxes.
type meteredPausingDriver struct {
	*pausingDriver
	m *meteredDriver
}

func (d *meteredPausingDriver) Create(ctx context.Context, spec driver.Spec) (driver.Box, error) {
	return d.m.Create(ctx, spec)
}

func (d *meteredPausingDriver) Pause(ctx context.Context, b driver.Box) (driver.Paused, error) {
	return d.pausingDriver.Pause(ctx, b.(*meteredBox).Box)
}

func (d *meteredPausingDriver) Resume(ctx context.Context, p driver.Paused) (driver.Box, error) {
	b, err := d.pausingDriver.Resume(ctx, p)
	if err != nil {
		return nil, err
	}
	return &meteredBox{Box: b, d: d.m, id: b.(*fakeBox).id}, nil
}

// TestUsagePaused: a paused sandbox keeps its history but has no series
// (it uses nothing); resumed, its new box starts a new CPU baseline.
func TestUsagePaused(t *testing.T) {
	pd := newPausingDriver(t)
	d := &meteredPausingDriver{pausingDriver: pd, m: &meteredDriver{fakeDriver: pd.fakeDriver, usage: map[string]driver.Usage{}}}
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	mt := metrics.New()
	m, err := New(context.Background(), Config{
		DataDir: t.TempDir(), Drivers: map[string]driver.Driver{"gvisor": d},
		Images:       func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes: 2, ReapInterval: time.Hour, Clock: clock, Metrics: mt,
		UsageInterval: time.Hour, UsageWindow: 10 * time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	step := func(cpu float64) {
		clock.Advance(10 * time.Second)
		d.m.set(sb.ID, driver.Usage{CPUSeconds: cpu, CPUs: 1})
		m.sampleUsage(ctx)
	}
	step(10)
	step(15) // 50 %
	if got := sandboxSeries(t, mt, "cpu_seconds_total"); got[sb.ID] != 15 {
		t.Fatalf("running: series %v", got)
	}
	if _, err := m.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	step(20)
	u, err := m.Usage(ctx, sb.ID, time.Time{})
	if err != nil || u.State != StatePaused || len(u.Samples) != 1 || u.Latest.CPU.Percent != 50 {
		t.Errorf("paused: %+v, %v; want its one sample kept", u, err)
	}
	if got := sandboxSeries(t, mt, "cpu_seconds_total"); len(got) != 0 {
		t.Errorf("a paused sandbox has series: %v", got)
	}
	if _, err := m.Resume(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	// The resumed box is another box: its first reading is a baseline,
	// whatever its counter says.
	step(21)
	if u, _ := m.Usage(ctx, sb.ID, time.Time{}); len(u.Samples) != 1 {
		t.Errorf("the resumed box's first reading made a sample: %+v", u.Samples)
	}
	step(26)
	u, _ = m.Usage(ctx, sb.ID, time.Time{})
	if len(u.Samples) != 2 || u.Latest.CPU.Percent != 50 {
		t.Errorf("after resume: %+v", u.Samples)
	}
	if got := sandboxSeries(t, mt, "cpu_seconds_total"); got[sb.ID] != 26 {
		t.Errorf("resumed: series %v", got)
	}
}

// TestUsageLoop runs the sampler on its own schedule while Prometheus is
// scraped and the sandbox destroyed (go test -race finds what they share
// unguarded).
func TestUsageLoop(t *testing.T) {
	d := &meteredDriver{fakeDriver: newFakeDriver(t), usage: map[string]driver.Usage{}}
	mt := metrics.New()
	m, err := New(context.Background(), Config{
		DataDir: t.TempDir(), Drivers: map[string]driver.Driver{"gvisor": d},
		Images:       func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes: 2, ReapInterval: time.Hour, Metrics: mt,
		UsageInterval: 10 * time.Millisecond, UsageWindow: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for cpu := 1.0; ; cpu += 0.01 {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			d.set(sb.ID, driver.Usage{CPUSeconds: cpu, CPUs: 1})
			mt.Registry.Gather()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		u, err := m.Usage(ctx, sb.ID, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(u.Samples) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no samples from the loop in 10 s: %+v", u)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := m.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-done
	if got := sandboxSeries(t, mt, "cpu_seconds_total"); len(got) != 0 {
		t.Errorf("series after destroy: %v", got)
	}
}
