package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

func (f *fakeManager) Usage(ctx context.Context, id string, since time.Time) (sandbox.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return sandbox.Usage{}, errdefs.NotFound("sandbox %s not found", id)
	}
	u := sandbox.Usage{SandboxID: id, State: sb.State, Samples: []sandbox.UsageSample{}}
	for _, s := range f.usage[id] {
		if s.Timestamp.After(since) {
			u.Samples = append(u.Samples, s)
		}
	}
	return u, nil
}

func TestMetrics(t *testing.T) {
	sample := func(sec int, pct float64) sandbox.UsageSample {
		return sandbox.UsageSample{Timestamp: t0.Add(time.Duration(sec) * time.Second),
			CPU:    sandbox.CPUUsage{UsedSeconds: float64(sec), Percent: pct, Count: 2},
			Memory: sandbox.MemoryUsage{UsedBytes: 300 << 20, CacheBytes: 20 << 20, LimitBytes: 2 << 30},
			Disk:   sandbox.DiskUsage{UsedBytes: 5 << 20, LimitBytes: 4 << 30}}
	}
	samples := []sandbox.UsageSample{sample(0, 1.5), sample(5, 50), sample(10, 49.9)}
	half := sample(15, 100)
	half.CPU.Count = 0.5
	at := func(sec int) string { return fmt.Sprint(t0.Unix() + int64(sec)) }
	for _, tt := range []struct {
		name, query string
		id          string
		want        []float64 // cpuUsedPct of the entries answered
		status      int
		msg         string
	}{
		{name: "all", want: []float64{1.5, 50, 49.9}},
		{name: "from start, inclusive", query: "?start=" + at(5), want: []float64{50, 49.9}},
		{name: "to end, inclusive", query: "?end=" + at(5), want: []float64{1.5, 50}},
		{name: "one instant", query: "?start=" + at(5) + "&end=" + at(5), want: []float64{50}},
		{name: "before any sample", query: "?end=" + at(-1), want: []float64{}},
		{name: "paused keeps its history", id: "sbpaused", want: []float64{1.5, 50, 49.9}},
		{name: "start after end", query: "?start=" + at(6) + "&end=" + at(5), status: 400, msg: "after end"},
		{name: "start not a number", query: "?start=yesterday", status: 400, msg: "start must be"},
		{name: "end negative", query: "?end=-5", status: 400, msg: "end must be"},
		{name: "stopped", id: "sbstopped", status: 404, msg: "not found"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			f.add(running("sb1"))
			paused := running("sbpaused")
			paused.State = sandbox.StatePaused
			f.add(paused)
			stopped := running("sbstopped")
			stopped.State = sandbox.StateStopped
			f.add(stopped)
			f.usage = map[string][]sandbox.UsageSample{"sb1": samples, "sbpaused": samples, "sbstopped": samples}
			id := tt.id
			if id == "" {
				id = "sb1"
			}
			rec := do(t, s, "GET", "/sandboxes/"+id+"/metrics"+tt.query, "", nil)
			if tt.status != 0 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.msg)
				return
			}
			if rec.Code != 200 {
				t.Fatalf("status %d (body %s)", rec.Code, rec.Body)
			}
			var got []metricBody
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("%v: %s", err, rec.Body)
			}
			pcts := []float64{}
			for _, m := range got {
				pcts = append(pcts, m.CPUUsedPct)
			}
			if fmt.Sprint(pcts) != fmt.Sprint(tt.want) {
				t.Errorf("cpuUsedPct of the entries: %v, want %v", pcts, tt.want)
			}
		})
	}

	// The wire form: E2B's SandboxMetric, field by field.
	s, f := newTestServer(t, nil)
	f.add(running("sb1"))
	f.usage = map[string][]sandbox.UsageSample{"sb1": {samples[1], half}}
	rec := do(t, s, "GET", "/sandboxes/sb1/metrics", "", nil)
	want := fmt.Sprintf(`[{"timestamp":"2026-08-01T12:00:05Z","timestampUnix":%d,"cpuCount":2,"cpuUsedPct":50,`+
		`"memUsed":314572800,"memTotal":2147483648,"memCache":20971520,"diskUsed":5242880,"diskTotal":4294967296},`+
		`{"timestamp":"2026-08-01T12:00:15Z","timestampUnix":%d,"cpuCount":1,"cpuUsedPct":100,`+
		`"memUsed":314572800,"memTotal":2147483648,"memCache":20971520,"diskUsed":5242880,"diskTotal":4294967296}]`,
		t0.Unix()+5, t0.Unix()+15)
	if got := rec.Body.String(); got != want+"\n" {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
}
