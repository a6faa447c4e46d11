package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// SandboxUsage is the latest resource figures of one running sandbox,
// exported as the cubicle_sandbox_* series labelled with its ID and
// backend.
type SandboxUsage struct {
	ID, Backend      string
	CPUSeconds       float64 // cumulative CPU time of its box
	CPUs             float64 // CPUs' worth it may use
	MemoryBytes      int64
	MemoryLimitBytes int64 // 0: none known (no series)
	DiskBytes        int64
	DiskLimitBytes   int64        // 0: unbounded (no series)
	Net              *NetCounters // nil: no network (no series)
}

// NetCounters are a sandbox's network counters, seen from the sandbox.
type NetCounters struct {
	RxBytes, TxBytes, RxPackets, TxPackets uint64
}

// SandboxCollector exports per-sandbox series from a source the manager
// sets, read at each scrape (nothing is kept here between scrapes). The
// label set stays bounded because the source lists running sandboxes
// only, at most the daemon's --max-sandboxes: a sandbox's series vanish
// with it, and a paused one has none.
type SandboxCollector struct {
	mu     sync.Mutex
	source func() []SandboxUsage

	cpu, cpus, mem, memLimit, disk, diskLimit *prometheus.Desc
	rxBytes, txBytes, rxPackets, txPackets    *prometheus.Desc
}

func newSandboxCollector() *SandboxCollector {
	labels := []string{"sandbox", "backend"}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("cubicle_sandbox_"+name, help, labels, nil)
	}
	return &SandboxCollector{
		cpu:       d("cpu_seconds_total", "CPU time a running sandbox's box has used (user and system), from its cgroup or VMM process."),
		cpus:      d("cpus", "CPUs' worth of time a running sandbox may use (its quota or vCPUs, at most the host's)."),
		mem:       d("memory_bytes", "Memory a running sandbox holds (cgroup usage less inactive page cache, or the VMM's resident set)."),
		memLimit:  d("memory_limit_bytes", "Memory limit of a running sandbox."),
		disk:      d("disk_bytes", "Bytes a running sandbox's own writable disk holds (not the shared image)."),
		diskLimit: d("disk_limit_bytes", "Size of a running sandbox's writable disk."),
		rxBytes:   d("network_receive_bytes_total", "Bytes a running sandbox received on its network device."),
		txBytes:   d("network_transmit_bytes_total", "Bytes a running sandbox sent on its network device."),
		rxPackets: d("network_receive_packets_total", "Packets a running sandbox received on its network device."),
		txPackets: d("network_transmit_packets_total", "Packets a running sandbox sent on its network device."),
	}
}

// SetSource sets the function listing the running sandboxes' latest
// figures; nil exports nothing.
func (c *SandboxCollector) SetSource(f func() []SandboxUsage) {
	c.mu.Lock()
	c.source = f
	c.mu.Unlock()
}

// Describe sends the descriptors of every series the collector exports.
func (c *SandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cpu, c.cpus, c.mem, c.memLimit, c.disk, c.diskLimit, c.rxBytes, c.txBytes, c.rxPackets, c.txPackets} {
		ch <- d
	}
}

// Collect sends the series of each sandbox the source lists.
func (c *SandboxCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	f := c.source
	c.mu.Unlock()
	if f == nil {
		return
	}
	for _, s := range f() {
		send := func(d *prometheus.Desc, t prometheus.ValueType, v float64) {
			ch <- prometheus.MustNewConstMetric(d, t, v, s.ID, s.Backend)
		}
		send(c.cpu, prometheus.CounterValue, s.CPUSeconds)
		send(c.cpus, prometheus.GaugeValue, s.CPUs)
		send(c.mem, prometheus.GaugeValue, float64(s.MemoryBytes))
		if s.MemoryLimitBytes > 0 {
			send(c.memLimit, prometheus.GaugeValue, float64(s.MemoryLimitBytes))
		}
		send(c.disk, prometheus.GaugeValue, float64(s.DiskBytes))
		if s.DiskLimitBytes > 0 {
			send(c.diskLimit, prometheus.GaugeValue, float64(s.DiskLimitBytes))
		}
		if n := s.Net; n != nil {
			send(c.rxBytes, prometheus.CounterValue, float64(n.RxBytes))
			send(c.txBytes, prometheus.CounterValue, float64(n.TxBytes))
			send(c.rxPackets, prometheus.CounterValue, float64(n.RxPackets))
			send(c.txPackets, prometheus.CounterValue, float64(n.TxPackets))
		}
	}
}
