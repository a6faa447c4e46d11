package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) createV1(w http.ResponseWriter, r *http.Request) {
	s.create(w, r, v1DefaultTimeout)
}

func (s *Server) createV2(w http.ResponseWriter, r *http.Request) {
	s.create(w, r, v2DefaultTimeout)
}

// create answers POST /sandboxes and POST /v2/sandboxes once the sandbox is
// ready: the SDKs start using envd as soon as create returns.
func (s *Server) create(w http.ResponseWriter, r *http.Request, defaultTimeout int) {
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	p, err := s.parseNewSandbox(body, defaultTimeout)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	p.req.Owner = s.keys.Owner(r)
	sb, err := s.mgr.Create(r.Context(), p.req, true)
	if p.fromSnapshot() && errors.Is(err, errdefs.ErrNotFound) {
		err = s.unknownTemplate(p.template)
	}
	if p.fromSnapshot() && errors.Is(err, errdefs.ErrInvalid) {
		err = inE2BWords(err) // env → envVars
	}
	if err != nil {
		writeError(w, s.log, r, fmt.Errorf("create sandbox from template %s: %w", p.template, err))
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxBody(sb, p.template))
}

// lookup returns the live sandbox named by the path, or answers 404 (or the
// manager's error) and reports false.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (sandbox.Sandbox, bool) {
	id := r.PathValue("id")
	if !sandboxID.MatchString(id) {
		writeError(w, s.log, r, notFound(truncate(id, maxIDBytes)))
		return sandbox.Sandbox{}, false
	}
	sb, err := s.mgr.Get(r.Context(), id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		writeError(w, s.log, r, notFound(id))
		return sandbox.Sandbox{}, false
	case err != nil:
		writeError(w, s.log, r, fmt.Errorf("get sandbox %s: %w", id, err))
		return sandbox.Sandbox{}, false
	case !live(sb.State):
		writeError(w, s.log, r, notFound(id))
		return sandbox.Sandbox{}, false
	}
	return sb, true
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, s.detail(sb))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if err := s.mgr.Destroy(r.Context(), sb.ID); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = notFound(sb.ID)
		}
		writeError(w, s.log, r, fmt.Errorf("destroy sandbox %s: %w", sb.ID, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	seconds, err := parseTimeoutBody(body, true, 0)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if _, err := s.extend(r, sb.ID, seconds); err != nil {
		writeError(w, s.log, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend sets a sandbox's expiry to seconds from now. A sandbox that stopped
// since it was looked up is 404, as if the lookup had seen it stopped.
func (s *Server) extend(r *http.Request, id string, seconds int) (sandbox.Sandbox, error) {
	sb, err := s.mgr.SetTimeout(r.Context(), id, seconds)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrConflict) {
		return sandbox.Sandbox{}, notFound(id)
	}
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("set timeout of sandbox %s: %w", id, err)
	}
	return sb, nil
}

func (s *Server) connectV1(w http.ResponseWriter, r *http.Request) {
	s.connect(w, r, true)
}

func (s *Server) connectV2(w http.ResponseWriter, r *http.Request) {
	s.connect(w, r, false)
}

// connect answers 200 with the sandbox of a running one, extending its
// expiry when the requested timeout reaches further (E2B only extends on
// connect), and 201 with a paused one it resumed, expiring timeout from
// then.
func (s *Server) connect(w http.ResponseWriter, r *http.Request, required bool) {
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	seconds, err := parseTimeoutBody(body, required, v2DefaultTimeout)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if paused(sb.State) {
		if sb, err = s.resumeSandbox(r, sb.ID, seconds); err != nil {
			writeError(w, s.log, r, err)
			return
		}
		writeJSON(w, http.StatusCreated, s.sandboxBody(sb, ""))
		return
	}
	if !sb.ExpiresAt.IsZero() && s.now().Add(secondsDuration(seconds)).After(sb.ExpiresAt) {
		if sb, err = s.extend(r, sb.ID, seconds); err != nil {
			writeError(w, s.log, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, s.sandboxBody(sb, ""))
}

// resumeSandbox resumes a paused sandbox to expire seconds from now. One
// that is resuming already is waited for (the manager's resume refuses
// it; the caller only wants it running).
func (s *Server) resumeSandbox(r *http.Request, id string, seconds int) (sandbox.Sandbox, error) {
	sb, err := s.mgr.Resume(r.Context(), id, seconds)
	if errors.Is(err, errdefs.ErrNotFound) {
		return sandbox.Sandbox{}, notFound(id)
	}
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return sb, nil
}

// pause answers 204 once a running sandbox is paused, and 409 for one
// that is paused already (the SDK's pause() returns false then).
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	if err := parsePauseBody(body); err != nil {
		writeError(w, s.log, r, err)
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if paused(sb.State) {
		writeError(w, s.log, r, statusErrorf(http.StatusConflict, "sandbox %q is already paused", sb.ID))
		return
	}
	if _, err := s.mgr.Pause(r.Context(), sb.ID); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = notFound(sb.ID)
		}
		writeError(w, s.log, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkResult is one element of fork's answer: a running fork, or why
// one could not be made (E2B answers one element per fork asked for).
type forkResult struct {
	Sandbox *sandboxBody `json:"sandbox,omitempty"`
	Error   *forkError   `json:"error,omitempty"`
}

type forkError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// fork answers 201 with the forks of a running sandbox, each with its
// own envd token; with a timeout, each expires that long from now.
// cubicle makes all of them or none, so a failure is the whole answer's.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	seconds, count, err := parseForkBody(body)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	forks, err := s.mgr.Fork(r.Context(), sb.ID, s.keys.Owner(r), count)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = notFound(sb.ID)
		}
		writeError(w, s.log, r, err)
		return
	}
	out := make([]forkResult, len(forks))
	for i, f := range forks {
		if seconds > 0 {
			ext, err := s.extend(r, f.ID, seconds)
			if err != nil {
				// Its caller would not learn its ID: it goes.
				if derr := s.mgr.Destroy(r.Context(), f.ID); derr != nil {
					s.log.Warn("e2b: destroy a fork whose timeout could not be set", "sandbox", f.ID, "err", derr)
				}
				out[i] = forkResult{Error: &forkError{Code: http.StatusInternalServerError, Message: err.Error()}}
				continue
			}
			f = ext
		}
		b := s.sandboxBody(f, "")
		out[i] = forkResult{Sandbox: &b}
	}
	writeJSON(w, http.StatusCreated, out)
}

// resume is the deprecated resume: 201 with the sandbox of a paused one
// it resumed, 409 for one already running.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	seconds, err := parseTimeoutBody(body, false, v1DefaultResumeTimeout)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if !paused(sb.State) {
		writeError(w, s.log, r, statusErrorf(http.StatusConflict, "sandbox %q is already running", sb.ID))
		return
	}
	if sb, err = s.resumeSandbox(r, sb.ID, seconds); err != nil {
		writeError(w, s.log, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxBody(sb, ""))
}

// listV1 answers the deprecated GET /sandboxes: every running sandbox,
// newest first, filtered by metadata only.
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	md, err := parseMetadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	sbs := s.running(r, listQuery{metadata: md, running: true, paused: true})
	out := make([]listedSandbox, len(sbs))
	for i, sb := range sbs {
		out[i] = s.listed(sb)
	}
	writeJSON(w, http.StatusOK, out)
}

// listV2 answers GET /v2/sandboxes, a page at a time: X-Next-Token carries
// the token of the next page when there is one, X-Total-Running the number
// of running sandboxes that match the filters on all pages.
func (s *Server) listV2(w http.ResponseWriter, r *http.Request) {
	q, err := parseListQuery(r.URL.Query())
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	out := []listedSandbox{}
	sbs := s.running(r, q)
	w.Header().Set("X-Total-Running", strconv.Itoa(len(sbs)-countFunc(sbs, func(sb sandbox.Sandbox) bool { return paused(sb.State) })))
	if q.after != nil {
		c := sandbox.Sandbox{ID: q.after.id, CreatedAt: q.after.created}
		sbs = slices.DeleteFunc(sbs, func(sb sandbox.Sandbox) bool { return compareListed(sb, c, q.asc) <= 0 })
	}
	if len(sbs) > q.limit {
		sbs = sbs[:q.limit]
		w.Header().Set("X-Next-Token", encodeCursor(sbs[len(sbs)-1]))
	}
	for _, sb := range sbs {
		out = append(out, s.listed(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

// running returns the live sandboxes that match q's filters, in q's order.
func (s *Server) running(r *http.Request, q listQuery) []sandbox.Sandbox {
	all := s.mgr.List(r.Context(), sandbox.Filter{Metadata: q.metadata})
	if s.elsewhere != nil {
		all = append(all, s.elsewhere(r)...)
	}
	want := q.template
	if t, ok := s.templates[want]; ok {
		want = t
	}
	return slices.SortedFunc(func(yield func(sandbox.Sandbox) bool) {
		for _, sb := range all {
			if !live(sb.State) || !hasMetadata(sb, q.metadata) ||
				paused(sb.State) && !q.paused || !paused(sb.State) && !q.running ||
				want != "" && sb.Template != want ||
				!q.startedAfter.IsZero() && sb.CreatedAt.Before(q.startedAfter) {
				continue
			}
			if !yield(sb) {
				return
			}
		}
	}, func(a, b sandbox.Sandbox) int { return compareListed(a, b, q.asc) })
}

// hasMetadata reports whether sb has every key of md with its value. The
// manager already filtered, but it reads a missing key as an empty value,
// and E2B requires the key to be there.
func hasMetadata(sb sandbox.Sandbox, md map[string]string) bool {
	for k, v := range md {
		if got, ok := sb.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// compareListed orders a listing: by creation time, newest first unless
// asc, then by ID so that equal times still have one order to page through.
func compareListed(a, b sandbox.Sandbox, asc bool) int {
	c := a.CreatedAt.Compare(b.CreatedAt)
	if !asc {
		c = -c
	}
	if c != 0 {
		return c
	}
	switch {
	case a.ID < b.ID:
		return -1
	case a.ID > b.ID:
		return 1
	}
	return 0
}

// countFunc counts the elements of s for which f is true.
func countFunc[T any](s []T, f func(T) bool) int {
	n := 0
	for _, v := range s {
		if f(v) {
			n++
		}
	}
	return n
}
