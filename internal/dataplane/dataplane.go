// Package dataplane carries E2B's data plane to cubicle sandboxes: the
// requests E2B's SDKs send to envd (the in-sandbox daemon), and HTTP or
// WebSocket traffic to any other port a sandbox listens on.
//
// A request is for a sandbox when it carries E2B's routing headers
// (E2b-Sandbox-Id, E2b-Sandbox-Port), which the SDKs send to E2B_SANDBOX_URL,
// or when its Host is "<port>-<sandbox id>.<domain>", which is what
// sandbox.getHost(port) and the Desktop stream URL use. Port 49983 (envd's)
// goes to the sandbox's agent, whose process and filesystem services and
// /files endpoint are wire-compatible with envd; every other port goes
// through the agent's /forward stream to that port on the sandbox's
// loopback. Either way the daemon reaches the sandbox over the agent channel
// it already has, so no sandbox port is ever published on the host.
//
// Both are plain net/http/httputil reverse proxies over the agent client's
// transport: they already handle streaming responses (Connect server
// streams), request bodies of any size and WebSocket upgrades, which a
// hand-written copier would have to get right again.
//
// envd traffic must carry the sandbox's access token (X-Access-Token, see
// e2b.AccessToken); other ports are open to whoever knows the sandbox id,
// as E2B's are when a sandbox allows public traffic, except ReservedPorts
// (cubicled's own x11vnc and Chromium DevTools), which are refused.
package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/e2b"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/inflight"
)

// EnvdPort is envd's port, the one E2B's SDKs address envd at.
const EnvdPort = 49983

// ReservedPorts are the sandbox-loopback services of cubicled itself,
// which the data plane does not open to whoever knows a sandbox id: the
// desktop's x11vnc (api.DefaultVNCPort) and Chromium's DevTools
// (api.DefaultCDPPort). Each one controls the desktop or the browser; the
// native API serves them behind an API key or a view token (/vnc, /cdp).
var ReservedPorts = []int{5999, 9222}

// Routing and auth headers of E2B's data plane.
const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
	headerAccessToken = "X-Access-Token"
)

// Agents gives the agent client of a running sandbox (and marks it active:
// data-plane use is use).
type Agents interface {
	Agent(ctx context.Context, id string) (*agentclient.Client, error)
}

// Config configures a Router.
type Config struct {
	// TokenKey is the key of e2b.AccessToken.
	TokenKey []byte
	// Domain enables host-based routing of "<port>-<id>.<Domain>"; empty
	// means header routing only.
	Domain string
	// DefaultUser runs envd requests that name no user (HTTP Basic);
	// default "user", the account E2B's templates run as and cubicle's
	// desktop image has. E2B's SDKs name a user only when asked to.
	DefaultUser string
	// InFlight bounds the requests in progress per sandbox, shared with
	// the native API (429 beyond); nil means no bound.
	InFlight *inflight.Limiter
}

// Router sends data-plane requests to sandboxes.
type Router struct {
	cfg    Config
	agents Agents
	log    *slog.Logger
}

// New returns a Router. log may be nil.
func New(cfg Config, agents Agents, log *slog.Logger) *Router {
	if log == nil {
		log = slog.Default()
	}
	cfg.Domain = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(cfg.Domain, "."), "."))
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "user"
	}
	return &Router{cfg: cfg, agents: agents, log: log}
}

// Target is a sandbox and a port a request is for.
type Target struct {
	ID   string
	Port int
}

// Match reports whether r is data-plane traffic and for which sandbox and
// port. Headers win over the host, as in E2B's client proxy.
func (rt *Router) Match(r *http.Request) (Target, bool) {
	if id := r.Header.Get(headerSandboxID); id != "" {
		port := EnvdPort
		if p := r.Header.Get(headerSandboxPort); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				return Target{ID: id}, true // answered 400 by ServeHTTP
			}
			port = n
		}
		return Target{ID: id, Port: port}, true
	}
	if rt.cfg.Domain == "" {
		return Target{}, false
	}
	return parseHost(r.Host, rt.cfg.Domain)
}

// parseHost parses "<port>-<id>.<domain>[:listen port]".
func parseHost(host, domain string) (Target, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(host)
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || strings.Contains(label, ".") {
		return Target{}, false
	}
	p, id, ok := strings.Cut(label, "-")
	if !ok || id == "" {
		return Target{}, false
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return Target{}, false
	}
	return Target{ID: id, Port: port}, true
}

// envdPaths are what the data plane passes to the agent: envd's process
// and filesystem services, its file transfer and health endpoints. The
// agent's own desktop service and /forward stay private to the daemon.
func envdPath(p string) bool {
	return strings.HasPrefix(p, "/process.Process/") || strings.HasPrefix(p, "/filesystem.Filesystem/") ||
		p == "/files" || p == "/health"
}

// checkSignedFileURL checks a request to envd's /files that carries a
// signature in place of the access token: GET is the read operation, POST
// the write (of a named path), and each parameter the signature covers
// appears once, so the agent acts on exactly what was signed. The caller
// drops the request's Authorization, the other way to name a user.
func (rt *Router) checkSignedFileURL(r *http.Request, id string) error {
	q := r.URL.Query()
	for _, k := range []string{"path", "username", "signature", "signature_expiration"} {
		if len(q[k]) > 1 {
			return fmt.Errorf("signed URL: %s given %d times", k, len(q[k]))
		}
	}
	var op string
	switch r.Method {
	case http.MethodGet:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		return fmt.Errorf("signed URL: %s is neither a download (GET) nor an upload (POST)", r.Method)
	}
	if op == "write" && q.Get("path") == "" {
		// Without a path the upload's own file name (any path) would
		// decide where it goes, which the signature does not cover.
		return errors.New("signed URL: an upload link must name its file (uploadUrl(path))")
	}
	if err := e2b.CheckFileSignature(rt.cfg.TokenKey, id, q.Get("path"), op, q.Get("username"),
		q.Get("signature"), q.Get("signature_expiration"), time.Now()); err != nil {
		return fmt.Errorf("signed URL: %w", err)
	}
	return nil
}

// ServeHTTP proxies a request Match accepted.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, ok := rt.Match(r)
	if !ok {
		writeError(w, http.StatusNotFound, "not a sandbox request")
		return
	}
	if t.Port == 0 {
		writeError(w, http.StatusBadRequest, "E2b-Sandbox-Port must be a port number")
		return
	}
	if slices.Contains(ReservedPorts, t.Port) {
		writeError(w, http.StatusForbidden, fmt.Sprintf("port %d is cubicle's own (live view or DevTools); use the native API's /v1/sandboxes/%s/vnc or /cdp", t.Port, t.ID))
		return
	}
	if t.Port == EnvdPort {
		if !envdPath(r.URL.Path) {
			writeError(w, http.StatusNotFound, "no such envd endpoint: "+r.URL.Path)
			return
		}
		// /health answers without a token (E2B's isRunning probes it); a
		// signed file URL (downloadUrl, uploadUrl) carries a signature
		// of what it allows instead.
		switch {
		case r.URL.Path == "/health":
		case r.Header.Get(headerAccessToken) == "" && r.URL.Path == "/files" && r.URL.Query().Has("signature"):
			if err := rt.checkSignedFileURL(r, t.ID); err != nil {
				writeError(w, http.StatusUnauthorized, err.Error())
				return
			}
			// The signature names the user (username, or "" for the
			// default one); a header must not pick another.
			r.Header.Del("Authorization")
		case !e2b.AccessTokenOK(rt.cfg.TokenKey, t.ID, r.Header.Get(headerAccessToken)):
			writeError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token for sandbox "+t.ID)
			return
		}
	}
	if rt.cfg.InFlight != nil {
		release, ok := rt.cfg.InFlight.Acquire(t.ID)
		if !ok {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusTooManyRequests, fmt.Sprintf("sandbox %s already has %d requests in progress, its limit", t.ID, rt.cfg.InFlight.Max()))
			return
		}
		defer release()
	}
	agent, err := rt.agents.Agent(r.Context(), t.ID)
	if err != nil {
		rt.agentError(w, r, t, err)
		return
	}
	// The proxy sends the agent's response headers before it has finished
	// sending the request body (FlushInterval -1, for Connect streams).
	// Without full duplex, Go's HTTP/1 server then closes the request body
	// under the transport, which tears down the agent connection mid-stream:
	// 1–4 % of the SDK's commands were cut off ("[unknown] terminated").
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		rt.log.Debug("data plane: no full duplex", "err", err)
	}
	if t.Port == EnvdPort {
		rt.envdProxy(agent).ServeHTTP(w, r)
		return
	}
	rt.portProxy(agent, t).ServeHTTP(w, r)
}

// agentError answers a sandbox that cannot be reached. E2B's SDK reads 502
// from the data plane as "sandbox not running".
func (rt *Router) agentError(w http.ResponseWriter, r *http.Request, t Target, err error) {
	switch {
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict):
		writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s is not running", t.ID))
	default:
		rt.log.Error("data plane: agent", "sandbox", t.ID, "err", err)
		writeError(w, http.StatusBadGateway, "sandbox unreachable")
	}
}

// envdProxy forwards to the agent's HTTP handler over its channel.
func (rt *Router) envdProxy(agent *agentclient.Client) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "agent"
			pr.Out.Host = "agent"
			for _, h := range []string{headerSandboxID, headerSandboxPort, headerAccessToken, "X-Forwarded-For", "Forwarded"} {
				pr.Out.Header.Del(h)
			}
			if pr.Out.Header.Get("Authorization") == "" {
				pr.Out.SetBasicAuth(rt.cfg.DefaultUser, "")
			}
		},
		Transport:     agent.HTTP.Transport,
		FlushInterval: -1, // Connect server streams: every event at once
		ErrorHandler:  rt.proxyError,
	}
}

// portProxy forwards HTTP (and WebSocket upgrades) to a port on the
// sandbox's loopback through the agent's /forward stream.
func (rt *Router) portProxy(agent *agentclient.Client, t Target) *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			s, err := agent.Forward(ctx, t.Port)
			if err != nil {
				return nil, err
			}
			return streamConn{ReadWriteCloser: s}, nil
		},
		DisableKeepAlives:     true, // one stream per request: nothing to pool across a sandbox's lifetime
		ResponseHeaderTimeout: 60 * time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(t.Port))
			// The guest sees the Host the client used (a web app may
			// build links from it).
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(headerSandboxID)
			pr.Out.Header.Del(headerSandboxPort)
			pr.SetXForwarded()
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler:  rt.proxyError,
	}
}

// proxyError answers a failed forward in E2B's error shape.
func (rt *Router) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	var se *agentclient.StatusError
	switch {
	case errors.As(err, &se) && se.Code == http.StatusBadGateway:
		writeError(w, http.StatusBadGateway, "nothing listens on that port in the sandbox")
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads the answer.
		w.WriteHeader(499)
	default:
		rt.log.Warn("data plane: proxy", "path", r.URL.Path, "err", err)
		writeError(w, http.StatusBadGateway, "sandbox unreachable")
	}
}

// writeError writes E2B's error shape, which envd and the client proxy use.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// streamConn makes the agent's forward stream a net.Conn for
// http.Transport; deadlines are not supported (the transport's own
// timeouts and the request context bound it).
type streamConn struct{ io.ReadWriteCloser }

func (streamConn) LocalAddr() net.Addr                { return dummyAddr{} }
func (streamConn) RemoteAddr() net.Addr               { return dummyAddr{} }
func (streamConn) SetDeadline(t time.Time) error      { return nil }
func (streamConn) SetReadDeadline(t time.Time) error  { return nil }
func (streamConn) SetWriteDeadline(t time.Time) error { return nil }

type dummyAddr struct{}

func (dummyAddr) Network() string { return "agent" }
func (dummyAddr) String() string  { return "agent" }
