// Package metrics defines the daemon's Prometheus metrics (DESIGN.md "Metrics
// and logs") on a registry of its own, so tests can build a fresh set and the
// daemon exposes exactly what it defines. It uses client_golang, the
// reference Prometheus client, rather than a hand-written exposition format.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is the set of the daemon's collectors.
type Metrics struct {
	Registry *prometheus.Registry

	Sandboxes          *prometheus.GaugeVec     // state, backend
	Capacity           prometheus.Gauge         // max sandboxes
	CreateDuration     *prometheus.HistogramVec // backend
	CreateFailures     *prometheus.CounterVec   // backend
	PauseDuration      *prometheus.HistogramVec // backend
	ResumeDuration     *prometheus.HistogramVec // backend
	PauseFailures      *prometheus.CounterVec   // backend: failed pauses and resumes
	ScreenshotDuration *prometheus.HistogramVec // format
	ActionDuration     *prometheus.HistogramVec // type
	ExecDuration       prometheus.Histogram
	Reaped             *prometheus.CounterVec // reason
	NetpoolFree        prometheus.Gauge
	HTTPRequests       *prometheus.CounterVec   // route, code
	ViewConnections    prometheus.Gauge         // open live-view WebSockets
	ViewBytes          *prometheus.CounterVec   // direction: to_viewer, from_viewer
	ViewInputDropped   prometheus.Counter       // input messages of view-only viewers
	InFlightRefused    prometheus.Counter       // requests over a sandbox's in-progress bound
	PoolReady          *prometheus.GaugeVec     // pool: booted desktops waiting for a create
	PoolClaims         *prometheus.CounterVec   // pool, result: hit (a create took one) or miss
	ClaimDuration      *prometheus.HistogramVec // backend: create-to-ready of creates served by the pool
	RecordingsActive   prometheus.Gauge         // screen recordings in progress
	Recordings         *prometheus.CounterVec   // state: recordings ended, stopped (complete) or failed
	// Sandboxes' own figures (CPU, memory, disk, network), one series
	// per running sandbox; the manager sets its source.
	SandboxUsage *SandboxCollector
	// Cluster mode: requests passed to another node (node), this node's
	// view of the cluster (nodes live, catalog entries) and whether it
	// can reach etcd.
	ClusterProxied  *prometheus.CounterVec
	ClusterNodes    prometheus.Gauge
	ClusterEntries  prometheus.Gauge
	ClusterDegraded prometheus.Gauge
}

// fastBuckets resolve the millisecond range where clicks and screenshots live.
var fastBuckets = []float64{.0005, .001, .002, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56}

// New returns a fresh set of collectors registered on a new registry, plus the
// Go runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Sandboxes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cubicle_sandboxes", Help: "Sandboxes by state and backend.",
		}, []string{"state", "backend"}),
		Capacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cubicle_capacity", Help: "Maximum number of sandboxes.",
		}),
		CreateDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_create_duration_seconds", Help: "Time from create request to a ready desktop.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12),
		}, []string{"backend"}),
		CreateFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_create_failures_total", Help: "Failed sandbox creations.",
		}, []string{"backend"}),
		PauseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_pause_duration_seconds", Help: "Time to pause a sandbox to disk.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}, []string{"backend"}),
		ResumeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_resume_duration_seconds", Help: "Time to resume a paused sandbox until its agent answers.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}, []string{"backend"}),
		PauseFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_pause_failures_total", Help: "Failed pauses and resumes.",
		}, []string{"backend"}),
		ScreenshotDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_screenshot_duration_seconds", Help: "Screenshot latency seen by the API.",
			Buckets: fastBuckets,
		}, []string{"format"}),
		ActionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_action_duration_seconds", Help: "Action latency seen by the API, by action type.",
			Buckets: fastBuckets,
		}, []string{"type"}),
		ExecDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cubicle_exec_duration_seconds", Help: "Exec latency seen by the API.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		Reaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_reaped_total", Help: "Sandboxes reaped, by reason (idle, expired, dead, orphan).",
		}, []string{"reason"}),
		NetpoolFree: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cubicle_netpool_free", Help: "Free addresses in the sandbox network pool.",
		}),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_http_requests_total", Help: "API requests by route and status code.",
		}, []string{"route", "code"}),
		ViewConnections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cubicle_view_connections", Help: "Open live-view WebSocket connections.",
		}),
		ViewBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_view_bytes_total", Help: "Live-view RFB bytes, by direction (to_viewer, from_viewer).",
		}, []string{"direction"}),
		ViewInputDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cubicle_view_input_dropped_total", Help: "Input messages of view-only viewers dropped by the proxy.",
		}),
		InFlightRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cubicle_sandbox_requests_refused_total", Help: "Requests refused because their sandbox had as many in progress as allowed.",
		}),
		PoolReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cubicle_pool_ready", Help: "Booted desktops of each warm pool waiting for a create.",
		}, []string{"pool"}),
		PoolClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_pool_claims_total", Help: "Creates that matched a warm pool, by whether a booted desktop was there to take (hit) or not (miss).",
		}, []string{"pool", "result"}),
		ClaimDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_pool_claim_duration_seconds", Help: "Create-to-ready of creates served by a warm pool.", Buckets: fastBuckets,
		}, []string{"backend"}),
		RecordingsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cubicle_recordings_active", Help: "Screen recordings in progress.",
		}),
		Recordings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_recordings_total", Help: "Screen recordings ended, by outcome: stopped (the file is complete) or failed.",
		}, []string{"state"}),
		SandboxUsage: newSandboxCollector(),
		ClusterProxied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_cluster_forwarded_total", Help: "Requests this node passed to the node holding their sandbox (or chosen for a create), by node.",
		}, []string{"node"}),
		ClusterNodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cubicle_cluster_nodes", Help: "Live members of the cluster, as this node sees them (0 on a single host).",
		}),
		ClusterEntries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cubicle_cluster_catalog_entries", Help: "Sandboxes in the cluster's catalog, as this node sees it.",
		}),
		ClusterDegraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cubicle_cluster_degraded", Help: "1 while this node cannot reach a quorum of etcd (it serves its own sandboxes only).",
		}),
	}
	m.Registry.MustRegister(
		m.Sandboxes, m.Capacity, m.CreateDuration, m.CreateFailures,
		m.PauseDuration, m.ResumeDuration, m.PauseFailures,
		m.ScreenshotDuration, m.ActionDuration, m.ExecDuration, m.Reaped,
		m.NetpoolFree, m.HTTPRequests,
		m.ViewConnections, m.ViewBytes, m.ViewInputDropped, m.InFlightRefused,
		m.PoolReady, m.PoolClaims, m.ClaimDuration, m.SandboxUsage,
		m.RecordingsActive, m.Recordings,
		m.ClusterProxied, m.ClusterNodes, m.ClusterEntries, m.ClusterDegraded,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}
