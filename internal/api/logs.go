package api

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// logsBody is the answer of GET /v1/sandboxes/{id}/logs.
type logsBody struct {
	Logs []sandbox.LogEntry `json:"logs"`
}

// parseLogsQuery decodes the query of GET /v1/sandboxes/{id}/logs:
// since (RFC 3339: only lines after it, oldest first; without it, the
// newest lines), limit (1 to 1000, default 1000), level (the least severe
// level answered) and search (a case-sensitive substring of the message).
func parseLogsQuery(r *http.Request) (consolelog.Query, error) {
	v := r.URL.Query()
	var q consolelog.Query
	if s := v.Get("since"); s != "" {
		since, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return q, invalidf("since must be an RFC 3339 time, such as 2026-01-02T15:04:05Z, not %q", shorten(s, 64))
		}
		// Timestamps are unique to the nanosecond (consolelog.Ring):
		// "after since" is "at or after the next nanosecond".
		q.Cursor = since.Add(time.Nanosecond)
	} else {
		q.Backward = true
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > consolelog.MaxLimit {
			return q, invalidf("limit must be an integer from 1 to %d, not %q", consolelog.MaxLimit, shorten(s, 32))
		}
		q.Limit = n
	}
	if s := v.Get("level"); s != "" {
		lvl, err := consolelog.ParseLevel(s)
		if err != nil {
			return q, invalidf("level must be debug, info, warn or error, not %q", shorten(s, 32))
		}
		q.MinLevel = lvl
	}
	q.Search = v.Get("search")
	if len(q.Search) > consolelog.MaxLineBytes {
		return q, invalidf("search is longer than %d bytes", consolelog.MaxLineBytes)
	}
	return q, nil
}

// sandboxLogs answers GET /v1/sandboxes/{id}/logs: what the sandbox
// printed on its console (sandbox.Manager.Logs), oldest first. Only the
// key that created the sandbox reads its logs; for any other it is not
// found. A stopped sandbox's logs are kept as long as it is listed.
// Reading them is not activity for the idle timeout.
func (s *server) sandboxLogs(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	q, err := parseLogsQuery(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	got, err := s.mgr.Logs(r.Context(), id, s.keys.Owner(r), q)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if q.Backward {
		// The newest lines were selected newest first; they are
		// answered in the order they were printed.
		slices.Reverse(got)
	}
	if got == nil {
		got = []sandbox.LogEntry{}
	}
	writeJSON(w, http.StatusOK, logsBody{Logs: got})
}
