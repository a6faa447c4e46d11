package e2b

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// metricBody is E2B's SandboxMetric schema, one entry of GET
// /sandboxes/{id}/metrics. Units are E2B's: cpuUsedPct is the percentage
// of all the sandbox's CPUs (cpuCount) in use, 0 to 100, and memory and
// disk are in bytes.
type metricBody struct {
	Timestamp     time.Time `json:"timestamp"` // deprecated by E2B, still read by the SDKs
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metricOf is a cubicle sample in E2B's shape. cpuCount is an integer
// there: a fractional quota counts as the CPUs it touches.
func metricOf(s sandbox.UsageSample) metricBody {
	return metricBody{
		Timestamp: s.Timestamp.UTC(), TimestampUnix: s.Timestamp.Unix(),
		CPUCount: max(int(math.Ceil(s.CPU.Count)), 1), CPUUsedPct: s.CPU.Percent,
		MemUsed: s.Memory.UsedBytes, MemTotal: s.Memory.LimitBytes, MemCache: s.Memory.CacheBytes,
		DiskUsed: s.Disk.UsedBytes, DiskTotal: s.Disk.LimitBytes,
	}
}

// metrics answers the SDK's getMetrics: the samples cubicle keeps of the
// sandbox (every few seconds, for a window; see sandbox.Usage) taken
// between start and end (Unix seconds, both optional and inclusive),
// oldest first. Before the first sample it is [], as E2B's is.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	bounds := map[string]int64{}
	for _, name := range []string{"start", "end"} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				writeError(w, s.log, r, badRequestf("%s must be a Unix time in seconds, not %q", name, truncate(v, 32)))
				return
			}
			bounds[name] = n
		}
	}
	start, hasStart := bounds["start"]
	end, hasEnd := bounds["end"]
	if hasStart && hasEnd && start > end {
		writeError(w, s.log, r, badRequestf("start (%d) is after end (%d)", start, end))
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	var since time.Time
	if hasStart {
		since = time.Unix(start, 0).Add(-time.Nanosecond) // samples at start itself count
	}
	u, err := s.mgr.Usage(r.Context(), sb.ID, since)
	switch {
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict):
		// Gone since the lookup: as E2B says of a killed sandbox.
		writeError(w, s.log, r, notFound(sb.ID))
		return
	case err != nil:
		writeError(w, s.log, r, fmt.Errorf("metrics of sandbox %s: %w", sb.ID, err))
		return
	}
	out := make([]metricBody, 0, len(u.Samples))
	for _, sm := range u.Samples {
		if hasEnd && sm.Timestamp.Unix() > end {
			break
		}
		out = append(out, metricOf(sm))
	}
	writeJSON(w, http.StatusOK, out)
}
