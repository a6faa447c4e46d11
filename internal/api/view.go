package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/rfb"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/viewtoken"
)

// Live view defaults.
const (
	DefaultViewTTL = 10 * time.Minute
	MaxViewTTL     = 24 * time.Hour
	// DefaultVNCPort is where the desktop image's own x11vnc (run as
	// cubicle-vnc) listens, on the sandbox's loopback only. Not 5900:
	// E2B's Desktop SDK starts its own x11vnc there for its stream.
	DefaultVNCPort = 5999

	// viewPingInterval keeps idle viewers' connections (and the NATs and
	// proxies on their way) alive and finds dead ones.
	viewPingInterval = 30 * time.Second
	// viewWriteTimeout is Config.ViewWriteTimeout's default.
	viewWriteTimeout = 15 * time.Second
	// viewReadLimit bounds one WebSocket message from a viewer; the largest
	// legitimate one is a clipboard paste (rfb.FilterOptions.MaxCutText).
	viewReadLimit = 2 << 20
	// viewBufSize is the size of one read from the sandbox's VNC server.
	viewBufSize = 64 << 10
)

// Pages serves the browser side: the live-view page, the dashboard and
// their static files (internal/web).
type Pages interface {
	// Static serves GET /static/...
	Static() http.Handler
	// ServeViewer writes the live-view page.
	ServeViewer(w http.ResponseWriter, r *http.Request)
	// ServeDashboard writes the dashboard.
	ServeDashboard(w http.ResponseWriter, r *http.Request)
	// ServeError writes an HTML error page.
	ServeError(w http.ResponseWriter, r *http.Request, status int, title, message string)
}

// viewGrant is what a request may do with a sandbox's live view.
type viewGrant struct {
	viewOnly bool
	expires  time.Time // zero for an API key: no expiry of its own
	created  time.Time // the sandbox creation time the token is bound to
	byToken  bool
}

// errNoViewer is the answer when live view is not configured.
var errNoViewer = &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "live view is not enabled on this daemon"}

// viewRequest is the body of POST /v1/sandboxes/{id}/view.
type viewRequest struct {
	TTLSeconds *int  `json:"ttl_seconds"`
	ViewOnly   *bool `json:"view_only"`
}

// viewResponse is its answer.
type viewResponse struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
	ViewOnly  bool      `json:"view_only"`
}

// createView issues a view link. view_only defaults to true: a link that
// is shared further should be able to do the least.
func (s *server) createView(w http.ResponseWriter, r *http.Request) {
	if s.cfg.ViewTokens == nil {
		s.writeError(w, r, errNoViewer)
		return
	}
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var in viewRequest
	if err := decodeJSON(w, r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	ttl := DefaultViewTTL
	if in.TTLSeconds != nil {
		if *in.TTLSeconds < 1 || *in.TTLSeconds > int(MaxViewTTL/time.Second) {
			s.writeError(w, r, invalidf("ttl_seconds must be 1..%d", int(MaxViewTTL/time.Second)))
			return
		}
		ttl = time.Duration(*in.TTLSeconds) * time.Second
	}
	viewOnly := in.ViewOnly == nil || *in.ViewOnly
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if sb.State != sandbox.StateRunning {
		s.writeError(w, r, errdefs.Conflict("sandbox %s is %s, not running", id, sb.State))
		return
	}
	if err := s.requireDesktop(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	// Rounded up to the second: a link is never shorter than asked for.
	exp := time.Now().Add(ttl + time.Second - 1).Truncate(time.Second)
	tok, err := s.cfg.ViewTokens.Issue(viewtoken.Claims{Sandbox: id, Created: sb.CreatedAt, ViewOnly: viewOnly, Expires: exp})
	if err != nil {
		s.writeError(w, r, fmt.Errorf("issue view token: %w", err))
		return
	}
	u := s.publicBase(r) + "/view/" + url.PathEscape(id) + "?token=" + url.QueryEscape(tok)
	writeJSON(w, http.StatusOK, viewResponse{URL: u, ExpiresAt: exp.UTC(), ViewOnly: viewOnly})
}

// publicBase is the scheme://host the links point at: the configured public
// URL, else what the client used to reach us.
func (s *server) publicBase(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return strings.TrimSuffix(s.cfg.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// authorizeView decides what r may do with sandbox id's live view: an API
// key grants control; otherwise the "token" query parameter must be a valid
// view token for this very sandbox, which must still be running. A token is
// refused with 401 when missing, malformed, forged or expired, and with 403
// when it is for another sandbox or its sandbox has stopped (revoked).
func (s *server) authorizeView(r *http.Request, id string) (viewGrant, sandbox.Sandbox, error) {
	tok := r.URL.Query().Get("token")
	// A valid API key wins over a token; with auth off (no keys, loopback
	// only) a request without a token is let in like every other request.
	if tok == "" || s.keys.Enabled() && s.keys.Authorized(r) {
		if !s.keys.Authorized(r) {
			return viewGrant{}, sandbox.Sandbox{}, &httpError{status: http.StatusUnauthorized, code: codeUnauthorized,
				msg: "a view token (?token=) or an API key is required"}
		}
		sb, err := s.mgr.Get(r.Context(), id)
		if err != nil {
			return viewGrant{}, sb, err
		}
		if sb.State != sandbox.StateRunning {
			return viewGrant{}, sb, errdefs.Conflict("sandbox %s is %s, not running", id, sb.State)
		}
		return viewGrant{}, sb, nil
	}
	if s.cfg.ViewTokens == nil {
		return viewGrant{}, sandbox.Sandbox{}, &httpError{status: http.StatusUnauthorized, code: codeUnauthorized,
			msg: "invalid view token"}
	}
	c, err := s.cfg.ViewTokens.Verify(tok)
	switch {
	case errors.Is(err, viewtoken.ErrExpired):
		return viewGrant{}, sandbox.Sandbox{}, &httpError{status: http.StatusUnauthorized, code: codeUnauthorized,
			msg: "this view link has expired; ask for a new one"}
	case err != nil:
		return viewGrant{}, sandbox.Sandbox{}, &httpError{status: http.StatusUnauthorized, code: codeUnauthorized,
			msg: "invalid view token"}
	}
	if c.Sandbox != id {
		return viewGrant{}, sandbox.Sandbox{}, &httpError{status: http.StatusForbidden, code: codePermissionDenied,
			msg: "this view token is for another sandbox"}
	}
	revoked := &httpError{status: http.StatusForbidden, code: codePermissionDenied,
		msg: "this view link was revoked: the sandbox has ended"}
	sb, err := s.mgr.Get(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return viewGrant{}, sb, revoked
	}
	if err != nil {
		return viewGrant{}, sb, err
	}
	if !sb.CreatedAt.Equal(c.Created) {
		return viewGrant{}, sb, revoked
	}
	switch sb.State {
	case sandbox.StateRunning:
	case sandbox.StateStarting:
		return viewGrant{}, sb, errdefs.Conflict("sandbox %s is still starting", id)
	default:
		return viewGrant{}, sb, revoked
	}
	return viewGrant{viewOnly: c.ViewOnly, expires: c.Expires, created: c.Created, byToken: true}, sb, nil
}

// writeViewError is writeError with the challenge of a 401, as on every
// other route.
func (s *server) writeViewError(w http.ResponseWriter, r *http.Request, err error) {
	if classify(err).status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="cubicle"`)
	}
	s.writeError(w, r, err)
}

// viewStatus is the JSON answer of GET /view/{id} for the viewer page.
type viewStatus struct {
	SandboxID        string        `json:"sandbox_id"`
	State            sandbox.State `json:"state"`
	ViewOnly         bool          `json:"view_only"`
	ExpiresAt        *time.Time    `json:"expires_at"`
	SandboxExpiresAt time.Time     `json:"sandbox_expires_at"`
}

// viewPage serves GET /view/{id}: the viewer page when the link is good, an
// HTML page saying what is wrong otherwise, and with Accept:
// application/json the link's status (the page polls it to tell "ended"
// from a network blip). Without pages configured it answers JSON only.
func (s *server) viewPage(w http.ResponseWriter, r *http.Request) {
	asJSON := accepts(r, "application/json") || s.cfg.Pages == nil
	id, err := pathID(r)
	if err == nil {
		var g viewGrant
		var sb sandbox.Sandbox
		g, sb, err = s.authorizeView(r, id)
		if err == nil {
			if asJSON {
				st := viewStatus{SandboxID: id, State: sb.State, ViewOnly: g.viewOnly, SandboxExpiresAt: sb.ExpiresAt}
				if !g.expires.IsZero() {
					st.ExpiresAt = &g.expires
				}
				w.Header().Set("Cache-Control", "no-store")
				w.Header().Set("Referrer-Policy", "no-referrer")
				writeJSON(w, http.StatusOK, st)
				return
			}
			s.cfg.Pages.ServeViewer(w, r)
			return
		}
	}
	if asJSON {
		s.writeViewError(w, r, err)
		return
	}
	he := classify(err)
	if he.status >= 500 {
		s.logInternal(r, "view page", err)
	}
	title := map[int]string{
		http.StatusUnauthorized: "View link not valid",
		http.StatusForbidden:    "View link revoked",
		http.StatusNotFound:     "Sandbox not found",
		http.StatusConflict:     "Sandbox not running",
	}[he.status]
	if title == "" {
		title = "Live view unavailable"
	}
	s.cfg.Pages.ServeError(w, r, he.status, title, he.msg)
}

// dashboard serves GET /.
func (s *server) dashboard(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Pages == nil {
		s.writeError(w, r, &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "the dashboard is not enabled on this daemon"})
		return
	}
	s.cfg.Pages.ServeDashboard(w, r)
}

// static serves GET /static/...
func (s *server) static(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Pages == nil {
		s.writeError(w, r, &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "no static files on this daemon"})
		return
	}
	s.cfg.Pages.Static().ServeHTTP(w, r)
}

// vnc serves GET /v1/sandboxes/{id}/vnc: a WebSocket carrying RFB between
// the viewer and the x11vnc inside the sandbox, reached through the agent
// channel. Every check happens before the upgrade, so a refused request
// gets an ordinary error answer and not one byte of the desktop.
func (s *server) vnc(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	g, _, err := s.authorizeView(r, id)
	if err != nil {
		s.writeViewError(w, r, err)
		return
	}
	if err := s.checkUpgrade(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	agent, ending, err := s.mgr.Watch(r.Context(), id)
	if err == nil {
		err = s.requireDesktop(r.Context(), id)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	up, err := forwardVNC(r.Context(), agent, s.cfg.VNCPort)
	if err != nil {
		s.writeError(w, r, vncError(err))
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols:    []string{"binary"},
		CompressionMode: websocket.CompressionDisabled,
		// checkUpgrade has checked the Origin against the same rules.
		InsecureSkipVerify: true,
	})
	if err != nil {
		// Accept has answered (bad handshake or foreign Origin).
		up.Close()
		return
	}
	s.views.Add(1)
	defer s.views.Done()
	s.metrics.ViewConnections.Inc()
	defer s.metrics.ViewConnections.Dec()
	s.log.Info("viewer connected", "sandbox", id, "view_only", g.viewOnly, "by_token", g.byToken)
	reason := s.pumpView(r.Context(), ws, up, g, id, ending)
	s.log.Info("viewer disconnected", "sandbox", id, "reason", reason)
}

// checkUpgrade validates the WebSocket handshake and its Origin before the
// sandbox is touched, so a refused request answers in the API's error shape
// and never makes the VNC server accept a client.
func (s *server) checkUpgrade(r *http.Request) error {
	if !headerHasToken(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") ||
		r.Header.Get("Sec-WebSocket-Key") == "" {
		return invalidf("this endpoint needs a WebSocket upgrade (RFB over binary frames)")
	}
	if v := r.Header.Get("Sec-WebSocket-Version"); v != "13" {
		return invalidf("unsupported WebSocket version %q (want 13)", v)
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil // not a browser
	}
	u, err := url.Parse(origin)
	if err == nil && strings.EqualFold(u.Host, r.Host) {
		return nil
	}
	if err == nil {
		for _, p := range s.cfg.ViewOrigins {
			if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(u.Host)); ok {
				return nil
			}
		}
	}
	return &httpError{status: http.StatusForbidden, code: codePermissionDenied,
		msg: "WebSocket Origin " + origin + " is not allowed (same origin, or --view-origins)"}
}

// vncStartWait is how long a viewer waits for the sandbox's VNC server to
// listen: a sandbox is "running" as soon as its X server answers, and
// x11vnc starts a moment later, exactly when a dashboard user clicks "live
// view" on a new sandbox.
const vncStartWait = 10 * time.Second

// vncGreetWait is how long the VNC server has to send its ProtocolVersion
// on a new connection (x11vnc takes ~0.15 s), and vncGreetTries how many
// connections the proxy tries before it gives up.
const (
	vncGreetWait  = 4 * time.Second
	vncGreetTries = 3
)

// errNoGreeting is a VNC server that accepted a connection and said nothing.
var errNoGreeting = &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
	msg: "the sandbox's VNC server accepted the connection but did not answer"}

// forwardVNC opens the stream to the VNC server, retrying while nothing
// listens yet, and returns it once the server has greeted (the greeting
// is replayed to the viewer). x11vnc with -threads once accepted a viewer
// and never greeted it (a CI run waited 30 s); such a connection is
// dropped and another one tried.
func forwardVNC(ctx context.Context, agent *agentclient.Client, port int) (io.ReadWriteCloser, error) {
	var err error
	for range vncGreetTries {
		var up io.ReadWriteCloser
		if up, err = listeningVNC(ctx, agent, port); err != nil {
			return nil, err
		}
		var rw io.ReadWriteCloser
		if rw, err = greeted(up, vncGreetWait); err == nil {
			return rw, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, err
}

// listeningVNC opens the stream to the VNC server, retrying while nothing
// listens yet.
func listeningVNC(ctx context.Context, agent *agentclient.Client, port int) (io.ReadWriteCloser, error) {
	ctx, cancel := context.WithTimeout(ctx, vncStartWait)
	defer cancel()
	for {
		up, err := agent.Forward(ctx, port)
		var se *agentclient.StatusError
		if err == nil || !errors.As(err, &se) || se.Code != http.StatusBadGateway {
			return up, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// greeted waits up to wait for the 12-byte RFB ProtocolVersion on up and
// returns up with those bytes put back in front; on failure it closes up.
func greeted(up io.ReadWriteCloser, wait time.Duration) (io.ReadWriteCloser, error) {
	greeting := make([]byte, 12)
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(up, greeting); done <- err }()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			up.Close()
			return nil, fmt.Errorf("read the VNC server's greeting: %w", err)
		}
		return &replayed{ReadWriteCloser: up, r: io.MultiReader(bytes.NewReader(greeting), up)}, nil
	case <-t.C:
		up.Close() // ends the read
		<-done
		return nil, errNoGreeting
	}
}

// replayed is a stream whose first bytes were read already and are read
// again from r.
type replayed struct {
	io.ReadWriteCloser
	r io.Reader
}

func (p *replayed) Read(b []byte) (int, error) { return p.r.Read(b) }

// vncError turns a failed forward into an API error.
func vncError(err error) error {
	var se *agentclient.StatusError
	if errors.As(err, &se) && se.Code == http.StatusBadGateway {
		return &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
			msg: "the sandbox's VNC server is not running (its image may have none)"}
	}
	return err
}

// headerHasToken reports whether the comma-separated header name contains
// token, case-insensitively ("Connection: keep-alive, Upgrade").
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// pumpView copies RFB both ways until one side goes, the sandbox ends, the
// token expires or the daemon stops, and returns why it ended. Viewer input
// goes through rfb.Filter, which drops input messages of view-only viewers
// and keeps every viewer shared, so no viewer can push others out.
//
// The pumps run under a context that only ends after the close handshake:
// coder/websocket tears a connection down without a close frame when the
// context of a read or write is cancelled, and the viewer page needs the
// close code and reason.
func (s *server) pumpView(ctx context.Context, ws *websocket.Conn, up io.ReadWriteCloser, g viewGrant, id string, ending <-chan struct{}) string {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ws.SetReadLimit(viewReadLimit)
	writeTimeout := s.cfg.ViewWriteTimeout
	if writeTimeout <= 0 {
		writeTimeout = viewWriteTimeout
	}

	var (
		once   sync.Once
		reason string
		code   websocket.StatusCode
		done   = make(chan struct{})
		// slow is set before a write that took too long is cancelled.
		// Cancelling it makes coder/websocket close the connection, so
		// the viewer's read fails at once and could otherwise report
		// "viewer closed" ahead of the writer.
		slow atomic.Bool
	)
	finish := func(c websocket.StatusCode, why string) {
		once.Do(func() {
			reason, code = why, c
			close(done)
		})
	}
	const tooSlow = "viewer too slow or gone"
	readEnded := func() {
		if slow.Load() {
			finish(websocket.StatusPolicyViolation, tooSlow)
		} else {
			finish(websocket.StatusNormalClosure, "viewer closed")
		}
	}

	var wg sync.WaitGroup
	wg.Add(2)
	// Sandbox → viewer. Backpressure is the blocking write: while a viewer
	// is slow we stop reading, and TCP pushes back through the agent channel
	// to x11vnc, which then sends that viewer fewer, coarser updates.
	go func() {
		defer wg.Done()
		buf := make([]byte, viewBufSize)
		sent := s.metrics.ViewBytes.WithLabelValues("to_viewer")
		for {
			n, err := up.Read(buf)
			if n > 0 {
				wctx, wcancel := context.WithCancel(ctx)
				timer := time.AfterFunc(writeTimeout, func() {
					slow.Store(true)
					wcancel()
				})
				werr := ws.Write(wctx, websocket.MessageBinary, buf[:n])
				timer.Stop()
				wcancel()
				if werr != nil {
					finish(websocket.StatusPolicyViolation, tooSlow)
					return
				}
				sent.Add(float64(n))
			}
			if err != nil {
				finish(websocket.StatusGoingAway, "vnc server closed the connection")
				return
			}
		}
	}()
	// Viewer → sandbox.
	go func() {
		defer wg.Done()
		f := rfb.NewFilter(rfb.FilterOptions{ViewOnly: g.viewOnly})
		dropped := 0
		recv := s.metrics.ViewBytes.WithLabelValues("from_viewer")
		buf := make([]byte, 32<<10)
		for {
			typ, rd, err := ws.Reader(ctx)
			if err != nil {
				readEnded()
				return
			}
			if typ != websocket.MessageBinary {
				finish(websocket.StatusUnsupportedData, "text frames are not RFB")
				return
			}
			for {
				n, rerr := rd.Read(buf)
				if n > 0 {
					recv.Add(float64(n))
					out, ferr := f.Feed(buf[:n])
					if d := f.Dropped(); d != dropped {
						s.metrics.ViewInputDropped.Add(float64(d - dropped))
						dropped = d
					}
					if ferr != nil {
						finish(websocket.StatusPolicyViolation, "RFB protocol violation")
						return
					}
					if len(out) > 0 {
						if _, err := up.Write(out); err != nil {
							finish(websocket.StatusGoingAway, "vnc server closed the connection")
							return
						}
					}
				}
				if rerr == io.EOF {
					break
				}
				if rerr != nil {
					readEnded()
					return
				}
			}
		}
	}()

	var expiry <-chan time.Time
	if !g.expires.IsZero() {
		t := time.NewTimer(time.Until(g.expires))
		defer t.Stop()
		expiry = t.C
	}
	ping := time.NewTicker(viewPingInterval)
	defer ping.Stop()
	if s.cfg.ViewKeepsAlive {
		s.mgr.Touch(ctx, id)
	}
	var pinging sync.WaitGroup
loop:
	for {
		select {
		case <-done:
			break loop
		case <-ending:
			finish(websocket.StatusGoingAway, "sandbox ended")
			break loop
		case <-expiry:
			finish(websocket.StatusPolicyViolation, "view link expired")
			break loop
		case <-s.cfg.Context.Done():
			finish(websocket.StatusGoingAway, "daemon shutting down")
			break loop
		case <-ping.C:
			if s.cfg.ViewKeepsAlive {
				s.mgr.Touch(ctx, id)
			}
			pinging.Add(1)
			go func() {
				defer pinging.Done()
				pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
				defer pcancel()
				if err := ws.Ping(pctx); err != nil {
					finish(websocket.StatusGoingAway, "viewer stopped answering pings")
				}
			}()
		}
	}
	// The sandbox side goes first, so nothing more is sent; then the close
	// handshake (bounded inside coder/websocket), then the hard close that
	// ends whichever pump is still blocked.
	up.Close()
	_ = ws.Close(code, reason)
	_ = ws.CloseNow()
	cancel()
	wg.Wait()
	pinging.Wait()
	return reason
}
