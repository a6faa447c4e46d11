package firecracker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Firecracker writes its metrics as one JSON object per line, every 60 s
// and on the FlushMetrics action. Counters (Firecracker's SharedIncMetric)
// hold the increase since the previous line; a few values (SharedStoreMetric,
// e.g. api_server.process_startup_time_us) are absolute. The file is
// outside input — written by a process a guest may have compromised — so it
// is parsed with limits and every value is checked.

// Limits on one metrics line.
const (
	maxMetricsLine   = 1 << 20 // bytes
	maxMetricsDepth  = 4
	maxMetricsKeys   = 4096
	maxReadPerScrape = 16 << 20
)

// fcMetric maps one Firecracker metric (a dotted path in the JSON object)
// to a Prometheus series.
type fcMetric struct {
	key   string // e.g. "block.read_bytes"
	name  string // Prometheus name, without the cubicle_firecracker_ prefix
	help  string
	label string  // value of the "kind" label, "" for none
	gauge bool    // absolute value, not an increase
	div   float64 // divide the value by this (unit conversion); 0: as is
}

// fcMetrics are the series the collector exports.
var fcMetrics = []fcMetric{
	{key: "block.read_bytes", name: "block_read_bytes_total", help: "Bytes the guest read from its root drive."},
	{key: "block.write_bytes", name: "block_write_bytes_total", help: "Bytes the guest wrote to its root drive."},
	{key: "block.read_count", name: "block_read_ops_total", help: "Read requests of the guest's root drive."},
	{key: "block.write_count", name: "block_write_ops_total", help: "Write requests of the guest's root drive."},
	{key: "block.rate_limiter_throttled_events", name: "block_throttled_total", help: "Times the drive rate limiter throttled the guest."},
	{key: "net.rx_bytes_count", name: "net_rx_bytes_total", help: "Bytes delivered to the guest's network interface."},
	{key: "net.tx_bytes_count", name: "net_tx_bytes_total", help: "Bytes sent by the guest's network interface."},
	{key: "net.rx_packets_count", name: "net_rx_packets_total", help: "Packets delivered to the guest."},
	{key: "net.tx_packets_count", name: "net_tx_packets_total", help: "Packets sent by the guest."},
	{key: "net.rx_rate_limiter_throttled", name: "net_throttled_total", label: "rx", help: "Times a network rate limiter throttled the guest, by direction."},
	{key: "net.tx_rate_limiter_throttled", name: "net_throttled_total", label: "tx", help: "Times a network rate limiter throttled the guest, by direction."},
	{key: "vsock.rx_bytes_count", name: "vsock_rx_bytes_total", help: "Bytes from the host to the guest over vsock (the agent channel)."},
	{key: "vsock.tx_bytes_count", name: "vsock_tx_bytes_total", help: "Bytes from the guest to the host over vsock (the agent channel)."},
	{key: "vcpu.exit_io_in", name: "vcpu_exits_total", label: "io_in", help: "vCPU exits to the VMM, by kind."},
	{key: "vcpu.exit_io_out", name: "vcpu_exits_total", label: "io_out", help: "vCPU exits to the VMM, by kind."},
	{key: "vcpu.exit_mmio_read", name: "vcpu_exits_total", label: "mmio_read", help: "vCPU exits to the VMM, by kind."},
	{key: "vcpu.exit_mmio_write", name: "vcpu_exits_total", label: "mmio_write", help: "vCPU exits to the VMM, by kind."},
	{key: "vcpu.failures", name: "vcpu_failures_total", help: "vCPU run failures."},
	{key: "seccomp.num_faults", name: "seccomp_faults_total", help: "Syscalls the VMM's seccomp filter refused (a sign of compromise)."},
	{key: "vmm.panic_count", name: "vmm_panics_total", help: "VMM panics."},
	{key: "logger.missed_metrics_count", name: "missed_metrics_total", help: "Metrics writes Firecracker could not complete."},
	{key: "logger.missed_log_count", name: "missed_log_total", help: "Log lines Firecracker could not write."},
	{key: "api_server.process_startup_time_us", name: "startup_seconds", gauge: true, div: 1e6, help: "Wall time from jailer start to the API server being up."},
	{key: "utc_timestamp_ms", name: "last_flush_timestamp_seconds", gauge: true, div: 1e3, help: "When Firecracker last wrote metrics (Unix time)."},
}

// descs holds one Desc per distinct series name.
var descs = func() map[string]*prometheus.Desc {
	m := map[string]*prometheus.Desc{}
	for _, fm := range fcMetrics {
		if m[fm.name] != nil {
			continue
		}
		labels := []string{"sandbox"}
		if fm.label != "" {
			labels = append(labels, "kind")
		}
		m[fm.name] = prometheus.NewDesc("cubicle_firecracker_"+fm.name, fm.help, labels, nil)
	}
	m["parse_errors_total"] = prometheus.NewDesc("cubicle_firecracker_metrics_parse_errors_total",
		"Metrics lines of Firecracker that could not be parsed.", []string{"sandbox"}, nil)
	return m
}()

// parseMetricsLine flattens one metrics line into dotted keys with their
// numeric values. Names that are empty or hold a dot are skipped. It refuses lines that are too long, too deep or have too
// many keys, and skips values that are not finite non-negative numbers.
func parseMetricsLine(line []byte) (map[string]float64, error) {
	if len(line) > maxMetricsLine {
		return nil, fmt.Errorf("metrics line of %d bytes is too long", len(line))
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var root map[string]any
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("metrics line: %w", err)
	}
	if dec.More() {
		return nil, errors.New("metrics line: trailing data")
	}
	out := map[string]float64{}
	var walk func(prefix string, v any, depth int) error
	walk = func(prefix string, v any, depth int) error {
		if len(out) > maxMetricsKeys {
			return fmt.Errorf("metrics line: more than %d values", maxMetricsKeys)
		}
		switch v := v.(type) {
		case json.Number:
			f, err := v.Float64()
			if err == nil && f >= 0 && !math.IsInf(f, 0) && !math.IsNaN(f) {
				out[prefix] = f
			}
		case map[string]any:
			if depth >= maxMetricsDepth {
				return fmt.Errorf("metrics line: nested deeper than %d", maxMetricsDepth)
			}
			for k, c := range v {
				// A dot in a name would let one group's value pose
				// as another's ("a.b" at the top against "a":{"b"}).
				// Firecracker's names have none.
				if k == "" || strings.Contains(k, ".") {
					continue
				}
				key := k
				if prefix != "" {
					key = prefix + "." + k
				}
				if err := walk(key, c, depth+1); err != nil {
					return err
				}
			}
		}
		// Strings, booleans, arrays, null: not metrics; ignored.
		return nil
	}
	if err := walk("", root, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// vmMetrics accumulates the metrics file of one VM.
type vmMetrics struct {
	mu      sync.Mutex
	path    string
	offset  int64  // how far the file has been read
	partial []byte // an incomplete last line
	values  map[string]float64
	errors  float64
}

func newVMMetrics(path string) *vmMetrics {
	return &vmMetrics{path: path, values: map[string]float64{}}
}

// update reads what Firecracker appended since the last call and folds it
// in. A file that shrank was replaced or truncated: start over.
func (m *vmMetrics) update() {
	f, err := os.Open(m.path)
	if err != nil {
		return
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() < m.offset {
		m.offset, m.partial = 0, nil
	}
	if _, err := f.Seek(m.offset, io.SeekStart); err != nil {
		return
	}
	data, _ := io.ReadAll(io.LimitReader(f, maxReadPerScrape))
	m.offset += int64(len(data))
	m.feed(data)
}

// feed folds complete lines of data (after any partial line kept from
// before) into the values.
func (m *vmMetrics) feed(data []byte) {
	buf := append(m.partial, data...)
	m.partial = nil
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			if len(buf) > maxMetricsLine {
				m.errors++ // an endless line: drop it
				buf = nil
			}
			m.partial = append([]byte(nil), buf...)
			return
		}
		line := bytes.TrimSpace(buf[:i])
		buf = buf[i+1:]
		if len(line) == 0 {
			continue
		}
		vals, err := parseMetricsLine(line)
		if err != nil {
			m.errors++
			continue
		}
		for _, fm := range fcMetrics {
			v, ok := vals[fm.key]
			if !ok {
				continue
			}
			if fm.div != 0 {
				v /= fm.div
			}
			if fm.gauge {
				m.values[fm.key] = v
			} else {
				m.values[fm.key] += v
			}
		}
	}
}

// collector exports the metrics of a Driver's live VMs.
type collector Driver

// Describe sends the descriptors of every series.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

// Collect reads each live VM's metrics file and sends its series.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range (*Driver)(c).liveBoxes() {
		m := b.metrics
		m.mu.Lock()
		m.update()
		for _, fm := range fcMetrics {
			v, ok := m.values[fm.key]
			if !ok {
				continue
			}
			typ := prometheus.CounterValue
			if fm.gauge {
				typ = prometheus.GaugeValue
			}
			labels := []string{b.data.ID}
			if fm.label != "" {
				labels = append(labels, fm.label)
			}
			ch <- prometheus.MustNewConstMetric(descs[fm.name], typ, v, labels...)
		}
		ch <- prometheus.MustNewConstMetric(descs["parse_errors_total"], prometheus.CounterValue, m.errors, b.data.ID)
		m.mu.Unlock()
	}
}
