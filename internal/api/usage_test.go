package api

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// usageSamples are the fake manager's samples of every running sandbox.
var usageSamples = []sandbox.UsageSample{
	{Timestamp: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), CPU: sandbox.CPUUsage{UsedSeconds: 1.5, Percent: 12.5, Count: 2},
		Memory: sandbox.MemoryUsage{UsedBytes: 300 << 20, CacheBytes: 20 << 20, LimitBytes: 2 << 30}, Disk: sandbox.DiskUsage{UsedBytes: 5 << 20, LimitBytes: 4 << 30}},
	{Timestamp: time.Date(2025, 1, 2, 3, 4, 10, 0, time.UTC), CPU: sandbox.CPUUsage{UsedSeconds: 6.5, Percent: 50, Count: 2},
		Memory: sandbox.MemoryUsage{UsedBytes: 310 << 20, CacheBytes: 20 << 20, LimitBytes: 2 << 30}, Disk: sandbox.DiskUsage{UsedBytes: 5 << 20, LimitBytes: 4 << 30},
		Network: &sandbox.NetworkUsage{RxBytes: 10, TxBytes: 20, RxPackets: 1, TxPackets: 2}},
}

func (m *fakeManager) Usage(_ context.Context, id string, since time.Time) (sandbox.Usage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return sandbox.Usage{}, m.err
	}
	sb, ok := m.sandboxes[id]
	if !ok {
		return sandbox.Usage{}, errdefs.NotFound("sandbox %s not found", id)
	}
	if sb.State != sandbox.StateRunning {
		return sandbox.Usage{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	u := sandbox.Usage{SandboxID: id, Backend: sb.Backend, State: sb.State, IntervalSeconds: 5, WindowSeconds: 600,
		Latest: &usageSamples[1], Samples: []sandbox.UsageSample{}}
	for _, s := range usageSamples {
		if s.Timestamp.After(since) {
			u.Samples = append(u.Samples, s)
		}
	}
	return u, nil
}

func TestSandboxMetrics(t *testing.T) {
	e := newTestEnv(t, Config{})
	base := "/v1/sandboxes/" + runningID + "/metrics"
	for _, tt := range []struct {
		name, target string
		status       int
		code         string
		samples      int
	}{
		{"all", base, 200, "", 2},
		{"since the first", base + "?since=" + url.QueryEscape("2025-01-02T03:04:05Z"), 200, "", 1},
		{"since with fractions and an offset", base + "?since=" + url.QueryEscape("2025-01-02T04:04:05.5+01:00"), 200, "", 1},
		{"since the future", base + "?since=2030-01-01T00:00:00Z", 200, "", 0},
		{"since not a time", base + "?since=yesterday", 400, codeInvalid, 0},
		{"since a Unix time", base + "?since=1735787045", 400, codeInvalid, 0},
		{"stopped", "/v1/sandboxes/" + stoppedID + "/metrics", 409, codeConflict, 0},
		{"unknown", "/v1/sandboxes/nope/metrics", 404, codeNotFound, 0},
		{"bad id", "/v1/sandboxes/a%20b/metrics", 404, codeNotFound, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := e.do("GET", tt.target, nil)
			if tt.code != "" {
				wantError(t, w, tt.status, tt.code)
				return
			}
			var got struct {
				SandboxID       string          `json:"sandbox_id"`
				IntervalSeconds float64         `json:"interval_seconds"`
				Latest          json.RawMessage `json:"latest"`
				Samples         []json.RawMessage
			}
			if err := json.Unmarshal(decode[json.RawMessage](t, w, tt.status), &got); err != nil {
				t.Fatal(err)
			}
			if got.SandboxID != runningID || got.IntervalSeconds != 5 || len(got.Samples) != tt.samples || len(got.Latest) < 10 {
				t.Errorf("got %+v", got)
			}
		})
	}
	if e.mgr.touched != 0 || e.mgr.agentCalls != 0 {
		t.Errorf("reading figures counted as activity: %d touches, %d agent calls", e.mgr.touched, e.mgr.agentCalls)
	}
	// The wire form of a sample: API.md's snake_case, RFC 3339 times.
	w := e.do("GET", base+"?since=2025-01-02T03:04:05Z", nil)
	var raw map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	s := raw["samples"].([]any)[0].(map[string]any)
	want := `{"cpu":{"count":2,"percent":50,"used_seconds":6.5},"disk":{"limit_bytes":4294967296,"used_bytes":5242880},` +
		`"memory":{"cache_bytes":20971520,"limit_bytes":2147483648,"used_bytes":325058560},` +
		`"network":{"rx_bytes":10,"rx_packets":1,"tx_bytes":20,"tx_packets":2},"timestamp":"2025-01-02T03:04:10Z"}`
	if b, _ := json.Marshal(s); string(b) != want {
		t.Errorf("sample on the wire:\n got %s\nwant %s", b, want)
	}
}
