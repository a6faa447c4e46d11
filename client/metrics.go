package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Metrics is a sandbox's resource figures as the host measures them
// (GET /v1/sandboxes/{id}/metrics): the latest sample and the history
// the daemon keeps, oldest first.
type Metrics struct {
	SandboxID       string  `json:"sandbox_id"`
	Backend         string  `json:"backend"`
	State           string  `json:"state"`
	IntervalSeconds float64 `json:"interval_seconds"` // time between samples
	WindowSeconds   float64 `json:"window_seconds"`   // history kept
	// Latest is nil until the first sample, one interval after the
	// sandbox starts running.
	Latest  *MetricsSample  `json:"latest"`
	Samples []MetricsSample `json:"samples"`
}

// MetricsSample is one sample of a sandbox's figures.
type MetricsSample struct {
	Timestamp time.Time `json:"timestamp"`
	CPU       struct {
		UsedSeconds float64 `json:"used_seconds"` // since the box started
		Percent     float64 `json:"percent"`      // of Count CPUs since the previous sample, 0-100
		Count       float64 `json:"count"`        // CPUs the sandbox may use
	} `json:"cpu"`
	Memory struct {
		UsedBytes  int64 `json:"used_bytes"`
		CacheBytes int64 `json:"cache_bytes"`
		LimitBytes int64 `json:"limit_bytes"` // 0: none known
	} `json:"memory"`
	Disk struct {
		UsedBytes  int64 `json:"used_bytes"`  // the sandbox's own writable disk
		LimitBytes int64 `json:"limit_bytes"` // 0: unbounded
	} `json:"disk"`
	// Network is nil for a sandbox without a network; rx is what the
	// sandbox received.
	Network *struct {
		RxBytes   uint64 `json:"rx_bytes"`
		TxBytes   uint64 `json:"tx_bytes"`
		RxPackets uint64 `json:"rx_packets"`
		TxPackets uint64 `json:"tx_packets"`
	} `json:"network"`
}

// CoresUsed is how many CPU cores' worth the sandbox used over the
// sample's interval (Percent of Count).
func (s MetricsSample) CoresUsed() float64 { return s.CPU.Percent * s.CPU.Count / 100 }

// MetricsOptions selects the history Metrics returns.
type MetricsOptions struct {
	// Since keeps only samples taken after it; zero: all kept.
	Since time.Time
}

// Metrics returns sandbox id's resource figures. Reading them does not
// count as use of the sandbox (its idle timer is not reset). A sandbox
// that is stopping or gone answers CodeConflict.
func (c *Client) Metrics(ctx context.Context, id string, opts MetricsOptions) (Metrics, error) {
	if err := checkID(id); err != nil {
		return Metrics{}, err
	}
	q := url.Values{}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.Format(time.RFC3339Nano))
	}
	var m Metrics
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: sandboxPath(id, "metrics"), query: q, retry: true}, &m)
	return m, err
}
