package firecracker

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A metrics line shaped like Firecracker 1.10's (abridged).
const metricsLine1 = `{"utc_timestamp_ms":1739000000000,"api_server":{"process_startup_time_us":12500,"process_startup_time_cpu_us":900,"sync_response_fails":0},` +
	`"block":{"read_bytes":4096,"write_bytes":512,"read_count":2,"write_count":1,"rate_limiter_throttled_events":3,"read_agg":{"min_us":1,"max_us":9,"sum_us":10}},` +
	`"net":{"rx_bytes_count":100,"tx_bytes_count":50,"rx_packets_count":2,"tx_packets_count":1,"rx_rate_limiter_throttled":0,"tx_rate_limiter_throttled":4},` +
	`"vcpu":{"exit_io_in":10,"exit_io_out":20,"exit_mmio_read":30,"exit_mmio_write":40,"failures":0},` +
	`"seccomp":{"num_faults":0},"vmm":{"panic_count":0},"vsock":{"rx_bytes_count":7,"tx_bytes_count":8},"logger":{"missed_metrics_count":0,"missed_log_count":0},` +
	`"properties":{"bundle":"x"},"list":[1,2],"neg":-5,"nul":null}`

const metricsLine2 = `{"utc_timestamp_ms":1739000060000,"api_server":{"process_startup_time_us":12500},"block":{"read_bytes":1000,"write_bytes":0},"net":{"tx_rate_limiter_throttled":1}}`

func TestParseMetricsLine(t *testing.T) {
	vals, err := parseMetricsLine([]byte(metricsLine1))
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"block.read_bytes": 4096, "block.read_agg.sum_us": 10, "utc_timestamp_ms": 1739000000000, "vcpu.exit_mmio_write": 40} {
		if vals[k] != want {
			t.Errorf("%s = %v, want %v", k, vals[k], want)
		}
	}
	for _, k := range []string{"neg", "nul", "list", "properties.bundle"} {
		if _, ok := vals[k]; ok {
			t.Errorf("%s parsed as a metric", k)
		}
	}
	// a dotted name cannot pose as a nested one, nor add depth
	vals, err = parseMetricsLine([]byte(`{"block.read_bytes":7,"block":{"read_bytes":3},"....":1,"":2}`))
	if err != nil || len(vals) != 1 || vals["block.read_bytes"] != 3 {
		t.Errorf("dotted names: %v, %v; want only block.read_bytes = 3", vals, err)
	}
	for _, bad := range []string{"", "[]", "{", `{"a":1}{"b":2}`, `{"a":{"b":{"c":{"d":{"e":1}}}}}`, "\"x\"", strings.Repeat(" ", maxMetricsLine+1)} {
		if _, err := parseMetricsLine([]byte(bad)); err == nil {
			t.Errorf("parseMetricsLine(%.40q) accepted", bad)
		}
	}
}

// TestCollector: counters add up the increases of successive lines,
// gauges keep the last value; a partial line waits for its end; garbage is
// counted, not fatal.
func TestCollector(t *testing.T) {
	d := New(Config{ChrootBase: t.TempDir()})
	jail := filepath.Join(t.TempDir(), "fc1")
	os.MkdirAll(filepath.Join(jail, "root"), 0o755)
	path := filepath.Join(jail, "root", "metrics.json")
	b := &box{d: d, data: boxData{ID: "fc1", JailDir: jail}, metrics: newVMMetrics(path)}
	d.register(b)

	os.WriteFile(path, []byte(metricsLine1+"\nnot json\n"+metricsLine2[:40]), 0o600)
	c := d.Collector()
	if got := testutil.ToFloat64(onlySeries(c, "cubicle_firecracker_block_read_bytes_total")); got != 4096 {
		t.Errorf("read bytes after line 1 = %v", got)
	}
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(metricsLine2[40:] + "\n")
	f.Close()
	want := `
# HELP cubicle_firecracker_block_read_bytes_total Bytes the guest read from its root drive.
# TYPE cubicle_firecracker_block_read_bytes_total counter
cubicle_firecracker_block_read_bytes_total{sandbox="fc1"} 5096
# HELP cubicle_firecracker_net_throttled_total Times a network rate limiter throttled the guest, by direction.
# TYPE cubicle_firecracker_net_throttled_total counter
cubicle_firecracker_net_throttled_total{kind="rx",sandbox="fc1"} 0
cubicle_firecracker_net_throttled_total{kind="tx",sandbox="fc1"} 5
# HELP cubicle_firecracker_startup_seconds Wall time from jailer start to the API server being up.
# TYPE cubicle_firecracker_startup_seconds gauge
cubicle_firecracker_startup_seconds{sandbox="fc1"} 0.0125
# HELP cubicle_firecracker_metrics_parse_errors_total Metrics lines of Firecracker that could not be parsed.
# TYPE cubicle_firecracker_metrics_parse_errors_total counter
cubicle_firecracker_metrics_parse_errors_total{sandbox="fc1"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"cubicle_firecracker_block_read_bytes_total", "cubicle_firecracker_net_throttled_total",
		"cubicle_firecracker_startup_seconds", "cubicle_firecracker_metrics_parse_errors_total"); err != nil {
		t.Error(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Errorf("pedantic gather: %v", err)
	}
	d.unregister(b)
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("%d series after the VM is gone", n)
	}
}

// onlySeries returns a collector of the one named series of c.
func onlySeries(c prometheus.Collector, name string) prometheus.Collector {
	return filtered{c, name}
}

type filtered struct {
	c    prometheus.Collector
	name string
}

func (f filtered) Describe(ch chan<- *prometheus.Desc) { f.c.Describe(ch) }
func (f filtered) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() { f.c.Collect(all); close(all) }()
	for m := range all {
		if strings.Contains(m.Desc().String(), `"`+f.name+`"`) {
			ch <- m
		}
	}
}

// FuzzParseMetricsLine: the metrics file is written by a process a guest
// may have compromised. No input may panic, and the result stays within
// the limits: finite, non-negative values, bounded key count.
func FuzzParseMetricsLine(f *testing.F) {
	f.Add([]byte(metricsLine1))
	f.Add([]byte(metricsLine2))
	f.Add([]byte(`{"a":{"b":1e308},"c":1e309,"d":-0}`))
	f.Add([]byte(`{"a":[{"b":1}],"b":"1"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		vals, err := parseMetricsLine(line)
		if err != nil {
			return
		}
		if len(vals) > maxMetricsKeys+1 {
			t.Fatalf("%d values", len(vals))
		}
		for k, v := range vals {
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("%s = %v", k, v)
			}
			if strings.Count(k, ".") >= maxMetricsDepth {
				t.Fatalf("key %q deeper than the limit", k)
			}
		}
		// feeding the same bytes through the file accumulator must not
		// panic either
		m := newVMMetrics("")
		m.feed(append(line, '\n'))
	})
}
