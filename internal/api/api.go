package api

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/apikey"
	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/inflight"
	"github.com/cubicle-dev/cubicle/internal/metrics"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/viewtoken"
)

// Manager is what the API needs of the sandbox manager (internal/sandbox).
// Errors are errdefs kinds; the API maps them to status codes.
type Manager interface {
	// Create creates a sandbox. With wait it returns once the desktop is
	// ready (or failed and was cleaned up); without it at once, "starting".
	Create(ctx context.Context, req sandbox.CreateRequest, wait bool) (sandbox.Sandbox, error)
	// List returns the sandboxes that match f.
	List(ctx context.Context, f sandbox.Filter) []sandbox.Sandbox
	// Get returns one sandbox; errdefs.ErrNotFound for unknown ids.
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	// Destroy stops a sandbox and frees everything it holds.
	Destroy(ctx context.Context, id string) error
	// SetTimeout sets a sandbox's expiry to seconds from now (0 = the
	// daemon's maximum lifetime) and returns the sandbox.
	SetTimeout(ctx context.Context, id string, seconds int) (sandbox.Sandbox, error)
	// Pause saves a running sandbox to disk (state "paused"); Resume
	// brings a paused one back, expiring timeoutSeconds from then (0:
	// with the running time it had left). ErrConflict for a sandbox in
	// another state, ErrNotSupported for a backend that cannot pause.
	Pause(ctx context.Context, id string) (sandbox.Sandbox, error)
	// Fork copies a running sandbox into count new sandboxes of owner.
	Fork(ctx context.Context, id, owner string, count int) ([]sandbox.Sandbox, error)
	Resume(ctx context.Context, id string, timeoutSeconds int) (sandbox.Sandbox, error)
	// Usage returns a sandbox's resource figures: the latest sample and
	// the kept history after since (zero: all). ErrConflict once the
	// sandbox is stopping or gone.
	Usage(ctx context.Context, id string, since time.Time) (sandbox.Usage, error)
	// Logs returns the lines q selects of what sandbox id printed, of a
	// live sandbox or a stopped one still listed; ErrNotFound for an
	// unknown sandbox or one of another owner than owner (KeyOwner of the
	// request's key; "" without keys, which sees every sandbox).
	Logs(ctx context.Context, id, owner string, q consolelog.Query) ([]sandbox.LogEntry, error)
	// Agent returns the agent client of a running sandbox and marks it active
	// (idle timer reset). errdefs.ErrNotFound for unknown ids, ErrConflict
	// when not running.
	Agent(ctx context.Context, id string) (*agentclient.Client, error)
	// Watch returns the agent client of a running sandbox without marking
	// it active, and a channel closed when the sandbox begins to stop.
	Watch(ctx context.Context, id string) (*agentclient.Client, <-chan struct{}, error)
	// Touch marks a sandbox active.
	Touch(ctx context.Context, id string)
	// Backends describes every backend the daemon knows.
	Backends(ctx context.Context) []sandbox.BackendInfo
	// DefaultBackend names the backend used when a request names none.
	DefaultBackend() string
	// Capacity reports the sandbox capacity.
	Capacity() sandbox.Capacity
	// Pools reports the warm pools.
	Pools() []sandbox.PoolInfo

	// CreateVolume, ListVolumes, GetVolume and DeleteVolume manage the
	// volumes of owner (sandbox.KeyOwner of the request's key); another
	// key's volumes are not found.
	CreateVolume(ctx context.Context, owner, name string, sizeMB int) (sandbox.Volume, error)
	ListVolumes(ctx context.Context, owner string) []sandbox.Volume
	GetVolume(ctx context.Context, owner, name string) (sandbox.Volume, error)
	DeleteVolume(ctx context.Context, owner, name string) error

	// CreateSnapshot saves a running sandbox as a snapshot of owner;
	// ListSnapshots (all of owner's, or those of one sandbox),
	// GetSnapshot and DeleteSnapshot (by ID or name) manage them.
	// Another key's snapshots are not found.
	CreateSnapshot(ctx context.Context, id, owner, name string, metadata map[string]string) (sandbox.Snapshot, error)
	ListSnapshots(ctx context.Context, owner, sandboxID string) []sandbox.Snapshot
	GetSnapshot(ctx context.Context, owner, ref string) (sandbox.Snapshot, error)
	DeleteSnapshot(ctx context.Context, owner, ref string) error

	// StartRecording starts recording a running sandbox's screen for
	// owner (one recording per sandbox at a time); StopRecording ends
	// one (of sandboxID when not "") once its file is complete;
	// ListRecordings (all of owner's, or those of one sandbox),
	// GetRecording, OpenRecording (the file, once stopped) and
	// DeleteRecording manage them. Another key's recordings are not
	// found.
	StartRecording(ctx context.Context, id, owner string, req sandbox.RecordingRequest) (sandbox.Recording, error)
	StopRecording(ctx context.Context, owner, sandboxID, id string) (sandbox.Recording, error)
	ListRecordings(ctx context.Context, owner, sandboxID string) []sandbox.Recording
	GetRecording(ctx context.Context, owner, id string) (sandbox.Recording, error)
	OpenRecording(ctx context.Context, owner, id string) (sandbox.Recording, *os.File, error)
	DeleteRecording(ctx context.Context, owner, id string) error
}

// Defaults of Config.
const (
	DefaultMaxBodyBytes   = 1 << 20  // 1 MiB of JSON
	DefaultMaxUploadBytes = 1 << 30  // 1 GiB per uploaded file
	DefaultMaxExecOutput  = 10 << 20 // 10 MiB of stdout+stderr
	DefaultCreateRate     = 5        // creates per second
	DefaultCreateBurst    = 10
	// DefaultMaxInFlight is how many requests to one sandbox may be in
	// progress at once (429 beyond): an agent's screenshot-act loop uses a
	// few; live viewers, file transfers and command streams add some.
	DefaultMaxInFlight = 64
	// DefaultBodyIdle: no legitimate client of the native API pauses
	// half a minute inside a request body.
	DefaultBodyIdle = 30 * time.Second
)

// Config configures the API. Zero values mean the defaults above.
type Config struct {
	// APIKeys are the accepted API keys. With none, auth is off (the daemon
	// refuses to listen on a non-loopback address without keys).
	APIKeys []string
	// Version is reported by GET /v1/info.
	Version string
	// MaxBodyBytes caps JSON request bodies (413 beyond).
	MaxBodyBytes int64
	// MaxUploadBytes caps file uploads (413 beyond).
	MaxUploadBytes int64
	// MaxExecOutput caps the stdout+stderr bytes of one exec.
	MaxExecOutput int
	// CreateRate and CreateBurst limit POST /v1/sandboxes (429 beyond).
	// rate.Inf disables the limit.
	CreateRate  rate.Limit
	CreateBurst int
	// MetricsAuth requires an API key for GET /metrics.
	MetricsAuth bool

	// ViewTokens signs and checks live-view links; nil disables the
	// token-based live view (an API key still opens the WebSocket).
	ViewTokens *viewtoken.Issuer
	// Pages serves the viewer page, the dashboard and their static files;
	// nil answers 404 there.
	Pages Pages
	// PublicURL is the scheme://host[:port] view links point at; empty
	// means the Host the client used.
	PublicURL string
	// ViewOrigins are extra Origin host patterns allowed to open the live
	// view WebSocket (same-origin is always allowed).
	ViewOrigins []string
	// ViewKeepsAlive makes an open live view count as activity for the
	// idle timeout.
	ViewKeepsAlive bool
	// ViewWriteTimeout closes a viewer that cannot take a frame for this
	// long; 0 means 15 s (x11vnc serves its clients from one thread, so
	// one stuck viewer would otherwise stall the others).
	ViewWriteTimeout time.Duration
	// VNCPort is the VNC server's port on the sandbox's loopback.
	VNCPort int
	// Context ends with the daemon: open live views close when it is done.
	Context context.Context
	// BodyIdle is the longest a client may pause while sending a request
	// body (a slow-loris upload is cut off after it); 0 means
	// DefaultBodyIdle.
	BodyIdle time.Duration
	// InFlight bounds the requests in progress per sandbox, shared with
	// the E2B data plane; nil means a limiter of DefaultMaxInFlight.
	InFlight *inflight.Limiter
	// Mounts serve requests outside the native API on the same port (E2B's
	// data and control planes), tried in order before the native routes.
	Mounts []Mount
	// MCP serves POST /mcp (MCP over Streamable HTTP, internal/mcp) once
	// the API key is checked; nil answers 404 there.
	MCP http.Handler
	// Cluster joins this node to a cluster (internal/cluster): creates
	// are placed on any node, a sandbox of another node is served
	// through this one, lists span the cluster. nil on a single host.
	Cluster Cluster
}

// Mount is a handler the daemon also serves on its port. It gets the
// request with recovery, logging and metrics, but does its own auth and
// answers in its own error shape.
type Mount struct {
	// Name labels its requests in logs and metrics.
	Name string
	// Claims reports whether a request is the mount's.
	Claims func(*http.Request) bool
	// Handler serves the mount's requests.
	Handler http.Handler
	// In cluster mode: Sandbox names the sandbox a request is about (""
	// for none), so that one of another node is passed there; Creates
	// reports whether a request creates a sandbox, so that it is placed
	// like a native create.
	Sandbox func(*http.Request) string
	Creates func(*http.Request) bool
	// Placeable reports whether a create's body may go to any node;
	// false keeps it on the node it reached (it names a snapshot or
	// volumes, which stay on their node). nil: always.
	Placeable func(body []byte) bool
	// Refuse answers err in the mount's own error shape, for what the
	// cluster refuses on its behalf (a lost sandbox, an unreadable
	// catalog); nil: the native shape.
	Refuse func(w http.ResponseWriter, r *http.Request, err error)
}

func (c Config) withDefaults() Config {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxUploadBytes <= 0 {
		c.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if c.MaxExecOutput <= 0 {
		c.MaxExecOutput = DefaultMaxExecOutput
	}
	if c.CreateRate <= 0 {
		c.CreateRate = DefaultCreateRate
	}
	if c.BodyIdle <= 0 {
		c.BodyIdle = DefaultBodyIdle
	}
	if c.InFlight == nil {
		c.InFlight = inflight.New(DefaultMaxInFlight)
	}
	if c.CreateBurst <= 0 {
		c.CreateBurst = DefaultCreateBurst
	}
	if c.VNCPort <= 0 {
		c.VNCPort = DefaultVNCPort
	}
	if c.Context == nil {
		c.Context = context.Background()
	}
	return c
}

// server holds the handlers' dependencies.
type server struct {
	cfg     Config
	mgr     Manager
	metrics *metrics.Metrics
	log     *slog.Logger
	keys    *apikey.Set
	create  *rate.Limiter
	mux     *http.ServeMux
	auth    map[string]authMode // by pattern
	// lookups bounds the etcd reads that requests without an API key
	// may cause (cluster mode: an id not in the watched catalog).
	lookups *rate.Limiter
	views   sync.WaitGroup // open live views
}

// authMode is how a route authenticates.
type authMode int

const (
	authKey      authMode = iota // an API key, checked by the middleware
	authOpen                     // nothing
	authKeyOrTok                 // an API key or a view token, checked by the handler
)

// route is one registered endpoint.
type route struct {
	pattern string // ServeMux pattern: "METHOD /path"
	handler http.HandlerFunc
	auth    authMode
	page    bool // a browser page or file, not part of the REST API (no OpenAPI entry)
	// agent marks a route that holds a stream to the sandbox's agent for
	// its duration; it counts against Config.InFlight.
	agent bool
}

// routes is the route table: every endpoint of the API, registered from
// here, checked against the OpenAPI document and the auth tests.
func (s *server) routes() []route {
	return []route{
		{pattern: "GET /healthz", handler: s.health, auth: authOpen},
		{pattern: "GET /metrics", handler: s.metricsHandler(), auth: metricsAuth(s.cfg.MetricsAuth)},
		{pattern: "GET /v1/info", handler: s.info},
		{pattern: "GET /v1/openapi.json", handler: s.openAPI},

		{pattern: "POST /v1/sandboxes", handler: s.createSandbox},
		{pattern: "GET /v1/sandboxes", handler: s.listSandboxes},
		{pattern: "GET /v1/sandboxes/{id}", handler: s.getSandbox},
		{pattern: "DELETE /v1/sandboxes/{id}", handler: s.deleteSandbox},
		{pattern: "POST /v1/sandboxes/{id}/timeout", handler: s.setTimeout},
		{pattern: "POST /v1/sandboxes/{id}/pause", handler: s.pauseSandbox},
		{pattern: "POST /v1/sandboxes/{id}/resume", handler: s.resumeSandbox},
		{pattern: "POST /v1/sandboxes/{id}/fork", handler: s.forkSandbox},
		{pattern: "GET /v1/sandboxes/{id}/metrics", handler: s.sandboxMetrics},
		{pattern: "GET /v1/sandboxes/{id}/logs", handler: s.sandboxLogs},

		{pattern: "POST /v1/volumes", handler: s.createVolume},
		{pattern: "GET /v1/volumes", handler: s.listVolumes},
		{pattern: "GET /v1/volumes/{name}", handler: s.getVolume},
		{pattern: "DELETE /v1/volumes/{name}", handler: s.deleteVolume},

		{pattern: "POST /v1/sandboxes/{id}/snapshots", handler: s.createSnapshot},
		{pattern: "GET /v1/snapshots", handler: s.listSnapshots},
		{pattern: "GET /v1/snapshots/{snapshot}", handler: s.getSnapshot},
		{pattern: "DELETE /v1/snapshots/{snapshot}", handler: s.deleteSnapshot},

		{pattern: "POST /v1/sandboxes/{id}/recordings", handler: s.startRecording},
		{pattern: "GET /v1/sandboxes/{id}/recordings", handler: s.listSandboxRecordings},
		{pattern: "POST /v1/sandboxes/{id}/recordings/{recording}/stop", handler: s.stopRecording},
		{pattern: "GET /v1/recordings", handler: s.listRecordings},
		{pattern: "GET /v1/recordings/{recording}", handler: s.getRecording},
		{pattern: "GET /v1/recordings/{recording}/file", handler: s.recordingFile},
		{pattern: "DELETE /v1/recordings/{recording}", handler: s.deleteRecording},

		{pattern: "GET /v1/sandboxes/{id}/screenshot", handler: s.screenshot, agent: true},
		{pattern: "POST /v1/sandboxes/{id}/actions", handler: s.actions, agent: true},
		{pattern: "POST /v1/sandboxes/{id}/computer/anthropic", handler: s.computerAnthropic, agent: true},
		{pattern: "POST /v1/sandboxes/{id}/computer/openai", handler: s.computerOpenAI, agent: true},

		{pattern: "POST /v1/sandboxes/{id}/exec", handler: s.exec, agent: true},
		{pattern: "PUT /v1/sandboxes/{id}/files", handler: s.putFile, agent: true},
		{pattern: "GET /v1/sandboxes/{id}/files", handler: s.getFile, agent: true},
		{pattern: "DELETE /v1/sandboxes/{id}/files", handler: s.deleteFile, agent: true},
		{pattern: "GET /v1/sandboxes/{id}/files/list", handler: s.listFiles, agent: true},

		{pattern: "POST /mcp", handler: s.mcp},

		{pattern: "POST /v1/sandboxes/{id}/view", handler: s.createView},
		{pattern: "GET /v1/sandboxes/{id}/vnc", handler: s.vnc, auth: authKeyOrTok, agent: true},
		{pattern: "GET /v1/sandboxes/{id}/cdp", handler: s.cdp, auth: authKeyOrTok, agent: true},
		{pattern: "GET /v1/sandboxes/{id}/cdp/json/version", handler: s.cdpJSONVersion, auth: authKeyOrTok, agent: true},
		{pattern: "GET /v1/sandboxes/{id}/cdp/json/version/", handler: s.cdpJSONVersion, auth: authKeyOrTok, agent: true},
		{pattern: "GET /view/{id}", handler: s.viewPage, auth: authKeyOrTok},
		{pattern: "GET /{$}", handler: s.dashboard, auth: authOpen, page: true},
		{pattern: "GET /static/", handler: s.static, auth: authOpen, page: true},
	}
}

// mcp hands an authenticated request to the MCP server.
func (s *server) mcp(w http.ResponseWriter, r *http.Request) {
	if s.cfg.MCP == nil {
		s.writeError(w, r, &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "this daemon serves no MCP endpoint"})
		return
	}
	s.cfg.MCP.ServeHTTP(w, r)
}

func metricsAuth(required bool) authMode {
	if required {
		return authKey
	}
	return authOpen
}

// Server is the API's handler.
type Server struct{ s *server }

// New returns the API's handler. m and log may be nil (fresh metrics, the
// default logger).
func New(cfg Config, mgr Manager, m *metrics.Metrics, log *slog.Logger) *Server {
	return &Server{s: newServer(cfg, mgr, m, log)}
}

// RouteInfo is one endpoint of the native API and what it takes to use it.
type RouteInfo struct {
	Pattern string // ServeMux pattern: "METHOD /path", {id} for a sandbox
	// Auth is "key" (an API key), "open" (nothing) or "key-or-token" (an
	// API key or a live-view token for the sandbox).
	Auth string
}

// Routes lists every endpoint of the native API, from the same table that
// registers them, so that tests (the security suite) cover each one.
func (h *Server) Routes() []RouteInfo {
	var out []RouteInfo
	for _, rt := range h.s.routes() {
		auth := map[authMode]string{authKey: "key", authOpen: "open", authKeyOrTok: "key-or-token"}[rt.auth]
		out = append(out, RouteInfo{Pattern: rt.pattern, Auth: auth})
	}
	return out
}

// ServeHTTP serves the API.
func (h *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.s.ServeHTTP(w, r) }

// WaitViews waits until every live view has closed or ctx ends. Live views
// are hijacked connections, which http.Server.Shutdown does not wait for;
// after Config.Context ends they close with "going away", and waiting lets
// that close frame reach the viewers before the process exits.
func (h *Server) WaitViews(ctx context.Context) error {
	done := make(chan struct{})
	go func() { h.s.views.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func newServer(cfg Config, mgr Manager, m *metrics.Metrics, log *slog.Logger) *server {
	if m == nil {
		m = metrics.New()
	}
	if log == nil {
		log = slog.Default()
	}
	cfg = cfg.withDefaults()
	s := &server{
		cfg:     cfg,
		mgr:     mgr,
		metrics: m,
		log:     log,
		keys:    apikey.New(cfg.APIKeys),
		create:  rate.NewLimiter(cfg.CreateRate, cfg.CreateBurst),
		mux:     http.NewServeMux(),
		auth:    map[string]authMode{},
		lookups: rate.NewLimiter(20, 20),
	}
	for _, rt := range s.routes() {
		h := rt.handler
		if rt.agent {
			h = s.limited(h)
		}
		if strings.Contains(rt.pattern, "{id}") {
			h = s.clustered(h)
		} else if item := s.itemOf(rt.pattern); item != nil {
			h = s.clusteredItem(h, item)
		}
		s.mux.HandleFunc(rt.pattern, h)
		s.auth[rt.pattern] = rt.auth
	}
	return s
}

func (s *server) metricsHandler() http.HandlerFunc {
	h := promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{})
	return h.ServeHTTP
}
