package mcp

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/apikey"
)

// HTTPConfig configures NewHTTPHandler.
type HTTPConfig struct {
	// DaemonURL is the daemon's own REST API, reached over loopback
	// ("http://127.0.0.1:7171"): every tool call becomes a REST call
	// there, with the MCP caller's API key.
	DaemonURL string
	// KeysRequired is set when the daemon checks API keys. Without keys,
	// a request that reached a loopback address under another host name
	// (DNS rebinding: a web page's script talking to the local daemon)
	// is refused; with keys it cannot get past authentication anyway, and
	// a reverse proxy on the same host may use its own name.
	KeysRequired bool
	// Version is reported to clients as the server's version.
	Version string
	// Log receives the transport's errors; nil: none.
	Log *slog.Logger
	// Transport carries the loopback REST calls; nil: a transport of its
	// own.
	Transport http.RoundTripper
}

// hostHeader carries the Host the MCP client used to the loopback REST
// call, so that the links view_sandbox mints point where the client can
// reach. The handler always overwrites it: a client cannot choose it.
const hostHeader = "X-Cubicle-Mcp-Host"

// maxRequestBytes bounds a /mcp request body: a write_file of
// MaxFileBytes in base64 with room for the rest of the message.
const maxRequestBytes = 2 * MaxFileBytes

// Handler serves MCP over Streamable HTTP. The caller authenticates as for
// the REST API; the route table's middleware has checked the key before
// ServeHTTP runs.
type Handler struct {
	cross  *http.CrossOriginProtection
	stream *mcp.StreamableHTTPHandler
}

// NewHTTPHandler returns the /mcp handler. It is stateless (MCP revision
// 2026-07-28; clients of the earlier revisions get no session id and carry
// on): each POST is one message, handled on its own, so calls of different
// clients — and of one client — run in parallel, and nothing is kept
// between requests.
func NewHTTPHandler(cfg HTTPConfig) *Handler {
	rt := cfg.Transport
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	backend := func(extra *mcp.RequestExtra) Backend {
		var h http.Header
		if extra != nil {
			h = extra.Header
		}
		key := apikey.FromRequest(&http.Request{Header: h})
		return client.New(cfg.DaemonURL, client.WithAPIKey(key), client.WithHTTPClient(
			&http.Client{Transport: withHost{rt, h.Get(hostHeader)}}), client.WithUserAgent("cubicle-mcp"))
	}
	srv := NewServer(backend, Options{Version: cfg.Version})
	return &Handler{
		cross: http.NewCrossOriginProtection(),
		stream: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
			Stateless:                  true,
			Logger:                     cfg.Log,
			DisableLocalhostProtection: cfg.KeysRequired,
			MaxRequestBodyBytes:        maxRequestBytes,
		}),
	}
}

// ServeHTTP refuses a browser's cross-origin request (a page of another
// origin cannot drive sandboxes with a key the browser holds) with 403,
// and serves the rest.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.cross.Check(r); err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{
			"code":    "permission_denied",
			"message": "cross-origin request refused: /mcp serves MCP clients and pages of the daemon's own origin, not " + r.Header.Get("Origin"),
		}})
		return
	}
	r.Header.Set(hostHeader, r.Host)
	h.stream.ServeHTTP(w, r)
}

// withHost sets the Host of the loopback REST call to the one the MCP
// client used.
type withHost struct {
	rt   http.RoundTripper
	host string
}

func (t withHost) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.host != "" {
		r = r.Clone(r.Context())
		r.Host = t.host
	}
	return t.rt.RoundTrip(r)
}
