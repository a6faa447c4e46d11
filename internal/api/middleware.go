package api

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/apikey"
)

// unmatchedRoute labels requests that match no route in logs and metrics.
const unmatchedRoute = "unmatched"

// ServeHTTP runs every request through recovery, logging, metrics and auth,
// then the route's handler.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusWriter{ResponseWriter: w}
	var mount *Mount
	for i := range s.cfg.Mounts {
		if s.cfg.Mounts[i].Claims(r) {
			mount = &s.cfg.Mounts[i]
			break
		}
	}
	pattern := ""
	if mount == nil {
		_, pattern = s.mux.Handler(r)
	}
	route := pattern
	switch {
	case mount != nil:
		route = mount.Name
	case route == "":
		route = unmatchedRoute
	}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("panic in handler", "method", r.Method, "route", route,
				"panic", v, "stack", string(debug.Stack()))
			if !rec.wroteHeader {
				writeJSON(rec, http.StatusInternalServerError, errorBody{Error: apiError{
					Code: codeInternal, Message: "internal error",
				}})
			}
		}
		status := rec.status
		if status == 0 {
			status = http.StatusOK
		}
		s.metrics.HTTPRequests.WithLabelValues(route, strconv.Itoa(status)).Inc()
		attrs := []any{"method", r.Method, "route", route, "status", status,
			"duration", time.Since(start)}
		if id := r.PathValue("id"); id != "" {
			attrs = append(attrs, "sandbox", id)
		}
		// Agents call the desktop routes hundreds of times a task: successful
		// reads and actions are logged at debug, everything else at info.
		level := slog.LevelInfo
		if status < 400 && (r.Method == http.MethodGet || strings.HasSuffix(route, "/actions")) {
			level = slog.LevelDebug
		}
		s.log.Log(r.Context(), level, "http request", attrs...)
	}()

	if mount != nil {
		if s.clusterMount(rec, r, mount) {
			return
		}
		mount.Handler.ServeHTTP(rec, r)
		s.clusterMountDone(r, mount, rec.status)
		return
	}
	if s.auth[pattern] == authKey && !s.keys.Authorized(r) {
		rec.Header().Set("WWW-Authenticate", `Bearer realm="cubicle"`)
		s.writeError(rec, r, errUnauthorized)
		return
	}
	if pattern == "" {
		s.serveUnmatched(rec, r)
		return
	}
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		r.Body = &progressBody{ReadCloser: r.Body, rc: http.NewResponseController(rec), idle: s.cfg.BodyIdle}
	}
	s.mux.ServeHTTP(rec, r)
}

// progressBody pushes the connection's read deadline forward before every
// read of a request body, so a body may be as large and take as long as it
// needs while it keeps coming, but a client that stops sending (a slow
// loris, a stalled upload) loses the connection after idle instead of
// holding a goroutine, a sandbox slot and a stream to the agent forever.
// The server sets the next request's deadlines itself.
type progressBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
}

func (b *progressBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.idle)) // unsupported writer: no deadline, as before
	return b.ReadCloser.Read(p)
}

// errUnauthorized is the answer to a missing or wrong API key.
var errUnauthorized = &httpError{status: http.StatusUnauthorized, code: codeUnauthorized, msg: apikey.Refused}

// serveUnmatched answers a request that matches no route in the API's error
// shape: 404, or 405 (with Allow) when the path exists with other methods.
// Anything else the mux would do (redirects to a cleaned path) is passed on.
func (s *server) serveUnmatched(w http.ResponseWriter, r *http.Request) {
	buf := &bufferWriter{header: http.Header{}}
	s.mux.ServeHTTP(buf, r)
	switch buf.status {
	case http.StatusNotFound:
		s.writeError(w, r, &httpError{status: http.StatusNotFound, code: codeNotFound,
			msg: "no such endpoint: " + r.Method + " " + r.URL.Path})
	case http.StatusMethodNotAllowed:
		if allow := buf.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		s.writeError(w, r, &httpError{status: http.StatusMethodNotAllowed, code: codeMethodNotAllowed,
			msg: "method " + r.Method + " is not allowed on " + r.URL.Path})
	default:
		for k, v := range buf.header {
			w.Header()[k] = v
		}
		w.WriteHeader(buf.status)
		_, _ = w.Write(buf.body.Bytes())
	}
}

// statusWriter records the status code written through it.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status = code
		w.wroteHeader = code >= 200
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the underlying writer (Flush).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// bufferWriter captures a small response in memory.
type bufferWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferWriter) Header() http.Header { return b.header }
func (b *bufferWriter) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}
func (b *bufferWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// logInternal logs an error whose details must not reach the user.
func (s *server) logInternal(r *http.Request, msg string, err error) {
	attrs := []any{"method", r.Method, "path", r.URL.Path, "err", err}
	if id := r.PathValue("id"); id != "" {
		attrs = append(attrs, "sandbox", id)
	}
	s.log.ErrorContext(r.Context(), msg, attrs...)
}

// limited runs h only while the sandbox has fewer than Config.InFlight's
// bound of requests in progress, and answers 429 otherwise.
func (s *server) limited(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		release, ok := s.cfg.InFlight.Acquire(id)
		if !ok {
			s.metrics.InFlightRefused.Inc()
			w.Header().Set("Retry-After", "1")
			s.writeError(w, r, &httpError{status: http.StatusTooManyRequests, code: codeRateLimited,
				msg: fmt.Sprintf("sandbox %s already has %d requests in progress, its limit; retry when one ends", id, s.cfg.InFlight.Max())})
			return
		}
		defer release()
		h(w, r)
	}
}
