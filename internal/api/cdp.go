package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
)

// CDP: Playwright's connectOverCDP and Puppeteer's connect reach the
// sandbox's Chromium through cubicled. Chromium serves DevTools on the
// sandbox's loopback only (the agent starts it with
// --remote-debugging-port, see internal/agent/session/devtools.go); the
// daemon reaches it through the agent channel like the live view reaches
// x11vnc, so no DevTools port exists on the host or on the sandbox network.
const (
	// DefaultCDPPort is Chromium's DevTools port on the sandbox's loopback
	// (session.DevToolsPort; the API does not import the agent's packages).
	DefaultCDPPort = 9222

	// cdpStartWait is how long a client waits for Chromium's DevTools to
	// listen: a sandbox is "running" once its X server answers, and
	// Chromium comes up a moment later (and again after a crash).
	cdpStartWait = 15 * time.Second
	// cdpAskTimeout bounds one HTTP question to Chromium's DevTools.
	cdpAskTimeout = 10 * time.Second
	// cdpMaxJSON bounds Chromium's /json/version answer (~500 bytes).
	cdpMaxJSON = 64 << 10
	// cdpTouchEvery is how often commands from a CDP client count as
	// activity for the sandbox's idle timeout.
	cdpTouchEvery = 10 * time.Second
)

// cdpPath is the WebSocket endpoint of a sandbox's browser.
func cdpPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/cdp" }

// authorizeCDP is authorizeView for DevTools: an API key, or a view token
// that is not view-only. DevTools controls the browser (and reads its
// cookies and pages), so a view-only link must not open it; a control
// link already lets its holder drive the same browser by hand.
func (s *server) authorizeCDP(r *http.Request, id string) (viewGrant, error) {
	g, _, err := s.authorizeView(r, id)
	if err != nil {
		return g, err
	}
	if g.viewOnly {
		return g, &httpError{status: http.StatusForbidden, code: codePermissionDenied,
			msg: "a view-only token does not open DevTools; use an API key or a view token issued with view_only false"}
	}
	if err := s.requireDesktop(r.Context(), id); err != nil {
		return g, err
	}
	return g, nil
}

// cdpClient is an HTTP client whose every connection is a stream to
// Chromium's DevTools port through agent. It has no timeout of its own:
// a WebSocket it dials lives past the handshake.
func cdpClient(agent *agentclient.Client) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return agent.DialPort(ctx, DefaultCDPPort)
			},
			DisableKeepAlives:     true,
			DisableCompression:    true,
			ResponseHeaderTimeout: cdpAskTimeout,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// cdpVersion asks Chromium's DevTools for /json/version, retrying while
// nothing listens yet. The request names 127.0.0.1 as its Host, as
// DevTools requires (it refuses other host names against DNS rebinding),
// and carries no Origin.
func cdpVersion(ctx context.Context, hc *http.Client) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, cdpStartWait)
	defer cancel()
	for {
		v, err := cdpAskVersion(ctx, hc)
		var se *agentclient.StatusError
		if err == nil || !errors.As(err, &se) || se.Code != http.StatusBadGateway {
			return v, err
		}
		select {
		case <-ctx.Done():
			return nil, errNoDevTools
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// errNoDevTools is the answer when nothing listens on the DevTools port.
var errNoDevTools = &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
	msg: "the sandbox's browser does not serve DevTools: it was created with the environment variable CUBICLE_DEVTOOLS=0, or it is not running, not Chromium, or started by its image without cubicle's flags"}

func cdpAskVersion(ctx context.Context, hc *http.Client) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, cdpAskTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/json/version", DefaultCDPPort), nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the StatusError of the forward, for the retry
		}
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, cdpMaxJSON+1))
	if err != nil {
		return nil, fmt.Errorf("read DevTools /json/version: %w", err)
	}
	if resp.StatusCode != http.StatusOK || len(b) > cdpMaxJSON {
		return nil, fmt.Errorf("DevTools /json/version: %s, %d bytes", resp.Status, len(b))
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("DevTools /json/version: %w", err)
	}
	return v, nil
}

// browserPath is the path of the browser's own DevTools WebSocket from
// Chromium's /json/version ("ws://127.0.0.1:9222/devtools/browser/<id>").
// Only a /devtools/browser/ path on the DevTools port is taken: the answer
// comes from inside the sandbox, and the daemon must not be made to dial
// anything else with it.
func browserPath(v map[string]any) (string, error) {
	s, _ := v["webSocketDebuggerUrl"].(string)
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "ws" || !strings.HasPrefix(u.Path, "/devtools/browser/") || strings.Contains(u.Path, "..") ||
		u.RawQuery != "" || u.Port() != fmt.Sprint(DefaultCDPPort) {
		return "", fmt.Errorf("DevTools /json/version: unexpected webSocketDebuggerUrl %q", s)
	}
	return u.Path, nil
}

// cdpEndpoint is the WebSocket URL a client of this request connects to:
// ws(s)://HOST/v1/sandboxes/{id}/cdp, with the request's token when it
// came with one, so that connectOverCDP("http…/cdp?token=…") needs no
// header at all.
func (s *server) cdpEndpoint(r *http.Request, id string) string {
	base := s.publicBase(r)
	if rest, ok := strings.CutPrefix(base, "https://"); ok {
		base = "wss://" + rest
	} else {
		base = "ws://" + strings.TrimPrefix(base, "http://")
	}
	u := base + cdpPath(id)
	if tok := r.URL.Query().Get("token"); tok != "" && !(s.keys.Enabled() && s.keys.Authorized(r)) {
		u += "?token=" + url.QueryEscape(tok)
	}
	return u
}

// cdpJSONVersion serves GET /v1/sandboxes/{id}/cdp/json/version (and with
// a trailing slash, which Playwright's connectOverCDP asks for): Chromium's
// answer with webSocketDebuggerUrl pointing at cubicled.
func (s *server) cdpJSONVersion(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, err := s.authorizeCDP(r, id); err != nil {
		s.writeViewError(w, r, err)
		return
	}
	if p := r.URL.Path; !strings.HasSuffix(p, "/json/version") && !strings.HasSuffix(p, "/json/version/") {
		s.writeError(w, r, &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "no such DevTools endpoint"})
		return
	}
	agent, err := s.mgr.Agent(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v, err := cdpVersion(r.Context(), cdpClient(agent))
	if err == nil {
		_, err = browserPath(v)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v["webSocketDebuggerUrl"] = s.cdpEndpoint(r, id)
	// It may carry a token.
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	writeJSON(w, http.StatusOK, v)
}

// cdp serves GET /v1/sandboxes/{id}/cdp: a WebSocket joined to the
// browser's DevTools WebSocket inside the sandbox. Every check happens
// before the upgrade, as for the live view. The daemon dials Chromium
// itself, without the client's Origin (Chromium refuses WebSockets whose
// Origin it was not told to allow, which keeps web pages in the sandbox
// out of DevTools), and relays messages both ways, streamed, without a
// size limit of its own.
func (s *server) cdp(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	g, err := s.authorizeCDP(r, id)
	if err != nil {
		s.writeViewError(w, r, err)
		return
	}
	if err := s.checkUpgrade(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	agent, ending, err := s.mgr.Watch(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	hc := cdpClient(agent)
	v, err := cdpVersion(r.Context(), hc)
	var bp string
	if err == nil {
		bp, err = browserPath(v)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	dctx, dcancel := context.WithTimeout(r.Context(), cdpAskTimeout)
	up, resp, err := websocket.Dial(dctx, fmt.Sprintf("ws://127.0.0.1:%d%s", DefaultCDPPort, bp), &websocket.DialOptions{
		HTTPClient:      hc,
		CompressionMode: websocket.CompressionDisabled,
	})
	dcancel()
	if err != nil {
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		s.writeError(w, r, fmt.Errorf("dial the browser's DevTools WebSocket: %w", err))
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		CompressionMode: websocket.CompressionDisabled,
		// checkUpgrade has checked the Origin.
		InsecureSkipVerify: true,
	})
	if err != nil {
		_ = up.CloseNow()
		return
	}
	s.views.Add(1)
	defer s.views.Done()
	s.log.Info("cdp client connected", "sandbox", id, "by_token", g.byToken)
	s.mgr.Touch(r.Context(), id)
	reason := s.pumpCDP(r.Context(), ws, up, g, id, ending)
	s.log.Info("cdp client disconnected", "sandbox", id, "reason", reason)
}

// pumpCDP relays messages between the client and the browser until one
// side goes, the sandbox ends, the token expires or the daemon stops, and
// returns why it ended. Commands from the client count as activity.
func (s *server) pumpCDP(ctx context.Context, client, browser *websocket.Conn, g viewGrant, id string, ending <-chan struct{}) string {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Messages are streamed frame by frame, never held whole, so neither
	// side's size (a screenshot answer is megabytes) needs a limit here.
	client.SetReadLimit(-1)
	browser.SetReadLimit(-1)
	var (
		once   sync.Once
		reason string
		code   websocket.StatusCode
		done   = make(chan struct{})
	)
	finish := func(c websocket.StatusCode, why string) {
		once.Do(func() {
			reason, code = why, c
			close(done)
		})
	}
	var lastTouch time.Time
	var touchMu sync.Mutex
	touch := func() {
		touchMu.Lock()
		defer touchMu.Unlock()
		if time.Since(lastTouch) >= cdpTouchEvery {
			lastTouch = time.Now()
			s.mgr.Touch(ctx, id)
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	const clientGone, browserGone = "client closed", "browser closed the connection"
	go func() {
		defer wg.Done()
		if relay(ctx, browser, client, touch) {
			finish(websocket.StatusNormalClosure, clientGone)
		} else {
			finish(websocket.StatusGoingAway, browserGone)
		}
	}()
	go func() {
		defer wg.Done()
		if relay(ctx, client, browser, nil) {
			finish(websocket.StatusGoingAway, browserGone)
		} else {
			finish(websocket.StatusNormalClosure, clientGone)
		}
	}()
	var expiry <-chan time.Time
	if !g.expires.IsZero() {
		t := time.NewTimer(time.Until(g.expires))
		defer t.Stop()
		expiry = t.C
	}
	select {
	case <-done:
	case <-ending:
		finish(websocket.StatusGoingAway, "sandbox ended")
	case <-expiry:
		finish(websocket.StatusPolicyViolation, "token expired")
	case <-s.cfg.Context.Done():
		finish(websocket.StatusGoingAway, "daemon shutting down")
	}
	_ = browser.CloseNow()
	_ = client.Close(code, reason)
	_ = client.CloseNow()
	cancel()
	wg.Wait()
	return reason
}

// relay copies messages from src to dst, each streamed with its type,
// until one side fails, and reports whether src was the one (its read
// failed); it calls each (if not nil) per message.
func relay(ctx context.Context, dst, src *websocket.Conn, each func()) (srcEnded bool) {
	for {
		typ, rd, err := src.Reader(ctx)
		if err != nil {
			return true
		}
		if each != nil {
			each()
		}
		wr, err := dst.Writer(ctx, typ)
		if err != nil {
			return false
		}
		if _, err := io.Copy(wr, rd); err != nil {
			wr.Close()
			// Either side; a broken read of src shows again at its
			// next Reader.
			return false
		}
		if err := wr.Close(); err != nil {
			return false
		}
	}
}
