package e2b

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/apikey"
	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// Manager is what the control plane needs of the sandbox manager;
// *sandbox.Manager satisfies it.
type Manager interface {
	// Create starts a sandbox; with wait it returns once it is ready.
	Create(ctx context.Context, req sandbox.CreateRequest, wait bool) (sandbox.Sandbox, error)
	// List returns the sandboxes matching f, stopped ones included.
	List(ctx context.Context, f sandbox.Filter) []sandbox.Sandbox
	// Get returns one sandbox, or an errdefs.ErrNotFound error.
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	// Destroy stops a sandbox and frees what it holds.
	Destroy(ctx context.Context, id string) error
	// SetTimeout sets a running sandbox's expiry to seconds from now
	// (0 = the daemon's maximum, which this package never asks for).
	SetTimeout(ctx context.Context, id string, seconds int) (sandbox.Sandbox, error)
	// Pause saves a running sandbox to disk; Resume brings a paused one
	// back, expiring seconds from then.
	Pause(ctx context.Context, id string) (sandbox.Sandbox, error)
	Resume(ctx context.Context, id string, seconds int) (sandbox.Sandbox, error)
	// Fork copies a running sandbox into count new ones of owner.
	Fork(ctx context.Context, id, owner string, count int) ([]sandbox.Sandbox, error)
	// CreateSnapshot, ListSnapshots and DeleteSnapshot manage owner's
	// snapshots (E2B's snapshot templates).
	CreateSnapshot(ctx context.Context, id, owner, name string, metadata map[string]string) (sandbox.Snapshot, error)
	ListSnapshots(ctx context.Context, owner, sandboxID string) []sandbox.Snapshot
	DeleteSnapshot(ctx context.Context, owner, ref string) error
	// Usage returns a sandbox's resource samples after since (zero:
	// all), for getMetrics.
	Usage(ctx context.Context, id string, since time.Time) (sandbox.Usage, error)
	// Logs returns the lines q selects of what sandbox id printed, live
	// or stopped while it is still listed; errdefs.ErrNotFound for
	// an unknown sandbox or another owner's.
	Logs(ctx context.Context, id, owner string, q consolelog.Query) ([]sandbox.LogEntry, error)
}

// Config configures a Server. Zero values get the defaults noted.
type Config struct {
	// APIKeys are the accepted API keys. E2B's format e2b_<hex> is just a
	// key like any other here. None turns authentication off.
	APIKeys []string
	// TokenKey is the HMAC key of AccessToken (the key file of the view
	// tokens). It must be set: with an empty key the tokens are guessable.
	TokenKey []byte
	// Domain is returned as the sandboxes' "domain" (null when empty), from
	// which the SDKs build https://<port>-<id>.<domain> hosts.
	Domain string
	// Templates maps E2B template IDs and aliases to cubicle templates;
	// default {"desktop": "desktop", "base": "base"}.
	Templates map[string]string
	// EnvdVersion is the envd version claimed for every sandbox; default
	// "0.5.7" (see the package doc for why).
	EnvdVersion string
	// Backend is the cubicle backend to create on ("" = daemon default).
	Backend string
}

// DefaultEnvdVersion is the envd version claimed when Config.EnvdVersion is
// empty.
const DefaultEnvdVersion = "0.5.7"

// Route is one endpoint of the control plane.
type Route struct {
	// Pattern is an http.ServeMux pattern, such as "POST /sandboxes".
	Pattern string
	// Handler serves the route. Unless Open, it checks the API key itself
	// and answers 401 in E2B's error shape, so a route can be mounted on any
	// mux without further middleware.
	Handler http.HandlerFunc
	// Open routes need no API key (GET /health).
	Open bool
}

// Server answers E2B's control-plane API from a Manager. It is safe for
// concurrent use.
type Server struct {
	cfg       Config
	mgr       Manager
	log       *slog.Logger
	keys      *apikey.Set
	templates map[string]string // E2B name → cubicle template
	names     map[string]string // cubicle template → E2B name shown
	now       func() time.Time  // tests replace it
	routes    []Route
	mux       *http.ServeMux
	// elsewhere adds the sandboxes of a cluster's other nodes to lists
	// (SetElsewhere); nil on a single host.
	elsewhere func(*http.Request) []sandbox.Sandbox
}

// WriteError answers err in E2B's error shape ({"code", "message"}),
// with the status E2B gives its kind, for what a proxy in front of the
// control plane refuses on its behalf.
func (s *Server) WriteError(w http.ResponseWriter, r *http.Request, err error) {
	writeError(w, s.log, r, err)
}

// SetElsewhere makes lists (GET /sandboxes, /v2/sandboxes) include the
// sandboxes f returns for a request: in a cluster, the other nodes'.
// Call it before the server serves.
func (s *Server) SetElsewhere(f func(*http.Request) []sandbox.Sandbox) {
	s.elsewhere = f
}

// New returns a Server for mgr. A nil log discards.
func New(cfg Config, mgr Manager, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.EnvdVersion == "" {
		cfg.EnvdVersion = DefaultEnvdVersion
	}
	if len(cfg.Templates) == 0 {
		cfg.Templates = map[string]string{"desktop": "desktop", "base": "base"}
	}
	if len(cfg.TokenKey) == 0 {
		log.Warn("e2b: no token key configured; envd access tokens are guessable")
	}
	s := &Server{
		cfg:       cfg,
		mgr:       mgr,
		log:       log,
		keys:      apikey.New(cfg.APIKeys),
		templates: maps.Clone(cfg.Templates),
		names:     map[string]string{},
		now:       time.Now,
	}
	// Listing shows one E2B name per cubicle template: the identical name
	// if there is one, else the first in sort order, so that it is stable.
	for _, name := range slices.Sorted(maps.Keys(s.templates)) {
		tmpl := s.templates[name]
		if cur, ok := s.names[tmpl]; !ok || (cur != tmpl && name == tmpl) {
			s.names[tmpl] = name
		}
	}
	s.routes = []Route{
		{Pattern: "GET /health", Handler: s.health, Open: true},
		{Pattern: "POST /sandboxes", Handler: s.createV1},
		{Pattern: "POST /v2/sandboxes", Handler: s.createV2},
		{Pattern: "GET /sandboxes", Handler: s.listV1},
		{Pattern: "GET /v2/sandboxes", Handler: s.listV2},
		{Pattern: "GET /sandboxes/{id}", Handler: s.get},
		{Pattern: "DELETE /sandboxes/{id}", Handler: s.kill},
		{Pattern: "POST /sandboxes/{id}/timeout", Handler: s.setTimeout},
		{Pattern: "POST /sandboxes/{id}/connect", Handler: s.connectV1},
		{Pattern: "POST /v2/sandboxes/{id}/connect", Handler: s.connectV2},
		{Pattern: "POST /sandboxes/{id}/pause", Handler: s.pause},
		{Pattern: "POST /sandboxes/{id}/resume", Handler: s.resume},
		{Pattern: "POST /sandboxes/{id}/fork", Handler: s.fork},
		{Pattern: "POST /sandboxes/{id}/snapshots", Handler: s.createSnapshot},
		{Pattern: "GET /snapshots", Handler: s.listSnapshots},
		{Pattern: "DELETE /templates/{templateID}", Handler: s.deleteTemplate},
		{Pattern: "GET /sandboxes/{id}/metrics", Handler: s.metrics},
		{Pattern: "GET /sandboxes/{id}/logs", Handler: s.logsV1},
		{Pattern: "GET /v2/sandboxes/{id}/logs", Handler: s.logsV2},
	}
	s.mux = http.NewServeMux()
	for i := range s.routes {
		r := &s.routes[i]
		if !r.Open {
			r.Handler = s.requireKey(r.Handler)
		}
		s.mux.HandleFunc(r.Pattern, r.Handler)
	}
	return s
}

// Routes returns the control plane's routes, each ready to mount (see
// Route.Handler).
func (s *Server) Routes() []Route {
	return slices.Clone(s.routes)
}

// ServeHTTP serves the routes on one mux, answers unknown paths 404 and
// known paths with another method 405 in E2B's error shape, and turns a
// panic into a 500.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusWriter{ResponseWriter: w}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("e2b: panic in handler", "method", r.Method, "path", r.URL.Path,
				"panic", v, "stack", string(debug.Stack()))
			if !rec.wrote {
				writeJSON(rec, http.StatusInternalServerError,
					errorBody{Code: http.StatusInternalServerError, Message: "internal error"})
			}
		}
	}()
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		// Through the mux, not h: only the mux sets the path values.
		s.mux.ServeHTTP(rec, r)
		return
	}
	// The mux's own answer decides between 404, 405 and a redirect to the
	// cleaned path; only its body is replaced.
	probe := &probeWriter{header: http.Header{}}
	h.ServeHTTP(probe, r)
	switch probe.status {
	case http.StatusNotFound:
		writeError(rec, s.log, r, statusErrorf(http.StatusNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
	case http.StatusMethodNotAllowed:
		if allow := probe.header.Get("Allow"); allow != "" {
			rec.Header().Set("Allow", allow)
		}
		writeError(rec, s.log, r, statusErrorf(http.StatusMethodNotAllowed, "method %s is not allowed on %s", r.Method, r.URL.Path))
	default:
		h.ServeHTTP(rec, r)
	}
}

// requireKey wraps h with the API key check.
func (s *Server) requireKey(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.keys.Authorized(r) {
			writeError(w, s.log, r, statusErrorf(http.StatusUnauthorized, "%s", apikey.Refused))
			return
		}
		h(w, r)
	}
}

// statusWriter remembers whether a response was started, so a panic after
// it does not write a second header.
type statusWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	w.wrote = w.wrote || code >= 200
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// probeWriter takes the mux's answer to an unmatched request and drops it.
type probeWriter struct {
	header http.Header
	status int
}

func (p *probeWriter) Header() http.Header { return p.header }

func (p *probeWriter) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}

func (p *probeWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}

// OwnsPath reports whether p is a path of E2B's control plane, so a daemon
// serving several APIs on one port can give it these requests (with any
// method: a wrong one is answered 405 in E2B's shape, not the native API's).
func OwnsPath(p string) bool {
	return ownsPath(p)
}

// SandboxOfPath is the sandbox a control-plane path is about
// (/sandboxes/ID[/...], /v2/sandboxes/ID/...), "" for none: in cluster
// mode the request is passed to that sandbox's node.
func SandboxOfPath(p string) string {
	rest, ok := strings.CutPrefix(p, "/v2/sandboxes/")
	if !ok {
		if rest, ok = strings.CutPrefix(p, "/sandboxes/"); !ok {
			return ""
		}
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// IsCreate reports whether r creates a sandbox (v1 or v2): in cluster
// mode it is placed on a node like a native create.
func IsCreate(r *http.Request) bool {
	return r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes")
}

// Placeable reports whether a create's body may be placed on any node of
// a cluster: it names a template every node has, and no volumes. A
// snapshot (a templateID that is no template) or volumes stay on the node
// the create reached, where they are; so does a body that does not parse
// (the create refuses it there).
func (s *Server) Placeable(body []byte) bool {
	var in struct {
		TemplateID   *string           `json:"templateID"`
		VolumeMounts []json.RawMessage `json:"volumeMounts"`
	}
	if json.Unmarshal(body, &in) != nil || in.TemplateID == nil || len(in.VolumeMounts) > 0 {
		return false
	}
	_, ok := s.templates[*in.TemplateID]
	return ok
}

func ownsPath(p string) bool {
	return p == "/health" || p == "/sandboxes" || strings.HasPrefix(p, "/sandboxes/") ||
		p == "/v2/sandboxes" || strings.HasPrefix(p, "/v2/sandboxes/") ||
		p == "/snapshots" || strings.HasPrefix(p, "/templates/")
}
