package api

import (
	"context"
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
	"testing"
	"time"

	"github.com/coder/websocket"
)

// fakeDevToolsURL is a stand-in for Chromium's DevTools server, shared by
// every test: it refuses what Chromium refuses (a Host that is not an IP
// address or localhost, a WebSocket with an Origin) and answers each
// command on the browser WebSocket with its id and method; "Big" answers
// with 3 MB.
var fakeDevTools = sync.OnceValue(func() string {
	mux := http.NewServeMux()
	check := func(w http.ResponseWriter, r *http.Request) bool {
		if h, _, _ := net.SplitHostPort(r.Host); h != "127.0.0.1" && h != "localhost" {
			http.Error(w, "Host header is specified and is not an IP address or localhost.", http.StatusInternalServerError)
			return false
		}
		return true
	}
	mux.HandleFunc("GET /json/version", func(w http.ResponseWriter, r *http.Request) {
		if !check(w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		io.WriteString(w, `{"Browser": "Chrome/156.0.8078.114", "Protocol-Version": "1.3", "User-Agent": "Mozilla/5.0",
			"V8-Version": "15.6", "WebKit-Version": "537.36",
			"webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/5f0c1e4e-fake"}`)
	})
	mux.HandleFunc("GET /devtools/browser/5f0c1e4e-fake", func(w http.ResponseWriter, r *http.Request) {
		if !check(w, r) {
			return
		}
		if o := r.Header.Get("Origin"); o != "" {
			http.Error(w, "Rejected an incoming WebSocket connection from the "+o+" origin.", http.StatusForbidden)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(-1)
		ctx := context.Background()
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			var cmd struct {
				ID     int    `json:"id"`
				Method string `json:"method"`
			}
			if err := json.Unmarshal(b, &cmd); err != nil {
				c.Close(websocket.StatusUnsupportedData, "not JSON")
				return
			}
			res := map[string]any{"method": cmd.Method, "len": len(b)}
			if cmd.Method == "Big" {
				res["data"] = strings.Repeat("x", 3<<20)
			}
			out, _ := json.Marshal(map[string]any{"id": cmd.ID, "result": res})
			if err := c.Write(ctx, websocket.MessageText, out); err != nil {
				return
			}
		}
	})
	hs := httptest.NewServer(mux)
	return hs.Listener.Addr().String()
})

// forward is the fake agent's GET /forward: DevTools on DefaultCDPPort,
// the fake VNC server on the others.
func (a *fakeAgent) forward(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("port") != strconv.Itoa(DefaultCDPPort) {
		a.vnc.forward(w, r)
		return
	}
	up, err := net.Dial("tcp", fakeDevTools())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer up.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: cubicle-forward\r\n\r\n")
	_ = brw.Flush()
	go func() { _, _ = io.Copy(up, brw.Reader); up.Close() }()
	_, _ = io.Copy(conn, up)
}

// versionOf fetches /cdp/json/version over the real listener.
func versionOf(t *testing.T, ve *viewEnv, suffix string, headers ...string) (map[string]any, *http.Response) {
	t.Helper()
	req, _ := http.NewRequest("GET", ve.url+"/v1/sandboxes/"+runningID+"/cdp/json/version"+suffix, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
	} else {
		v = map[string]any{"status": resp.StatusCode, "body": string(b)}
	}
	return v, resp
}

func TestCDPVersion(t *testing.T) {
	ve := newViewEnv(t, Config{})
	host := strings.TrimPrefix(ve.url, "http://")
	tok := ve.token(t, false)
	for _, c := range []struct {
		name, suffix string
		headers      []string
		wantStatus   int
		wantWS       string
	}{
		{"key", "", []string{"X-API-Key", testKey}, 200, "ws://" + host + "/v1/sandboxes/" + runningID + "/cdp"},
		{"key, Playwright's trailing slash", "/", []string{"X-API-Key", testKey}, 200, "ws://" + host + "/v1/sandboxes/" + runningID + "/cdp"},
		{"bearer key", "", []string{"Authorization", "Bearer " + testKey}, 200, "ws://" + host + "/v1/sandboxes/" + runningID + "/cdp"},
		{"token", "/?token=" + url.QueryEscape(tok), nil, 200,
			"ws://" + host + "/v1/sandboxes/" + runningID + "/cdp?token=" + url.QueryEscape(tok)},
		{"key and token: the key wins, the token is not handed on", "?token=" + url.QueryEscape(tok), []string{"X-API-Key", testKey}, 200,
			"ws://" + host + "/v1/sandboxes/" + runningID + "/cdp"},
		{"view-only token", "?token=" + url.QueryEscape(ve.token(t, true)), nil, 403, ""},
		{"nothing", "", nil, 401, ""},
		{"wrong key", "", []string{"X-API-Key", "nope"}, 401, ""},
		{"garbage token", "?token=abc", nil, 401, ""},
		{"below version", "/extra", []string{"X-API-Key", testKey}, 404, ""},
		{"below version, no key", "/extra", nil, 401, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, resp := versionOf(t, ve, c.suffix, c.headers...)
			if resp.StatusCode != c.wantStatus {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, c.wantStatus, v)
			}
			if c.wantStatus != 200 {
				return
			}
			if got := v["webSocketDebuggerUrl"]; got != c.wantWS {
				t.Errorf("webSocketDebuggerUrl = %v, want %s", got, c.wantWS)
			}
			if v["Browser"] != "Chrome/156.0.8078.114" || v["Protocol-Version"] != "1.3" || v["V8-Version"] != "15.6" {
				t.Errorf("Chromium's fields not kept: %v", v)
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q, want no-store", cc)
			}
		})
	}
	t.Run("public URL", func(t *testing.T) {
		ve := newViewEnv(t, Config{PublicURL: "https://cubicle.example/"})
		v, _ := versionOf(t, ve, "", "X-API-Key", testKey)
		if want := "wss://cubicle.example/v1/sandboxes/" + runningID + "/cdp"; v["webSocketDebuggerUrl"] != want {
			t.Errorf("webSocketDebuggerUrl = %v, want %s", v["webSocketDebuggerUrl"], want)
		}
	})
	t.Run("stopped and headless", func(t *testing.T) {
		wantError(t, ve.do("GET", "/v1/sandboxes/"+stoppedID+"/cdp/json/version", nil), 409, codeConflict)
		wantError(t, ve.do("GET", "/v1/sandboxes/"+headlessID+"/cdp/json/version", nil), 409, codeNoDesktop)
		wantError(t, ve.do("GET", "/v1/sandboxes/nosuch/cdp/json/version", nil), 404, codeNotFound)
	})
}

func TestBrowserPath(t *testing.T) {
	for _, c := range []struct {
		url, want string
	}{
		{"ws://127.0.0.1:9222/devtools/browser/5f0c", "/devtools/browser/5f0c"},
		{"ws://localhost:9222/devtools/browser/x", "/devtools/browser/x"},
		{"ws://127.0.0.1:9222/devtools/page/5f0c", ""},
		{"ws://127.0.0.1:9333/devtools/browser/5f0c", ""},
		{"ws://10.0.0.1/devtools/browser/5f0c", ""},
		{"wss://127.0.0.1:9222/devtools/browser/5f0c", ""},
		{"ws://127.0.0.1:9222/devtools/browser/../../x", ""},
		{"ws://127.0.0.1:9222/devtools/browser/x?y=1", ""},
		{"", ""},
	} {
		got, err := browserPath(map[string]any{"webSocketDebuggerUrl": c.url})
		if got != c.want || (err == nil) != (c.want != "") {
			t.Errorf("browserPath(%q) = %q, %v; want %q", c.url, got, err, c.want)
		}
	}
	if _, err := browserPath(map[string]any{"webSocketDebuggerUrl": 7}); err == nil {
		t.Error("a number was taken as a URL")
	}
}

// dialCDP opens the CDP WebSocket with query q and optional headers.
func dialCDP(ctx context.Context, ve *viewEnv, q string, headers ...string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	for i := 0; i+1 < len(headers); i += 2 {
		h.Set(headers[i], headers[i+1])
	}
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(ve.url, "http")+"/v1/sandboxes/"+runningID+"/cdp"+q,
		&websocket.DialOptions{HTTPHeader: h})
}

// cdpCall sends one command and reads its answer.
func cdpCall(ctx context.Context, t *testing.T, c *websocket.Conn, id int, method string) map[string]any {
	t.Helper()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"id":`+strconv.Itoa(id)+`,"method":"`+method+`"}`)); err != nil {
		t.Fatal(err)
	}
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		ID     int            `json:"id"`
		Result map[string]any `json:"result"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if v.ID != id || v.Result["method"] != method {
		t.Fatalf("answer %.200s, want id %d method %s", b, id, method)
	}
	return v.Result
}

func TestCDPProxy(t *testing.T) {
	ve := newViewEnv(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		name    string
		q       string
		headers []string
	}{
		{"key", "", []string{"X-API-Key", testKey}},
		{"token", "?token=" + url.QueryEscape(ve.token(t, false)), nil},
		// A browser page on the daemon's own origin: its Origin is
		// checked here and not handed to Chromium, which would refuse it.
		{"same origin", "", []string{"X-API-Key", testKey, "Origin", ve.url}},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, _, err := dialCDP(ctx, ve, c.q, c.headers...)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.CloseNow()
			conn.SetReadLimit(-1)
			cdpCall(ctx, t, conn, 1, "Browser.getVersion")
			if res := cdpCall(ctx, t, conn, 2, "Big"); len(res["data"].(string)) != 3<<20 {
				t.Errorf("big answer: %d bytes, want %d", len(res["data"].(string)), 3<<20)
			}
			// A big command, past any default message limit.
			big := `{"id":3,"method":"Runtime.evaluate","params":{"expression":"` + strings.Repeat("1", 2<<20) + `"}}`
			if err := conn.Write(ctx, websocket.MessageText, []byte(big)); err != nil {
				t.Fatal(err)
			}
			_, b, err := conn.Read(ctx)
			if err != nil || !strings.Contains(string(b), `"len":`+strconv.Itoa(len(big))) {
				t.Fatalf("answer to the big command: %.200s, %v", b, err)
			}
			conn.Close(websocket.StatusNormalClosure, "")
		})
	}
	for _, c := range []struct {
		name    string
		q       string
		headers []string
		want    int
	}{
		{"nothing", "", nil, 401},
		{"view-only token", "?token=" + url.QueryEscape(ve.token(t, true)), nil, 403},
		{"foreign origin", "", []string{"X-API-Key", testKey, "Origin", "https://evil.example"}, 403},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, resp, err := dialCDP(ctx, ve, c.q, c.headers...)
			if err == nil || resp == nil || resp.StatusCode != c.want {
				t.Fatalf("dial: %v (%v), want %d", err, resp, c.want)
			}
		})
	}
	t.Run("not a WebSocket", func(t *testing.T) {
		wantError(t, ve.do("GET", "/v1/sandboxes/"+runningID+"/cdp", nil), 400, codeInvalid)
	})
	t.Run("sandbox ends", func(t *testing.T) {
		conn, _, err := dialCDP(ctx, ve, "", "X-API-Key", testKey)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseNow()
		cdpCall(ctx, t, conn, 1, "Browser.getVersion")
		ve.mgr.stop(runningID)
		_, _, err = conn.Read(ctx)
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != "sandbox ended" {
			t.Errorf("read after stop: %v, want going away / sandbox ended", err)
		}
	})
}

// TestCDPTokenExpires checks that a token's connection ends with it.
func TestCDPTokenExpires(t *testing.T) {
	ve := newViewEnv(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body := `{"ttl_seconds": 1, "view_only": false}`
	resp := decode[viewResponse](t, ve.do("POST", "/v1/sandboxes/"+runningID+"/view", strings.NewReader(body)), 200)
	u, _ := url.Parse(resp.URL)
	conn, _, err := dialCDP(ctx, ve, "?token="+url.QueryEscape(u.Query().Get("token")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	cdpCall(ctx, t, conn, 1, "Browser.getVersion")
	_, _, err = conn.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation {
		t.Errorf("read past the token's expiry: %v, want policy violation", err)
	}
}

// TestCDPNoLeak opens and closes 50 CDP connections, half of them
// abruptly, and checks that the goroutines come back.
func TestCDPNoLeak(t *testing.T) {
	ve := newViewEnv(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cycle := func(i int) {
		c, _, err := dialCDP(ctx, ve, "", "X-API-Key", testKey)
		if err != nil {
			t.Fatal(err)
		}
		cdpCall(ctx, t, c, i, "Browser.getVersion")
		if i%2 == 0 {
			c.Close(websocket.StatusNormalClosure, "")
		} else {
			c.CloseNow() // abrupt
		}
	}
	cycle(0) // warm up pools
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	for i := 1; i <= 50; i++ {
		cycle(i)
	}
	waitFor(t, func() bool { return runtime.NumGoroutine() <= base+2 }, "goroutines back to the baseline")
}
