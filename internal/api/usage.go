package api

import (
	"net/http"
	"time"
)

// sandboxMetrics answers GET /v1/sandboxes/{id}/metrics: the sandbox's
// latest resource figures and the history the daemon keeps of them
// (sandbox.Usage), after ?since= (RFC 3339) when given. Reading them is
// not activity: the idle timer is not touched, so a dashboard polling
// figures keeps nothing alive.
func (s *server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		if since, err = time.Parse(time.RFC3339Nano, v); err != nil {
			s.writeError(w, r, invalidf("since must be an RFC 3339 time, such as 2026-01-02T15:04:05Z, not %q", shorten(v, 64)))
			return
		}
	}
	u, err := s.mgr.Usage(r.Context(), id, since)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, u)
}

// shorten cuts s to n bytes for an error message.
func shorten(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
