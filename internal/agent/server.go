// Package agent is the server side of cubicle-agent, the program that runs
// inside every sandbox: one HTTP handler serving the desktop, process and
// filesystem Connect RPC services (process and filesystem wire-compatible
// with E2B's envd, so the E2B data plane is a plain forward), envd's REST
// /files endpoint, /health and /forward (a byte stream to a port on the
// sandbox's loopback), behind the per-sandbox token check. It serves
// HTTP/1.1 and cleartext HTTP/2 on a unix socket and optionally TCP.
//
// Only cmd/cubicle-agent imports it. It must stay free of cgo and of the
// daemon's packages (see deps_test.go).
package agent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agent/filesystem"
	"github.com/cubicle-dev/cubicle/internal/agent/process"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	dpb "github.com/cubicle-dev/cubicle/proto/desktop"
	"github.com/cubicle-dev/cubicle/proto/desktop/desktopconnect"
	"github.com/cubicle-dev/cubicle/proto/filesystem/filesystemconnect"
	"github.com/cubicle-dev/cubicle/proto/process/processconnect"
)

const (
	// TokenHeader carries the per-sandbox agent token on every request.
	TokenHeader = "X-Cubicle-Token"
	// TokenEnv is the environment variable the daemon passes the token in.
	TokenEnv = "CUBICLE_AGENT_TOKEN"
	// VersionHeader is set on every response to the agent's version.
	VersionHeader = "X-Cubicle-Agent-Version"
)

// ErrNoToken means the server was configured without a token and without
// Insecure.
var ErrNoToken = errors.New("agent: no token configured (set " + TokenEnv + " or use --insecure)")

// TokenFromEnv returns the token from CUBICLE_AGENT_TOKEN and removes the
// variable from the environment, so no child process ever inherits it.
func TokenFromEnv() string {
	t := os.Getenv(TokenEnv)
	_ = os.Unsetenv(TokenEnv)
	return t
}

// PoolEnv, set to "1", says the box was booted for the warm pool: the
// agent holds the session's start-URL programs and takes its session
// later, through Desktop.ApplySession.
const PoolEnv = "CUBICLE_POOLED"

// PooledFromEnv reports PoolEnv and removes it from the environment, so
// that no process of the sandbox's user sees it.
func PooledFromEnv() bool {
	v := os.Getenv(PoolEnv)
	_ = os.Unsetenv(PoolEnv)
	return v == "1"
}

// TemplateEnv, set to "1", says the box is booted to be a boot template:
// cubicled snapshots it once its desktop is usable, and every sandbox
// restored from it takes its session through Desktop.ApplySession, as a
// warm-pool box does, except that nothing was held: the browser already
// runs, and is pointed at the create's start URL.
const TemplateEnv = "CUBICLE_TEMPLATE"

// TemplateFromEnv reports TemplateEnv and removes it from the
// environment.
func TemplateFromEnv() bool {
	v := os.Getenv(TemplateEnv)
	_ = os.Unsetenv(TemplateEnv)
	return v == "1"
}

// DevToolsEnv, set to "0" in a sandbox's environment at create, turns off
// Chromium's DevTools on the sandbox's loopback, which cubicled's CDP
// endpoint reaches. It is on otherwise: the pinned runsc saves a
// listening socket across a pause (Debian's of 2022 did not, and DevTools
// was off by default then).
const DevToolsEnv = "CUBICLE_DEVTOOLS"

// DevToolsFromEnv reports whether DevTools is on (DevToolsEnv is not "0")
// and removes the variable from the environment.
func DevToolsFromEnv() bool {
	v := os.Getenv(DevToolsEnv)
	_ = os.Unsetenv(DevToolsEnv)
	return v != "0"
}

// Options configure a Server.
type Options struct {
	// Token is the secret every request must carry in X-Cubicle-Token.
	Token string
	// Insecure allows an empty Token, which then accepts every request
	// (tests only).
	Insecure bool
	// Version is reported in X-Cubicle-Agent-Version.
	Version string
	// Reaper owns child exit statuses. Required.
	Reaper *reap.Reaper
	// Env is the sandbox's default environment for processes; the token
	// must already be gone from it.
	Env []string
	// Display is the default DISPLAY of processes (":0").
	Display string
	// DefaultUser is the user of requests that name none ("" = root).
	DefaultUser string
	// Desktop serves desktop.Desktop; nil answers Unimplemented.
	Desktop desktopconnect.DesktopHandler
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Server is the agent's HTTP server. Create it with New.
type Server struct {
	opts    Options
	log     *slog.Logger
	handler http.Handler

	// Process is the process service (exposed for shutdown).
	Process *process.Service
	// Files is the file service.
	Files *filesystem.Service

	token *secret // what every request must carry; SetToken changes it

	mu      sync.Mutex
	servers []*http.Server
	detach  func() // see OnCheckpoint
	demand  Demand // see SetDemand
}

// New builds the server. It fails with ErrNoToken when Token is empty and
// Insecure is false.
func New(opts Options) (*Server, error) {
	if opts.Token == "" && !opts.Insecure {
		return nil, ErrNoToken
	}
	if opts.Reaper == nil {
		return nil, errors.New("agent: no reaper")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{opts: opts, log: opts.Logger}
	s.Process = process.New(process.Options{
		Reaper: opts.Reaper, Env: opts.Env, Display: opts.Display,
		DefaultUser: opts.DefaultUser, Logger: opts.Logger,
	})
	s.Files = filesystem.New(filesystem.Options{DefaultUser: opts.DefaultUser, Logger: opts.Logger})
	desk := opts.Desktop
	if desk == nil {
		desk = desktopconnect.UnimplementedDesktopHandler{}
	}

	s.token = newSecret(opts.Token)
	interceptors := connect.WithInterceptors(tokenInterceptor{token: s.token})
	mux := http.NewServeMux()
	// No gzip on the desktop service: its answers are PNG and JPEG, which
	// gzip does not shrink, and compressing them cost 16-25 ms a
	// screenshot under gVisor (the screenshot benchmark).
	mux.Handle(desktopconnect.NewDesktopHandler(desk, connect.WithInterceptors(tokenInterceptor{token: s.token}, capabilities{}),
		connect.WithCompression("gzip", nil, nil)))
	mux.Handle(processconnect.NewProcessHandler(s.Process, interceptors))
	mux.Handle(filesystemconnect.NewFilesystemHandler(s.Files, interceptors))
	mux.Handle("/files", s.Files.Files())
	mux.HandleFunc("GET /forward", s.forward)
	mux.HandleFunc("POST "+CheckpointPath, s.checkpointHandler)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	s.handler = s.common(requireToken(s.token, mux))
	return s, nil
}

// SetToken makes t the only token the server accepts from now on: a box of
// the warm pool takes its session's token when a create claims it, and
// the pool's token, which only the daemon knew, is dead from then on.
func (s *Server) SetToken(t string) { s.token.set(t) }

// secret is the token requests are checked against; it changes at most
// once in a box's life (SetToken), so it is read without a lock.
type secret struct{ p atomic.Pointer[string] }

func newSecret(t string) *secret {
	s := &secret{}
	s.set(t)
	return s
}

func (s *secret) set(t string) { s.p.Store(&t) }
func (s *secret) get() string  { return *s.p.Load() }

// Handler is the server's root handler.
func (s *Server) Handler() http.Handler { return s.handler }

// common sets the version header and turns "Connect-Timeout-Ms: 0", which
// envd reads as "no time limit", into no header (connect-go would make it
// an already-expired deadline).
func (s *Server) common(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opts.Version != "" {
			w.Header().Set(VersionHeader, s.opts.Version)
		}
		if r.Header.Get(process.ConnectTimeoutHeader) == "0" {
			r.Header.Del(process.ConnectTimeoutHeader)
		}
		next.ServeHTTP(w, r)
	})
}

// tokenOK compares in constant time. An empty configured token (Insecure)
// accepts everything.
func tokenOK(want, got string) bool {
	if want == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}

// requireToken rejects requests without the right token, except GET
// /health. The error body has Connect's shape ({"code":"unauthenticated"}),
// which Connect clients decode from a 401, and also the REST "message".
func requireToken(token *secret, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || tokenOK(token.get(), r.Header.Get(TokenHeader)) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]string{"code": "unauthenticated", "message": "missing or wrong " + TokenHeader})
	})
}

// tokenInterceptor repeats the token check inside Connect, so a handler
// mounted without the HTTP middleware is still protected.
type tokenInterceptor struct{ token *secret }

var errUnauthenticated = connect.NewError(connect.CodeUnauthenticated, errors.New("missing or wrong "+TokenHeader))

func (i tokenInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient && !tokenOK(i.token.get(), req.Header().Get(TokenHeader)) {
			return nil, errUnauthenticated
		}
		return next(ctx, req)
	}
}

func (i tokenInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i tokenInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !tokenOK(i.token.get(), conn.RequestHeader().Get(TokenHeader)) {
			return errUnauthenticated
		}
		return next(ctx, conn)
	}
}

// Capabilities are what the agent can do beyond the desktop's own
// capabilities; Info reports both so the daemon can gate features.
var Capabilities = []string{"process", "process.pty", "process.stdin", "filesystem", "filesystem.watch", "files.multipart"}

// capabilities appends the agent's Capabilities to desktop Info responses.
type capabilities struct{}

func (capabilities) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if r, ok := resp.(*connect.Response[dpb.InfoResponse]); ok && err == nil {
			r.Msg.Capabilities = append(r.Msg.Capabilities, Capabilities...)
		}
		return resp, err
	}
}

func (capabilities) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (capabilities) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// ListenUnix listens on the unix socket at path, replacing a stale socket
// file, and restricts it to its owner (the host daemon runs as root).
func ListenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// Best effort: gVisor's host-backed sockets (--host-uds) refuse chmod;
	// the token, not the file mode, is what guards the agent.
	_ = os.Chmod(path, 0o600)
	return ln, nil
}

// Serve serves HTTP/1.1 and cleartext HTTP/2 on ln until Shutdown. It
// returns nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           s.handler,
		Protocols:         &protos,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.mu.Lock()
	s.servers = append(s.servers, srv)
	s.mu.Unlock()
	s.log.Info("agent listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops every Serve call: listeners close at once, requests in
// flight (including process and watch streams) get until ctx ends, and are
// then cut (the error says so); polled directory watchers stop at once.
// Processes keep running.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	servers := s.servers
	s.mu.Unlock()
	s.Files.Close()
	var errs []error
	for _, srv := range servers {
		if err := srv.Shutdown(ctx); err != nil {
			// Requests still running at the deadline are cut; the
			// caller learns that they were.
			errs = append(errs, fmt.Errorf("shut down agent server: %w", err), srv.Close())
		}
	}
	return errors.Join(errs...)
}
