package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// maxSearchBytes bounds the search parameter: a substring longer than
// any line (consolelog.MaxLineBytes) can match nothing.
const maxSearchBytes = consolelog.MaxLineBytes

// logEntryBody is E2B's SandboxLogEntry. fields is required there: {}
// for a line that has none.
type logEntryBody struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logLineBody is E2B's SandboxLog, the deprecated unstructured line.
type logLineBody struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// logsQuery is a decoded logs query, and limit as E2B reads it: 0 asks
// for nothing (consolelog reads 0 as its maximum).
type logsQuery struct {
	q     consolelog.Query
	limit int
}

// parseLogsV2Query decodes the query of GET /v2/sandboxes/{id}/logs:
// cursor (Unix milliseconds, the first line's time going forward, the
// last's going backward), limit (0 to 1000, default 1000), direction
// (forward, the default, or backward: newest first), level (the least
// severe level answered) and search (a case-sensitive substring of the
// message). Errors are 400s.
func parseLogsV2Query(v url.Values) (logsQuery, error) {
	out, err := parseLimitCursor(v, "cursor")
	if err != nil {
		return logsQuery{}, err
	}
	switch d := v.Get("direction"); d {
	case "", "forward":
	case "backward":
		out.q.Backward = true
		if !out.q.Cursor.IsZero() {
			// The cursor is a millisecond: backward, all of it is in.
			out.q.Cursor = out.q.Cursor.Add(time.Millisecond - time.Nanosecond)
		}
	default:
		return logsQuery{}, badRequestf("direction must be forward or backward, not %q", truncate(d, 32))
	}
	if l := v.Get("level"); l != "" {
		lvl, err := consolelog.ParseLevel(l)
		if err != nil || l != lvl.String() {
			return logsQuery{}, badRequestf("level must be debug, info, warn or error, not %q", truncate(l, 32))
		}
		out.q.MinLevel = lvl
	}
	out.q.Search = v.Get("search")
	if len(out.q.Search) > maxSearchBytes {
		return logsQuery{}, badRequestf("search is longer than %d bytes", maxSearchBytes)
	}
	return out, nil
}

// parseLogsV1Query decodes the query of the deprecated GET
// /sandboxes/{id}/logs: start (Unix milliseconds) and limit, forward.
func parseLogsV1Query(v url.Values) (logsQuery, error) {
	return parseLimitCursor(v, "start")
}

// parseLimitCursor reads limit and the cursor parameter named cursor.
func parseLimitCursor(v url.Values, cursor string) (logsQuery, error) {
	out := logsQuery{limit: consolelog.MaxLimit}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > consolelog.MaxLimit {
			return logsQuery{}, badRequestf("limit must be an integer from 0 to %d, not %q", consolelog.MaxLimit, truncate(s, 32))
		}
		out.limit = n
	}
	out.q.Limit = out.limit
	if s := v.Get(cursor); s != "" {
		ms, err := strconv.ParseInt(s, 10, 64)
		// Beyond year 9999 a time has no RFC 3339 form to answer in.
		if err != nil || ms < 0 || ms > maxCursorMillis {
			return logsQuery{}, badRequestf("%s must be a Unix time in milliseconds, not %q", cursor, truncate(s, 32))
		}
		if ms > 0 {
			out.q.Cursor = time.UnixMilli(ms)
		}
	}
	return out, nil
}

// maxCursorMillis is the end of year 9999 in Unix milliseconds.
var maxCursorMillis = time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC).UnixMilli()

// logs returns the lines q selects of the sandbox named by the path, or
// answers the error and reports false. A stopped sandbox's lines are
// kept as long as cubicle lists it (E2B, too, keeps a killed sandbox's
// logs); another key's sandbox is not found.
func (s *Server) logs(w http.ResponseWriter, r *http.Request, lq logsQuery) ([]sandbox.LogEntry, bool) {
	id := r.PathValue("id")
	if !sandboxID.MatchString(id) {
		writeError(w, s.log, r, notFound(truncate(id, maxIDBytes)))
		return nil, false
	}
	got, err := s.mgr.Logs(r.Context(), id, s.keys.Owner(r), lq.q)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		writeError(w, s.log, r, notFound(id))
		return nil, false
	case err != nil:
		writeError(w, s.log, r, fmt.Errorf("logs of sandbox %s: %w", id, err))
		return nil, false
	}
	if lq.limit == 0 {
		got = nil
	}
	return got, true
}

func entryBody(e sandbox.LogEntry) logEntryBody {
	f := e.Fields
	if f == nil {
		f = map[string]string{}
	}
	return logEntryBody{Timestamp: e.Timestamp.UTC(), Level: e.Level, Message: e.Message, Fields: f}
}

// logsV1 answers the deprecated logs endpoint: each line both as E2B's
// plain line and as a structured entry.
func (s *Server) logsV1(w http.ResponseWriter, r *http.Request) {
	lq, err := parseLogsV1Query(r.URL.Query())
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	got, ok := s.logs(w, r, lq)
	if !ok {
		return
	}
	out := logsV1Body{Logs: make([]logLineBody, len(got)), LogEntries: make([]logEntryBody, len(got))}
	for i, e := range got {
		out.Logs[i] = logLineBody{Timestamp: e.Timestamp.UTC(), Line: e.Message}
		out.LogEntries[i] = entryBody(e)
	}
	writeJSON(w, http.StatusOK, out)
}

// logsV2 answers GET /v2/sandboxes/{id}/logs.
func (s *Server) logsV2(w http.ResponseWriter, r *http.Request) {
	lq, err := parseLogsV2Query(r.URL.Query())
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	got, ok := s.logs(w, r, lq)
	if !ok {
		return
	}
	out := logsV2Body{Logs: make([]logEntryBody, len(got))}
	for i, e := range got {
		out.Logs[i] = entryBody(e)
	}
	writeJSON(w, http.StatusOK, out)
}
