package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/e2b"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	ppb "github.com/cubicle-dev/cubicle/proto/process"
	"github.com/cubicle-dev/cubicle/proto/process/processconnect"
)

const (
	sandboxID = "sbtest0123456789abcdef"
	domain    = "sandboxes.example.test"
)

var tokenKey = bytes.Repeat([]byte{3}, 32)

// agents serves one sandbox, sandboxID, whose agent is a real cubicle agent
// running on this host (so its loopback is the test's loopback).
type agents struct{ c *agentclient.Client }

func (a agents) Agent(_ context.Context, id string) (*agentclient.Client, error) {
	if id != sandboxID {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	return a.c, nil
}

// env starts a real agent and a Router in front of it, served by an
// httptest server whose URL is returned.
func env(t *testing.T) string {
	t.Helper()
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := agent.New(agent.Options{Token: "agent-tok", Reaper: r, Env: []string{"FROM_CREATE=yes"}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := agent.ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, "agent-tok")
	// The agent runs on this host, which has no "user" account.
	rt := New(Config{TokenKey: tokenKey, Domain: domain, DefaultUser: "root"}, agents{c}, nil)
	hs := httptest.NewServer(rt)
	t.Cleanup(func() {
		hs.Close()
		c.Close()
		_ = srv.Shutdown(context.Background())
		r.Stop()
	})
	return hs.URL
}

// sandboxHeaders is what E2B's SDK sends on every envd request.
func sandboxHeaders(id, token string) http.Header {
	h := http.Header{}
	h.Set("E2b-Sandbox-Id", id)
	h.Set("E2b-Sandbox-Port", "49983")
	if token != "" {
		h.Set("X-Access-Token", token)
	}
	return h
}

type headerInterceptor http.Header

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, s connect.Spec) connect.StreamingClientConn {
		c := next(ctx, s)
		for k, v := range h {
			c.RequestHeader()[k] = v
		}
		return c
	}
}
func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestEnvdProcess runs a command the way E2B's SDK does (Connect, JSON,
// through the routing headers) and reads its output.
func TestEnvdProcess(t *testing.T) {
	base := env(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := sandboxHeaders(sandboxID, e2b.AccessToken(tokenKey, sandboxID))
	pc := processconnect.NewProcessClient(http.DefaultClient, base, connect.WithProtoJSON(), connect.WithInterceptors(headerInterceptor(h)))
	st, err := pc.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{
		Cmd: "/bin/sh", Args: []string{"-c", "echo out:$FROM_CREATE; echo err >&2; exit 3"},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	exit := -1
	first := true
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if first && ev.GetStart() == nil {
			t.Fatalf("first event %v, want start", ev)
		}
		first = false
		stdout.Write(ev.GetData().GetStdout())
		stderr.Write(ev.GetData().GetStderr())
		if e := ev.GetEnd(); e != nil {
			exit = int(e.GetExitCode())
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "out:yes\n" || stderr.String() != "err\n" || exit != 3 {
		t.Fatalf("stdout %q stderr %q exit %d", stdout.String(), stderr.String(), exit)
	}
}

// TestDefaultUser checks that envd requests naming no user get the
// configured default, and that a named user is passed on unchanged.
func TestDefaultUser(t *testing.T) {
	var got []string
	agentSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, _, _ := r.BasicAuth()
		got = append(got, u)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer agentSrv.Close()
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", agentSrv.Listener.Addr().String())
	}, "t")
	defer c.Close()
	rt := New(Config{TokenKey: tokenKey, DefaultUser: "alice"}, agents{c}, nil)
	for _, auth := range []string{"", "Basic cm9vdDo="} { // "root:"
		req := httptest.NewRequest("POST", "/filesystem.Filesystem/Stat", nil)
		req.Header = sandboxHeaders(sandboxID, e2b.AccessToken(tokenKey, sandboxID))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rt.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(got) != 2 || got[0] != "alice" || got[1] != "root" {
		t.Fatalf("users seen by the agent: %q, want [alice root]", got)
	}
}

func TestEnvdRefusals(t *testing.T) {
	base := env(t)
	good := e2b.AccessToken(tokenKey, sandboxID)
	tests := []struct {
		name   string
		method string
		path   string
		h      http.Header
		status int
	}{
		{"no token", "POST", "/filesystem.Filesystem/Stat", sandboxHeaders(sandboxID, ""), 401},
		{"wrong token", "POST", "/filesystem.Filesystem/Stat", sandboxHeaders(sandboxID, "nope"), 401},
		{"another sandbox's token", "POST", "/filesystem.Filesystem/Stat", sandboxHeaders(sandboxID, e2b.AccessToken(tokenKey, "other")), 401},
		{"unknown sandbox", "POST", "/filesystem.Filesystem/Stat", sandboxHeaders("other", e2b.AccessToken(tokenKey, "other")), 502},
		{"desktop service is private", "POST", "/desktop.Desktop/Info", sandboxHeaders(sandboxID, good), 404},
		{"forward is private", "GET", "/forward?port=22", sandboxHeaders(sandboxID, good), 404},
		{"bad port header", "GET", "/health", http.Header{"E2b-Sandbox-Id": {sandboxID}, "E2b-Sandbox-Port": {"x"}}, 400},
		{"health needs no token", "GET", "/health", sandboxHeaders(sandboxID, ""), 204},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, base+tt.path, strings.NewReader(`{"path":"/"}`))
			req.Header = tt.h
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, b, tt.status)
			}
			if tt.status >= 400 {
				var e struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Code != tt.status || e.Message == "" {
					t.Errorf("error body %+v, %v", e, err)
				}
			}
		})
	}
}

// TestEnvdFiles uploads and downloads through /files as the SDK does.
func TestEnvdFiles(t *testing.T) {
	base := env(t)
	h := sandboxHeaders(sandboxID, e2b.AccessToken(tokenKey, sandboxID))
	p := filepath.Join(t.TempDir(), "sub", "f.txt")
	req, _ := http.NewRequest("POST", base+"/files?path="+p, strings.NewReader("héllo"))
	req.Header = h.Clone()
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	req, _ = http.NewRequest("GET", base+"/files?path="+p, nil)
	req.Header = h.Clone()
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "héllo" {
		t.Fatalf("download: %d %q", resp.StatusCode, b)
	}
}

// TestHostRouting reaches an HTTP server and a WebSocket on a port "inside
// the sandbox" (the agent here runs on the host, so its loopback is ours)
// by host name, as getHost(port) and the Desktop stream URL do.
func TestHostRouting(t *testing.T) {
	base := env(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the guest, host "+r.Host)
	})
	mux.HandleFunc("GET /websockify", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		typ, b, err := c.Read(r.Context())
		if err == nil {
			c.Write(r.Context(), typ, append([]byte("echo: "), b...))
		}
	})
	guest := httptest.NewServer(mux)
	defer guest.Close()
	port := guest.Listener.Addr().(*net.TCPAddr).Port
	host := strconv.Itoa(port) + "-" + sandboxID + "." + domain

	req, _ := http.NewRequest("GET", base+"/hello", nil)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello from the guest, host "+host {
		t.Fatalf("GET via host: %d %q", resp.StatusCode, b)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/websockify", &websocket.DialOptions{Host: host})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageBinary, []byte("rfb")); err != nil {
		t.Fatal(err)
	}
	_, got, err := c.Read(ctx)
	if err != nil || string(got) != "echo: rfb" {
		t.Fatalf("websocket echo %q, %v", got, err)
	}

	// A port nobody listens on is a 502 in E2B's shape.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	req, _ = http.NewRequest("GET", base+"/", nil)
	req.Host = strconv.Itoa(closed) + "-" + sandboxID + "." + domain
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 502 {
		t.Fatalf("closed port: %d, want 502", resp.StatusCode)
	}
}

func TestParseHost(t *testing.T) {
	tests := []struct {
		host string
		want Target
		ok   bool
	}{
		{"6080-abc." + domain, Target{ID: "abc", Port: 6080}, true},
		{"6080-abc." + domain + ":443", Target{ID: "abc", Port: 6080}, true},
		{"6080-ABC." + strings.ToUpper(domain), Target{ID: "abc", Port: 6080}, true},
		{"49983-abc-def." + domain, Target{ID: "abc-def", Port: 49983}, true},
		{"abc." + domain, Target{}, false},
		{"6080-." + domain, Target{}, false},
		{"0-abc." + domain, Target{}, false},
		{"70000-abc." + domain, Target{}, false},
		{"x.6080-abc." + domain, Target{}, false},
		{"6080-abc.other.test", Target{}, false},
		{domain, Target{}, false},
		{"", Target{}, false},
	}
	for _, tt := range tests {
		got, ok := parseHost(tt.host, domain)
		if ok != tt.ok || got != tt.want {
			t.Errorf("parseHost(%q) = %+v, %v; want %+v, %v", tt.host, got, ok, tt.want, tt.ok)
		}
	}
}

func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"6080-abc." + domain, "1-a." + domain + ":1", "", "-." + domain} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		got, ok := parseHost(host, domain)
		if ok && (got.ID == "" || got.Port < 1 || got.Port > 65535 || strings.Contains(got.ID, ".")) {
			t.Fatalf("parseHost(%q) = %+v", host, got)
		}
	})
}

// TestReservedPorts checks that the data plane, open to whoever knows a
// sandbox id, does not reach cubicled's own services in the sandbox
// (x11vnc, Chromium's DevTools), by host or by header, with or without an
// access token.
func TestReservedPorts(t *testing.T) {
	base := env(t)
	for _, port := range ReservedPorts {
		for _, how := range []string{"host", "headers"} {
			req, _ := http.NewRequest("GET", base+"/json/version", nil)
			if how == "host" {
				req.Host = strconv.Itoa(port) + "-" + sandboxID + "." + domain
			} else {
				req.Header.Set("E2b-Sandbox-Id", sandboxID)
				req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), `"code":403`) {
				t.Errorf("port %d by %s: %d %s, want 403", port, how, resp.StatusCode, b)
			}
		}
	}
}

// TestSignedFileURLs uploads and downloads through signed URLs, which carry
// no X-Access-Token, as E2B's uploadUrl and downloadUrl make them; a
// signature for another path, operation or sandbox, an expired one, or a
// parameter given twice is refused and changes nothing.
func TestSignedFileURLs(t *testing.T) {
	base := env(t)
	route := sandboxHeaders(sandboxID, "")
	p := filepath.Join(t.TempDir(), "signed.txt")
	future := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
	past := strconv.FormatInt(time.Now().Add(-time.Second).Unix(), 10)
	signed := func(method, path, op, exp, extra string) (int, string) {
		t.Helper()
		// root: the agent here runs on the host, which may have no "user".
		q := url.Values{"path": {path}, "username": {"root"}, "signature": {e2b.FileSignature(tokenKey, sandboxID, path, op, "root", exp)}}
		if exp != "" {
			q.Set("signature_expiration", exp)
		}
		var body io.Reader
		if method == "POST" {
			body = strings.NewReader("signed " + op)
		}
		req, _ := http.NewRequest(method, base+"/files?"+q.Encode()+extra, body)
		req.Header = route.Clone()
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if code, body := signed("POST", p, "write", future, ""); code != 200 {
		t.Fatalf("signed upload: %d %s", code, body)
	}
	if code, body := signed("GET", p, "read", "", ""); code != 200 || body != "signed write" {
		t.Fatalf("signed download: %d %q", code, body)
	}
	for _, tc := range []struct {
		name, method, path, op, exp, extra string
	}{
		{"expired", "POST", p, "write", past, ""},
		{"read signature used to write", "POST", p, "read", "", ""},
		{"write signature used to read", "GET", p, "write", "", ""},
		{"path given twice", "POST", p, "write", "", "&path=" + url.QueryEscape(p+".2")},
		{"another method", "PUT", p, "write", "", ""},
	} {
		if code, body := signed(tc.method, tc.path, tc.op, tc.exp, tc.extra); code != http.StatusUnauthorized || !strings.Contains(body, "signed URL") {
			t.Errorf("%s: %d %s, want 401 saying why", tc.name, code, body)
		}
	}
	// A link without a path: the upload's own file name would decide.
	if code, body := signed("POST", "", "write", "", ""); code != http.StatusUnauthorized || !strings.Contains(body, "must name its file") {
		t.Errorf("a signed upload link without a path: %d %s, want 401", code, body)
	}
	// A link signed for no user is the default user's (root in this
	// test); an Authorization header naming another user is dropped, or
	// the agent would run the read as that (here unknown) user.
	q := url.Values{"path": {p}, "signature": {e2b.FileSignature(tokenKey, sandboxID, p, "read", "", "")}}
	req, _ := http.NewRequest("GET", base+"/files?"+q.Encode(), nil)
	req.Header = route.Clone()
	req.SetBasicAuth("nobody-such", "")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("signed read with another user in Authorization: %d, want 200 as the default user", resp.StatusCode)
	}
	if b, _ := os.ReadFile(p); string(b) != "signed write" {
		t.Errorf("file after refused uploads: %q", b)
	}
	// A signature made for another sandbox's token.
	q = url.Values{"path": {p}, "signature": {e2b.FileSignature(tokenKey, "other", p, "read", "", "")}}
	req, _ = http.NewRequest("GET", base+"/files?"+q.Encode(), nil)
	req.Header = route.Clone()
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("another sandbox's signature: %d, want 401", resp.StatusCode)
	}
}
