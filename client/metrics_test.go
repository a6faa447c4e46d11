package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// metricsBody is an answer of GET /v1/sandboxes/{id}/metrics as the daemon
// writes it (internal/api's TestSandboxMetrics checks that side).
const metricsBody = `{"sandbox_id":"sb1","backend":"gvisor","state":"running","interval_seconds":5,"window_seconds":600,
"latest":{"timestamp":"2025-01-02T03:04:10Z","cpu":{"used_seconds":6.5,"percent":50,"count":2},
 "memory":{"used_bytes":325058560,"cache_bytes":20971520,"limit_bytes":2147483648},
 "disk":{"used_bytes":5242880,"limit_bytes":4294967296},
 "network":{"rx_bytes":10,"tx_bytes":20,"rx_packets":1,"tx_packets":2}},
"samples":[{"timestamp":"2025-01-02T03:04:05Z","cpu":{"used_seconds":1.5,"percent":12.5,"count":2},
 "memory":{"used_bytes":314572800,"cache_bytes":0,"limit_bytes":2147483648},"disk":{"used_bytes":0,"limit_bytes":0}}]}`

func TestMetrics(t *testing.T) {
	var gotPath, gotSince string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotSince = r.URL.Path, r.URL.Query().Get("since")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(metricsBody))
	}))
	defer srv.Close()
	c, _ := testClient(srv)
	since := time.Date(2025, 1, 2, 3, 4, 0, 500, time.UTC)
	m, err := c.Metrics(context.Background(), "sb1", MetricsOptions{Since: since})
	if err != nil {
		t.Fatal(err)
	}
	if gotPath != "/v1/sandboxes/sb1/metrics" || gotSince != "2025-01-02T03:04:00.0000005Z" {
		t.Errorf("request %s ?since=%s", gotPath, gotSince)
	}
	if m.SandboxID != "sb1" || m.IntervalSeconds != 5 || len(m.Samples) != 1 || m.Latest == nil {
		t.Fatalf("decoded %+v", m)
	}
	l := m.Latest
	if l.CoresUsed() != 1 || l.Memory.UsedBytes != 325058560 || l.Disk.LimitBytes != 4<<30 || l.Network == nil || l.Network.TxPackets != 2 ||
		!l.Timestamp.Equal(time.Date(2025, 1, 2, 3, 4, 10, 0, time.UTC)) {
		t.Errorf("latest %+v", *l)
	}
	if m.Samples[0].Network != nil || m.Samples[0].CPU.Percent != 12.5 {
		t.Errorf("sample without a network: %+v", m.Samples[0])
	}
	if _, err := c.Metrics(context.Background(), "sb1", MetricsOptions{}); err != nil || gotSince != "" {
		t.Errorf("without since: %v, since=%q", err, gotSince)
	}
	if _, err := c.Metrics(context.Background(), "", MetricsOptions{}); err == nil {
		t.Error("an empty id was sent")
	}
}
