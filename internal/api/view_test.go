package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubicle-dev/cubicle/internal/rfb"
	"github.com/cubicle-dev/cubicle/internal/viewtoken"
)

// fakeVNC is an RFB 3.8 server behind the fake agent's /forward: a 64×48
// screen that answers every update request with one red 2×1 raw
// rectangle and counts what its clients send.
type fakeVNC struct {
	mu       sync.Mutex
	open     int    // connections now
	total    int    // connections ever
	shared   []byte // ClientInit flags received
	pointers int
	keys     int
	updates  int
	// flood is how many more bytes (a raw rectangle's worth of pixels)
	// follow each answer to an update request, to fill a slow viewer's
	// buffers.
	flood int
}

func (v *fakeVNC) forward(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("port") != strconv.Itoa(DefaultVNCPort) {
		http.Error(w, "dial: connection refused", http.StatusBadGateway)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: cubicle-forward\r\n\r\n")
	_ = brw.Flush()
	v.mu.Lock()
	v.open++
	v.total++
	v.mu.Unlock()
	defer func() {
		conn.Close()
		v.mu.Lock()
		v.open--
		v.mu.Unlock()
	}()
	_ = v.serve(brw.Reader, conn)
}

func (v *fakeVNC) count() (open, total, pointers, keys, updates int, shared []byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.open, v.total, v.pointers, v.keys, v.updates, bytes.Clone(v.shared)
}

func (v *fakeVNC) serve(rd io.Reader, w io.Writer) error {
	read := func(n int) ([]byte, error) {
		b := make([]byte, n)
		_, err := io.ReadFull(rd, b)
		return b, err
	}
	if _, err := io.WriteString(w, "RFB 003.008\n"); err != nil {
		return err
	}
	if _, err := read(12); err != nil {
		return err
	}
	if _, err := w.Write([]byte{1, 1}); err != nil { // one type: None
		return err
	}
	if _, err := read(1); err != nil {
		return err
	}
	if _, err := w.Write([]byte{0, 0, 0, 0}); err != nil { // SecurityResult OK
		return err
	}
	flag, err := read(1)
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.shared = append(v.shared, flag[0])
	v.mu.Unlock()
	init := []byte{0, 64, 0, 48, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0, 0, 0, 0, 4}
	if _, err := w.Write(append(init, "fake"...)); err != nil {
		return err
	}
	for {
		t, err := read(1)
		if err != nil {
			return err
		}
		switch t[0] {
		case 0:
			_, err = read(19)
		case 2:
			var h []byte
			if h, err = read(3); err == nil {
				_, err = read(4 * int(binary.BigEndian.Uint16(h[1:])))
			}
		case 3:
			if _, err = read(9); err == nil {
				v.mu.Lock()
				v.updates++
				v.mu.Unlock()
				// FramebufferUpdate: one 2×1 raw rectangle of red
				// (0x00RRGGBB, little-endian).
				_, err = w.Write([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 0,
					0, 0, 0xff, 0, 0, 0, 0xff, 0})
				v.mu.Lock()
				flood := v.flood
				v.mu.Unlock()
				if err == nil && flood > 0 {
					_, err = w.Write(make([]byte, flood))
				}
			}
		case 4:
			if _, err = read(7); err == nil {
				v.mu.Lock()
				v.keys++
				v.mu.Unlock()
			}
		case 5:
			if _, err = read(5); err == nil {
				v.mu.Lock()
				v.pointers++
				v.mu.Unlock()
			}
		case 6:
			var h []byte
			if h, err = read(7); err == nil {
				_, err = read(int(binary.BigEndian.Uint32(h[3:])))
			}
		default:
			return errors.New("unknown message")
		}
		if err != nil {
			return err
		}
	}
}

// fakePages records which page was served.
type fakePages struct{}

func (fakePages) Static() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "static") })
}
func (fakePages) ServeViewer(w http.ResponseWriter, _ *http.Request) {
	_, _ = io.WriteString(w, "viewer page")
}
func (fakePages) ServeDashboard(w http.ResponseWriter, _ *http.Request) {
	_, _ = io.WriteString(w, "dashboard page")
}
func (fakePages) ServeError(w http.ResponseWriter, _ *http.Request, status int, title, msg string) {
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "error page: "+title+": "+msg)
}

// viewEnv is a test env with view tokens on a clock the test moves, served
// on a real listener so WebSockets work.
type viewEnv struct {
	*testEnv
	now    time.Time
	mu     sync.Mutex
	tokens *viewtoken.Issuer
	url    string // base URL of the httptest server
}

func newViewEnv(t *testing.T, cfg Config) *viewEnv {
	t.Helper()
	ve := &viewEnv{now: time.Now()}
	tokens, err := viewtoken.New(bytes.Repeat([]byte{1}, viewtoken.KeySize), func() time.Time {
		ve.mu.Lock()
		defer ve.mu.Unlock()
		return ve.now
	})
	if err != nil {
		t.Fatal(err)
	}
	ve.tokens = tokens
	cfg.ViewTokens = tokens
	cfg.Pages = fakePages{}
	ve.testEnv = newTestEnv(t, cfg)
	hs := httptest.NewServer(ve.h)
	t.Cleanup(hs.Close)
	ve.url = hs.URL
	return ve
}

func (ve *viewEnv) advance(d time.Duration) {
	ve.mu.Lock()
	ve.now = ve.now.Add(d)
	ve.mu.Unlock()
}

// token issues a token the way POST /view does, for sandbox id.
func (ve *viewEnv) token(t *testing.T, viewOnly bool) string {
	t.Helper()
	body := `{"ttl_seconds": 60, "view_only": ` + map[bool]string{true: "true", false: "false"}[viewOnly] + `}`
	w := ve.do("POST", "/v1/sandboxes/"+runningID+"/view", strings.NewReader(body))
	resp := decode[viewResponse](t, w, 200)
	u, err := url.Parse(resp.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get("token")
}

// dial opens the live view WebSocket with query q and optional headers.
func (ve *viewEnv) dial(ctx context.Context, q string, headers ...string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	for i := 0; i+1 < len(headers); i += 2 {
		h.Set(headers[i], headers[i+1])
	}
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(ve.url, "http")+"/v1/sandboxes/"+runningID+"/vnc"+q,
		&websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{"binary"}})
}

func TestCreateView(t *testing.T) {
	ve := newViewEnv(t, Config{PublicURL: "https://view.example.test/"})
	w := ve.do("POST", "/v1/sandboxes/"+runningID+"/view", strings.NewReader(`{}`))
	resp := decode[viewResponse](t, w, 200)
	if !strings.HasPrefix(resp.URL, "https://view.example.test/view/"+runningID+"?token=v1.") {
		t.Errorf("url = %q", resp.URL)
	}
	if !resp.ViewOnly {
		t.Error("view_only defaults to false; want true")
	}
	if d := time.Until(resp.ExpiresAt); d < DefaultViewTTL-time.Minute || d > DefaultViewTTL+time.Second {
		t.Errorf("expires in %v, want about %v", d, DefaultViewTTL)
	}
	u, _ := url.Parse(resp.URL)
	c, err := ve.tokens.Verify(u.Query().Get("token"))
	if err != nil || c.Sandbox != runningID || !c.ViewOnly {
		t.Errorf("token claims %+v, %v", c, err)
	}

	for _, tt := range []struct {
		name, id, body string
		status         int
		code           string
	}{
		{"ttl zero", runningID, `{"ttl_seconds": 0}`, 400, codeInvalid},
		{"ttl negative", runningID, `{"ttl_seconds": -5}`, 400, codeInvalid},
		{"ttl too long", runningID, `{"ttl_seconds": 86401}`, 400, codeInvalid},
		{"unknown field", runningID, `{"ttl": 5}`, 400, codeInvalid},
		{"wrong type", runningID, `{"view_only": "yes"}`, 400, codeInvalid},
		{"stopped sandbox", stoppedID, `{}`, 409, codeConflict},
		{"unknown sandbox", "sbnope", `{}`, 404, codeNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, ve.do("POST", "/v1/sandboxes/"+tt.id+"/view", strings.NewReader(tt.body)), tt.status, tt.code)
		})
	}
}

// TestViewAuth checks every way in and out of the live view, on the page's
// JSON status and on the WebSocket, and that a refused WebSocket never
// reaches the sandbox's VNC server.
func TestViewAuth(t *testing.T) {
	ve := newViewEnv(t, Config{})
	good := ve.token(t, true)

	// A token signed with another key, one for another sandbox, one bound
	// to an earlier sandbox of the same id.
	otherKey, _ := viewtoken.New(bytes.Repeat([]byte{2}, viewtoken.KeySize), nil)
	foreign, _ := otherKey.Issue(viewtoken.Claims{Sandbox: runningID, Expires: time.Now().Add(time.Hour)})
	sb, _ := ve.mgr.Get(context.Background(), runningID)
	otherSandbox, _ := ve.tokens.Issue(viewtoken.Claims{Sandbox: "sbother", Created: sb.CreatedAt, Expires: time.Now().Add(time.Hour)})
	oldIncarnation, _ := ve.tokens.Issue(viewtoken.Claims{Sandbox: runningID, Created: sb.CreatedAt.Add(-time.Hour), Expires: time.Now().Add(time.Hour)})
	stopped, _ := ve.tokens.Issue(viewtoken.Claims{Sandbox: stoppedID, Created: sb.CreatedAt, Expires: time.Now().Add(time.Hour)})

	tests := []struct {
		name    string
		id      string
		query   string
		headers []string
		status  int
		code    string
	}{
		{"no token, no key", runningID, "", nil, 401, codeUnauthorized},
		{"garbage token", runningID, "?token=abc", nil, 401, codeUnauthorized},
		{"forged token", runningID, "?token=" + url.QueryEscape(foreign), nil, 401, codeUnauthorized},
		{"wrong key, no token", runningID, "", []string{"X-API-Key", "nope"}, 401, codeUnauthorized},
		{"token for another sandbox", runningID, "?token=" + url.QueryEscape(otherSandbox), nil, 403, codePermissionDenied},
		{"token of an earlier sandbox", runningID, "?token=" + url.QueryEscape(oldIncarnation), nil, 403, codePermissionDenied},
		{"token of a stopped sandbox", stoppedID, "?token=" + url.QueryEscape(stopped), nil, 403, codePermissionDenied},
		{"good token", runningID, "?token=" + url.QueryEscape(good), nil, 200, ""},
		{"api key", runningID, "", []string{"X-API-Key", testKey}, 200, ""},
		{"api key, bearer", runningID, "", []string{"Authorization", "Bearer " + testKey}, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The page's JSON status.
			h := append([]string{"X-API-Key", "", "Accept", "application/json"}, tt.headers...)
			w := ve.do("GET", "/view/"+tt.id+tt.query, nil, h...)
			if tt.status != 200 {
				wantError(t, w, tt.status, tt.code)
			} else {
				st := decode[viewStatus](t, w, 200)
				if st.SandboxID != tt.id || st.State != "running" {
					t.Errorf("status %+v", st)
				}
			}
			// The HTML page.
			h = append([]string{"X-API-Key", ""}, tt.headers...)
			w = ve.do("GET", "/view/"+tt.id+tt.query, nil, h...)
			if w.Code != tt.status {
				t.Errorf("page: status %d, want %d", w.Code, tt.status)
			}
			if want := map[bool]string{true: "viewer page", false: "error page"}[tt.status == 200]; !strings.HasPrefix(w.Body.String(), want) {
				t.Errorf("page body %q, want %s", w.Body.String(), want)
			}

			// The WebSocket.
			if tt.id != runningID {
				return
			}
			_, total0, _, _, _, _ := ve.agent.vnc.count()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, resp, err := ve.dial(ctx, tt.query, tt.headers...)
			if tt.status != 200 {
				if err == nil {
					c.CloseNow()
					t.Fatal("WebSocket opened")
				}
				if resp == nil || resp.StatusCode != tt.status {
					t.Fatalf("WebSocket: %v, want status %d", err, tt.status)
				}
				var body errorBody
				if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error.Code != tt.code {
					t.Errorf("WebSocket error body %+v, %v", body, err)
				}
				if _, total, _, _, _, _ := ve.agent.vnc.count(); total != total0 {
					t.Error("a refused WebSocket reached the VNC server")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			cl := rfb.NewClient(websocket.NetConn(ctx, c, websocket.MessageBinary))
			si, err := cl.Handshake(true)
			if err != nil {
				t.Fatal(err)
			}
			if si.Width != 64 || si.Height != 48 || si.Name != "fake" {
				t.Errorf("server init %+v", si)
			}
		})
	}

	// Expired: the clock moves past the token's 60 s.
	ve.advance(61 * time.Second)
	w := ve.do("GET", "/view/"+runningID+"?token="+url.QueryEscape(good), nil, "X-API-Key", "", "Accept", "application/json")
	if e := wantError(t, w, 401, codeUnauthorized); !strings.Contains(e.Message, "expired") {
		t.Errorf("expired token message %q", e.Message)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, resp, err := ve.dial(ctx, "?token="+url.QueryEscape(good)); err == nil || resp == nil || resp.StatusCode != 401 {
		if c != nil {
			c.CloseNow()
		}
		t.Fatalf("expired token: WebSocket %v", err)
	}

	// Not a WebSocket request, but authorized: a clear 400; a browser
	// from a foreign origin: 403. Neither reaches the VNC server.
	_, total0, _, _, _, _ := ve.agent.vnc.count()
	wantError(t, ve.do("GET", "/v1/sandboxes/"+runningID+"/vnc", nil), 400, codeInvalid)
	ws := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	wantError(t, ve.do("GET", "/v1/sandboxes/"+runningID+"/vnc", nil, append(ws, "Sec-WebSocket-Version", "8")...), 400, codeInvalid)
	wantError(t, ve.do("GET", "/v1/sandboxes/"+runningID+"/vnc", nil, append(ws, "Origin", "https://evil.example")...), 403, codePermissionDenied)
	if _, total, _, _, _, _ := ve.agent.vnc.count(); total != total0 {
		t.Error("a refused handshake reached the VNC server")
	}
	if w := ve.do("GET", "/view/"+runningID, nil, "X-API-Key", "", "Accept", "application/json"); w.Header().Get("WWW-Authenticate") == "" {
		t.Error("401 without WWW-Authenticate")
	}
}

// TestWatchingIsNotActivity checks that neither a viewer nor a passive
// screenshot (the dashboard's thumbnails) restarts the idle timer, unless
// ViewKeepsAlive says viewers do.
func TestWatchingIsNotActivity(t *testing.T) {
	for _, keep := range []bool{false, true} {
		ve := newViewEnv(t, Config{ViewKeepsAlive: keep})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, _, err := ve.dial(ctx, "?token="+url.QueryEscape(ve.token(t, true)))
		if err != nil {
			t.Fatal(err)
		}
		cl := rfb.NewClient(websocket.NetConn(ctx, c, websocket.MessageBinary))
		if _, err := cl.Handshake(true); err != nil {
			t.Fatal(err)
		}
		c.Close(websocket.StatusNormalClosure, "")
		cancel()
		if w := ve.do("GET", "/v1/sandboxes/"+runningID+"/screenshot", nil, PassiveHeader, "1"); w.Code != 200 {
			t.Fatalf("passive screenshot: %d", w.Code)
		}
		ve.mgr.mu.Lock()
		agentCalls, touched := ve.mgr.agentCalls, ve.mgr.touched
		ve.mgr.mu.Unlock()
		if agentCalls != 0 {
			t.Errorf("keep=%v: %d activity-marking agent calls, want 0", keep, agentCalls)
		}
		if keep != (touched > 0) {
			t.Errorf("keep=%v: touched %d times", keep, touched)
		}
		// An ordinary screenshot is activity.
		ve.do("GET", "/v1/sandboxes/"+runningID+"/screenshot", nil)
		ve.mgr.mu.Lock()
		agentCalls = ve.mgr.agentCalls
		ve.mgr.mu.Unlock()
		if agentCalls != 1 {
			t.Errorf("ordinary screenshot: %d agent calls, want 1", agentCalls)
		}
	}
}

// TestVNCProxy checks that control viewers reach the VNC server with their
// input, view-only viewers see the screen but their input is dropped, and
// every viewer is forced to shared.
func TestVNCProxy(t *testing.T) {
	for _, viewOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "control", true: "view-only"}[viewOnly], func(t *testing.T) {
			ve := newViewEnv(t, Config{})
			tok := ve.token(t, viewOnly)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, _, err := ve.dial(ctx, "?token="+url.QueryEscape(tok))
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			if c.Subprotocol() != "binary" {
				t.Errorf("subprotocol %q, want binary", c.Subprotocol())
			}
			cl := rfb.NewClient(websocket.NetConn(ctx, c, websocket.MessageBinary))
			if _, err := cl.Handshake(false); err != nil { // asks for exclusive
				t.Fatal(err)
			}
			if err := cl.SetPixelFormat(rfb.DefaultFormat); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if err := cl.Pointer(1, 5, 5); err != nil {
					t.Fatal(err)
				}
				if err := cl.Key(true, 'a'); err != nil {
					t.Fatal(err)
				}
			}
			if err := cl.RequestUpdate(false, 0, 0, 64, 48); err != nil {
				t.Fatal(err)
			}
			m, err := cl.ReadMessage()
			if err != nil {
				t.Fatal(err)
			}
			if m.Type != 0 || m.Rects != 1 {
				t.Fatalf("message %+v, want one update rectangle", m)
			}
			if got := cl.Framebuffer().RGBAAt(1, 0); got.R != 255 || got.G != 0 || got.B != 0 {
				t.Errorf("pixel (1,0) = %v, want red", got)
			}
			_, _, pointers, keys, updates, shared := ve.agent.vnc.count()
			if len(shared) != 1 || shared[0] != 1 {
				t.Errorf("ClientInit shared flags %v, want [1]", shared)
			}
			if updates != 1 {
				t.Errorf("%d update requests reached the server, want 1", updates)
			}
			want := 3
			if viewOnly {
				want = 0
			}
			if pointers != want || keys != want {
				t.Errorf("server got %d pointer and %d key events, want %d", pointers, keys, want)
			}
			c.Close(websocket.StatusNormalClosure, "")
			waitFor(t, func() bool { o, _, _, _, _, _ := ve.agent.vnc.count(); return o == 0 }, "VNC connection closed")
			if viewOnly {
				waitFor(t, func() bool { return testutil.ToFloat64(ve.metrics.ViewInputDropped) == 6 }, "6 dropped inputs counted")
			}
		})
	}
}

// TestVNCEnds checks that a viewer is closed within a second when its
// sandbox stops, with a close reason the page can show.
func TestVNCEnds(t *testing.T) {
	ve := newViewEnv(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := ve.dial(ctx, "?token="+url.QueryEscape(ve.token(t, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	cl := rfb.NewClient(websocket.NetConn(ctx, c, websocket.MessageBinary))
	if _, err := cl.Handshake(true); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ve.mgr.stop(runningID)
	_, _, err = c.Read(ctx)
	if d := time.Since(start); d > time.Second {
		t.Errorf("viewer closed after %v, want < 1 s", d)
	}
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != "sandbox ended" {
		t.Errorf("read after stop: %v, want going away / sandbox ended", err)
	}
	waitFor(t, func() bool { o, _, _, _, _, _ := ve.agent.vnc.count(); return o == 0 }, "VNC connection closed")
}

// TestVNCNoLeak opens and closes 100 viewers and checks that goroutines,
// the VNC server's connections and the connection gauge come back.
func TestVNCNoLeak(t *testing.T) {
	ve := newViewEnv(t, Config{})
	tok := url.QueryEscape(ve.token(t, false))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cycle := func(i int) {
		c, _, err := ve.dial(ctx, "?token="+tok)
		if err != nil {
			t.Fatal(err)
		}
		cl := rfb.NewClient(websocket.NetConn(ctx, c, websocket.MessageBinary))
		if _, err := cl.Handshake(true); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			c.Close(websocket.StatusNormalClosure, "")
		} else {
			c.CloseNow() // abrupt
		}
	}
	cycle(0) // warm up pools
	waitFor(t, func() bool { o, _, _, _, _, _ := ve.agent.vnc.count(); return o == 0 }, "first viewer gone")
	time.Sleep(100 * time.Millisecond)
	base := runtime.NumGoroutine()
	for i := 0; i < 100; i++ {
		cycle(i)
	}
	waitFor(t, func() bool {
		o, _, _, _, _, _ := ve.agent.vnc.count()
		return o == 0 && testutil.ToFloat64(ve.metrics.ViewConnections) == 0 && runtime.NumGoroutine() <= base+2
	}, "goroutines and connections back to the baseline")
	if _, total, _, _, _, _ := ve.agent.vnc.count(); total != 101 {
		t.Errorf("%d VNC connections, want 101", total)
	}
}

// TestSlowViewerCut checks that a viewer that stops reading is cut after
// the write timeout, and that the log says why: the cut closes the
// connection under the viewer's reader too, which must not win the race
// and call it "viewer closed".
func TestSlowViewerCut(t *testing.T) {
	const timeout = 200 * time.Millisecond
	ve := newViewEnv(t, Config{ViewWriteTimeout: timeout})
	ve.agent.vnc.mu.Lock()
	ve.agent.vnc.flood = 1 << 20
	ve.agent.vnc.mu.Unlock()
	tok := url.QueryEscape(ve.token(t, true))
	dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	const rounds = 20
	for i := 0; i < rounds; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ve.url, "http")+"/v1/sandboxes/"+runningID+"/vnc?token="+tok,
			&websocket.DialOptions{
				HTTPClient:   &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}},
				Subprotocols: []string{"binary"},
			})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		cl := rfb.NewClient(websocket.NetConn(ctx, c, websocket.MessageBinary))
		if _, err := cl.Handshake(true); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// Ask for updates and read nothing; the daemon's writes block.
		for j := 0; j < 8; j++ {
			if err := cl.RequestUpdate(false, 0, 0, 64, 48); err != nil {
				break
			}
		}
		waitFor(t, func() bool { return strings.Count(ve.logs.String(), `"viewer disconnected"`) > i }, "the slow viewer cut")
		if d := time.Since(start); d < timeout {
			t.Errorf("round %d: viewer cut after %v, before the %v write timeout", i, d, timeout)
		}
		c.CloseNow()
		cancel()
	}
	if n := strings.Count(ve.logs.String(), `"reason":"viewer too slow or gone"`); n != rounds {
		t.Errorf("%d of %d slow viewers were logged as too slow; log:\n%s", n, rounds, ve.logs.String())
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("timed out waiting for: %s\n%s", what, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestGreeted(t *testing.T) {
	// A server that greets: the greeting reaches the viewer all the same.
	srv, cl := net.Pipe()
	go func() { srv.Write([]byte("RFB 003.008\nmore")) }()
	rw, err := greeted(cl, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 16)
	if _, err := io.ReadFull(rw, got); err != nil || string(got) != "RFB 003.008\nmore" {
		t.Errorf("read %q, %v", got, err)
	}
	rw.Close()

	// A server that accepts and says nothing: refused, and closed.
	srv, cl = net.Pipe()
	defer srv.Close()
	start := time.Now()
	if _, err := greeted(cl, 100*time.Millisecond); !errors.Is(err, errNoGreeting) {
		t.Fatalf("silent server: %v, want errNoGreeting", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("gave up after %v", el)
	}
	if _, err := srv.Write([]byte("x")); err == nil {
		t.Error("the silent connection was left open")
	}
}
