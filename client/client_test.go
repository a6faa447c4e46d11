package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testClient returns a Client for srv whose retry waits are recorded
// instead of slept.
func testClient(srv *httptest.Server, opts ...Option) (*Client, *[]time.Duration) {
	c := New(srv.URL, append([]Option{WithAPIKey("secret")}, opts...)...)
	var waits []time.Duration
	c.sleep = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		return ctx.Err()
	}
	return c, &waits
}

func jsonEqual(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("body %q: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want %q: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("body = %s, want %s", got, want)
	}
}

func TestNetworkJSON(t *testing.T) {
	tests := []struct {
		name string
		n    Network
		want string
	}{
		{"none", Network{Egress: EgressNone}, `{"egress":"none"}`},
		{"all", Network{Egress: EgressAll}, `{"egress":"all"}`},
		{"allow", Network{Allow: []string{"10.0.0.0/8", "1.1.1.1/32"}}, `{"egress":{"allow":["10.0.0.0/8","1.1.1.1/32"]}}`},
		{"default", Network{}, `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.n)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("Marshal = %s, want %s", b, tt.want)
			}
			var back Network
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tt.n) {
				t.Errorf("round trip = %+v, want %+v", back, tt.n)
			}
		})
	}
	if _, err := json.Marshal(Network{Egress: "all", Allow: []string{"10.0.0.0/8"}}); err == nil {
		t.Error("Marshal of egress plus allow-list: got nil error")
	}
}

func TestCreate(t *testing.T) {
	f, srv := newFake(t)
	c, _ := testClient(srv)
	ctx := context.Background()

	s, err := c.Create(ctx, CreateRequest{
		Template: "desktop", Backend: "gvisor", Resolution: &Resolution{1280, 800}, DPI: 96, VCPUs: 2, MemoryMB: 2048,
		TimeoutSeconds: 600, IdleTimeoutSeconds: 60, StartURL: "https://example.org",
		Env: map[string]string{"K": "V"}, Metadata: map[string]string{"owner": "me"},
		Network: &Network{Allow: []string{"10.0.0.0/8"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.ID == "" || s.State != StateRunning || s.Resolution != (Resolution{1024, 768}) || s.CreatedAt.IsZero() {
		t.Errorf("Create = %+v", s)
	}
	r := f.last()
	if r.Method != "POST" || r.Path != "/v1/sandboxes" || r.RawQuery != "" {
		t.Errorf("request = %s %s?%s", r.Method, r.Path, r.RawQuery)
	}
	if got := r.Header.Get("X-API-Key"); got != "secret" {
		t.Errorf("X-API-Key = %q", got)
	}
	if got := r.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
	jsonEqual(t, r.Body, `{"template":"desktop","backend":"gvisor","resolution":{"width":1280,"height":800},
		"dpi":96,"vcpus":2,"memory_mb":2048,"timeout_seconds":600,"idle_timeout_seconds":60,
		"start_url":"https://example.org","env":{"K":"V"},"metadata":{"owner":"me"},
		"network":{"egress":{"allow":["10.0.0.0/8"]}}}`)

	s, err = c.Create(ctx, CreateRequest{}, WithoutWait())
	if err != nil {
		t.Fatal(err)
	}
	if s.State != StateStarting {
		t.Errorf("state = %q, want starting", s.State)
	}
	if r := f.last(); r.RawQuery != "wait=false" {
		t.Errorf("query = %q, want wait=false", r.RawQuery)
	}
	jsonEqual(t, f.last().Body, `{}`)
}

func TestLifecycle(t *testing.T) {
	f, srv := newFake(t)
	f.addSandbox("abc")
	c, _ := testClient(srv)
	ctx := context.Background()

	if _, err := c.List(ctx, ListOptions{State: "running", Metadata: map[string]string{"owner": "me", "run": "7"}}); err != nil {
		t.Fatal(err)
	}
	q, _ := url.ParseQuery(f.last().RawQuery)
	want := url.Values{"state": {"running"}, "metadata.owner": {"me"}, "metadata.run": {"7"}}
	if !reflect.DeepEqual(q, want) {
		t.Errorf("List query = %v, want %v", q, want)
	}

	s, err := c.Get(ctx, "abc")
	if err != nil || s.ID != "abc" {
		t.Fatalf("Get = %+v, %v", s, err)
	}
	s, err = c.SetTimeout(ctx, "abc", 120)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.ExpiresAt.Sub(s.CreatedAt); got != 2*time.Minute {
		t.Errorf("new expiry = created+%v, want +2m", got)
	}
	r := f.last()
	if r.Method != "POST" || r.Path != "/v1/sandboxes/abc/timeout" {
		t.Errorf("SetTimeout request = %s %s", r.Method, r.Path)
	}
	jsonEqual(t, r.Body, `{"timeout_seconds":120}`)

	if err := c.Destroy(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if r := f.last(); r.Method != "DELETE" || r.Path != "/v1/sandboxes/abc" {
		t.Errorf("Destroy request = %s %s", r.Method, r.Path)
	}
	err = c.Destroy(ctx, "abc")
	if !IsNotFound(err) {
		t.Fatalf("second Destroy = %v, want not_found", err)
	}
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Message != "sandbox abc not found" || ae.Index != nil {
		t.Errorf("APIError = %+v", ae)
	}
	if _, err := c.Get(ctx, ""); err == nil {
		t.Error("Get(\"\"): got nil error")
	}
}

func TestSandboxTolerantTimes(t *testing.T) {
	var s Sandbox
	err := json.Unmarshal([]byte(`{"id":"x","state":"failed","created_at":"2030-01-02T03:04:05Z","expires_at":"","last_active_at":null,"error":"boom","future_field":1}`), &s)
	if err != nil {
		t.Fatal(err)
	}
	if s.ID != "x" || s.Error != "boom" || s.CreatedAt.Year() != 2030 || !s.ExpiresAt.IsZero() || !s.LastActiveAt.IsZero() {
		t.Errorf("got %+v", s)
	}
}

func TestErrorParsing(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		body      string
		wantCode  string
		wantMsg   string
		wantIndex int // -1: nil
		is        func(error) bool
	}{
		{"api", 409, `{"error":{"code":"conflict","message":"sandbox is not running"}}`, "conflict", "sandbox is not running", -1, IsConflict},
		{"index inside", 400, `{"error":{"code":"invalid_argument","message":"bad key","index":2}}`, "invalid_argument", "bad key", 2, IsInvalidArgument},
		{"index beside", 400, `{"error":{"code":"invalid_argument","message":"bad key"},"index":1}`, "invalid_argument", "bad key", 1, IsInvalidArgument},
		{"proxy text", 502, `Bad Gateway`, "internal", "Bad Gateway", -1, nil},
		{"empty 401", 401, ``, "unauthorized", "", -1, IsUnauthorized},
		{"capacity", 429, `{"error":{"code":"capacity_exhausted","message":"full"}}`, "capacity_exhausted", "full", -1, IsCapacityExhausted},
		{"rate", 429, `{"error":{"code":"rate_limited","message":"slow down"}}`, "rate_limited", "slow down", -1, IsRateLimited},
		{"timeout", 504, `{"error":{"code":"timeout","message":"took too long"}}`, "timeout", "took too long", -1, IsTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			c, _ := testClient(srv, WithRetry(0, 0))
			_, err := c.Actions(context.Background(), "abc", PressKey("enter"))
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, want *APIError", err)
			}
			if ae.Status != tt.status || ae.Code != tt.wantCode || ae.Message != tt.wantMsg {
				t.Errorf("got %d %q %q, want %d %q %q", ae.Status, ae.Code, ae.Message, tt.status, tt.wantCode, tt.wantMsg)
			}
			switch {
			case tt.wantIndex < 0 && ae.Index != nil:
				t.Errorf("Index = %d, want nil", *ae.Index)
			case tt.wantIndex >= 0 && (ae.Index == nil || *ae.Index != tt.wantIndex):
				t.Errorf("Index = %v, want %d", ae.Index, tt.wantIndex)
			}
			if tt.is != nil && !tt.is(err) {
				t.Errorf("helper for %s = false", tt.wantCode)
			}
			if ErrorCode(err) != tt.wantCode {
				t.Errorf("ErrorCode = %q", ErrorCode(err))
			}
		})
	}
	if ErrorCode(errors.New("x")) != "" || IsNotFound(nil) {
		t.Error("helpers on non-API errors should be false")
	}
}

func TestAuth(t *testing.T) {
	_, srv := newFake(t)
	c := New(srv.URL, WithAPIKey("wrong"))
	if _, err := c.Info(context.Background()); !IsUnauthorized(err) {
		t.Errorf("Info with wrong key = %v, want unauthorized", err)
	}
	// /healthz needs no key.
	if err := New(srv.URL).Health(context.Background()); err != nil {
		t.Errorf("Health = %v", err)
	}
}

func TestInfo(t *testing.T) {
	_, srv := newFake(t)
	c, _ := testClient(srv)
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != "v0.1.0" || info.DefaultBackend != "gvisor" || len(info.Backends) != 2 ||
		info.Backends[1].Reason != "no /dev/kvm" || info.Capacity != (Capacity{10, 1}) {
		t.Errorf("Info = %+v", info)
	}
}

func TestScreenshotQuery(t *testing.T) {
	f, srv := newFake(t)
	f.addSandbox("abc")
	c, _ := testClient(srv)
	tests := []struct {
		name string
		opts ScreenshotOptions
		want url.Values
	}{
		{"default", ScreenshotOptions{}, url.Values{}},
		{"jpeg", ScreenshotOptions{Format: "jpeg", Quality: 70, Scale: 0.5},
			url.Values{"format": {"jpeg"}, "quality": {"70"}, "scale": {"0.5"}}},
		{"region", ScreenshotOptions{Width: 640, Region: &Region{1, 2, 30, 40}, Cursor: true},
			url.Values{"width": {"640"}, "x": {"1"}, "y": {"2"}, "w": {"30"}, "h": {"40"}, "cursor": {"true"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, err := c.Screenshot(context.Background(), "abc", tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(img) == 0 {
				t.Error("empty image")
			}
			r := f.last()
			q, _ := url.ParseQuery(r.RawQuery)
			if r.Path != "/v1/sandboxes/abc/screenshot" || !reflect.DeepEqual(q, tt.want) {
				t.Errorf("request = %s?%s, want query %v", r.Path, r.RawQuery, tt.want)
			}
		})
	}
}

func TestActions(t *testing.T) {
	f, srv := newFake(t)
	f.addSandbox("abc")
	c, _ := testClient(srv)
	ctx := context.Background()

	right := ClickAt(10, 20)
	right.Button, right.Count = "right", 2
	scroll := ScrollBy("down", 3)
	scroll.X, scroll.Y = at(5, 6)
	resp, err := c.Actions(ctx, "abc",
		MoveTo(1, 2), right, DragPath(Point{0, 0}, Point{10, 10}), scroll,
		TypeText("héllo"), PressKey("ctrl+l"), WaitMS(100), Action{Type: ActionScreenshot})
	if err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, f.last().Body, `{"actions":[
		{"type":"move","x":1,"y":2},
		{"type":"click","x":10,"y":20,"button":"right","count":2},
		{"type":"drag","path":[[0,0],[10,10]]},
		{"type":"scroll","x":5,"y":6,"direction":"down","amount":3},
		{"type":"type","text":"héllo"},
		{"type":"key","keys":"ctrl+l"},
		{"type":"wait","duration_ms":100},
		{"type":"screenshot"}]}`)
	if len(resp.Results) != 8 || resp.DurationMS != 5 {
		t.Fatalf("resp = %+v", resp)
	}
	if shot := resp.Results[7]; shot.Format != "png" || string(shot.Data) != "\x89PNG" || shot.Width != 1024 {
		t.Errorf("screenshot result = %+v", shot)
	}

	p, err := c.CursorPosition(ctx, "abc")
	if err != nil || p != (Point{12, 34}) {
		t.Errorf("CursorPosition = %v, %v", p, err)
	}
	sz, err := c.ScreenSize(ctx, "abc")
	if err != nil || sz != (Resolution{1024, 768}) {
		t.Errorf("ScreenSize = %v, %v", sz, err)
	}
	ws, err := c.Windows(ctx, "abc")
	if err != nil || len(ws) != 1 || ws[0].ID != "4194307" || ws[0].Title != "Chromium" || !ws[0].Focused {
		t.Errorf("Windows = %+v, %v", ws, err)
	}
	for name, call := range map[string]func() error{
		"Click":  func() error { return c.Click(ctx, "abc", 1, 2) },
		"Move":   func() error { return c.Move(ctx, "abc", 1, 2) },
		"Drag":   func() error { return c.Drag(ctx, "abc", Point{1, 2}, Point{3, 4}) },
		"Scroll": func() error { return c.Scroll(ctx, "abc", "up", 1) },
		"Type":   func() error { return c.Type(ctx, "abc", "x") },
		"Key":    func() error { return c.Key(ctx, "abc", "enter") },
	} {
		if err := call(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}

	_, err = c.Actions(ctx, "abc", MoveTo(1, 1), Action{Type: "bogus"})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Index == nil || *ae.Index != 1 || !IsInvalidArgument(err) {
		t.Errorf("failing action: err = %v", err)
	}
	if !strings.HasPrefix(err.Error(), "action 1: ") {
		t.Errorf("Error() = %q, want action index prefix", err.Error())
	}
	// The daemon's own messages name the action already: once is enough.
	i := 2
	named := &APIError{Status: 400, Code: CodeInvalidArgument, Message: "action 2: point outside the screen", Index: &i}
	if got := named.Error(); got != "action 2: point outside the screen (invalid_argument, HTTP 400)" {
		t.Errorf("Error() = %q", got)
	}
}

func TestExec(t *testing.T) {
	f, srv := newFake(t)
	f.addSandbox("abc")
	c, _ := testClient(srv)
	ctx := context.Background()

	res, err := c.Exec(ctx, "abc", ExecRequest{Argv: []string{"ls", "-la"}, Env: map[string]string{"A": "1"}, Cwd: "/root", User: "root", TimeoutSeconds: 5, Stdin: "in"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Stdout != "out: ls -la\n" || res.Stderr != "warn\n" || res.DurationMS != 7 {
		t.Errorf("Exec = %+v", res)
	}
	jsonEqual(t, f.last().Body, `{"argv":["ls","-la"],"env":{"A":"1"},"cwd":"/root","user":"root","timeout_seconds":5,"stdin":"in"}`)

	pid, err := c.ExecBackground(ctx, "abc", ExecRequest{Command: "sleep 100"})
	if err != nil || pid != 4242 {
		t.Errorf("ExecBackground = %d, %v", pid, err)
	}
	jsonEqual(t, f.last().Body, `{"command":"sleep 100","background":true}`)

	var events []ExecEvent
	code, err := c.ExecStream(ctx, "abc", ExecRequest{Command: "echo hi", Background: true}, func(e ExecEvent) error {
		events = append(events, e)
		return nil
	})
	if err != nil || code != 3 {
		t.Fatalf("ExecStream = %d, %v", code, err)
	}
	r := f.last()
	if r.Header.Get("Accept") != "application/x-ndjson" {
		t.Errorf("Accept = %q", r.Header.Get("Accept"))
	}
	jsonEqual(t, r.Body, `{"command":"echo hi"}`)
	if len(events) != 3 || events[0].Stdout != "out: echo hi\n" || events[1].Stderr != "warn\n" || events[2].ExitCode == nil {
		t.Errorf("events = %+v", events)
	}

	var out, errb bytes.Buffer
	code, err = c.ExecStreamTo(ctx, "abc", ExecRequest{Command: "x"}, &out, &errb)
	if err != nil || code != 3 || out.String() != "out: x\n" || errb.String() != "warn\n" {
		t.Errorf("ExecStreamTo = %d, %v, %q, %q", code, err, out.String(), errb.String())
	}
}

func TestReadExecStream(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		wantCode int
		wantErr  func(error) bool
		wantOut  string
	}{
		{"normal", "{\"stdout\":\"a\"}\n\n{\"stdout\":\"b\"}\n{\"exit_code\":0}\n", 0, nil, "ab"},
		{"no exit", "{\"stdout\":\"a\"}\n", -1, func(err error) bool { return errors.Is(err, ErrStreamEnded) }, "a"},
		{"error line", "{\"stdout\":\"a\"}\n{\"error\":{\"code\":\"timeout\",\"message\":\"killed\"}}\n", -1, IsTimeout, "a"},
		{"garbage", "nope\n", -1, func(err error) bool { return err != nil }, ""},
		{"big line", `{"stdout":"` + strings.Repeat("x", 1<<20) + "\"}\n{\"exit_code\":9}\n", 9, nil, strings.Repeat("x", 1<<20)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			code, err := readExecStream(strings.NewReader(tt.in), func(e ExecEvent) error {
				out.WriteString(e.Stdout)
				return nil
			})
			if code != tt.wantCode {
				t.Errorf("code = %d, want %d", code, tt.wantCode)
			}
			if (tt.wantErr == nil) != (err == nil) || (err != nil && !tt.wantErr(err)) {
				t.Errorf("err = %v", err)
			}
			if out.String() != tt.wantOut {
				t.Errorf("out = %.20q…, want %.20q…", out.String(), tt.wantOut)
			}
		})
	}
	stop := errors.New("stop")
	if _, err := readExecStream(strings.NewReader("{\"stdout\":\"a\"}\n{\"exit_code\":0}\n"), func(ExecEvent) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("callback error: got %v", err)
	}
}

func TestFiles(t *testing.T) {
	f, srv := newFake(t)
	f.addSandbox("abc")
	c, _ := testClient(srv)
	ctx := context.Background()

	fi, err := c.Upload(ctx, "abc", "/root/a b.txt", strings.NewReader("hello"))
	if err != nil || fi != (FileInfo{"/root/a b.txt", 5}) {
		t.Fatalf("Upload = %+v, %v", fi, err)
	}
	r := f.last()
	if r.Method != "PUT" || r.Path != "/v1/sandboxes/abc/files" || r.RawQuery != "path=%2Froot%2Fa+b.txt" || string(r.Body) != "hello" {
		t.Errorf("Upload request = %s %s?%s %q", r.Method, r.Path, r.RawQuery, r.Body)
	}
	if r.Header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("Content-Type = %q", r.Header.Get("Content-Type"))
	}

	rc, err := c.Download(ctx, "abc", "/root/a b.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	_ = rc.Close()
	if string(b) != "hello" {
		t.Errorf("Download = %q", b)
	}
	if _, err := c.Download(ctx, "abc", "/nope"); !IsNotFound(err) {
		t.Errorf("Download missing = %v, want not_found", err)
	}

	entries, err := c.ListFiles(ctx, "abc", "/root")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Mode.String() != "0644" || entries[1].Mode.String() != "0755" ||
		entries[0].ModifiedAt.Year() != 2030 || !entries[1].ModifiedAt.IsZero() || entries[1].Type != FileTypeDir {
		t.Errorf("ListFiles = %+v", entries)
	}
	if r := f.last(); r.Path != "/v1/sandboxes/abc/files/list" || r.RawQuery != "path=%2Froot" {
		t.Errorf("ListFiles request = %s?%s", r.Path, r.RawQuery)
	}

	if err := c.RemoveFile(ctx, "abc", "/root/a b.txt"); err != nil {
		t.Fatal(err)
	}
	if r := f.last(); r.Method != "DELETE" || r.Path != "/v1/sandboxes/abc/files" {
		t.Errorf("RemoveFile request = %s %s", r.Method, r.Path)
	}
}

func TestView(t *testing.T) {
	f, srv := newFake(t)
	f.addSandbox("abc")
	c, _ := testClient(srv)
	v, err := c.View(context.Background(), "abc", ViewRequest{TTLSeconds: 600, ViewOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.URL, "/view/abc?token=") || v.ExpiresAt.IsZero() {
		t.Errorf("View = %+v", v)
	}
	jsonEqual(t, f.last().Body, `{"ttl_seconds":600,"view_only":true}`)
}

// failFirst makes the fake answer the first n requests with status.
func failFirst(n int, status int) func(w http.ResponseWriter, r *http.Request, i int) bool {
	return func(w http.ResponseWriter, r *http.Request, i int) bool {
		if i <= n {
			writeErr(w, status, "capacity_exhausted", "try later")
			return true
		}
		return false
	}
}

func TestRetry(t *testing.T) {
	ctx := context.Background()
	t.Run("GET retried until success", func(t *testing.T) {
		f, srv := newFake(t)
		f.addSandbox("abc")
		f.fail = failFirst(2, 503)
		c, waits := testClient(srv, WithRetry(3, 100*time.Millisecond))
		if _, err := c.Get(ctx, "abc"); err != nil {
			t.Fatal(err)
		}
		if n := len(f.requests()); n != 3 {
			t.Errorf("attempts = %d, want 3", n)
		}
		if len(*waits) != 2 {
			t.Fatalf("waits = %v", *waits)
		}
		// Equal jitter: attempt i waits in [b/2, b] with b = base·2^(i-1).
		for i, d := range *waits {
			b := 100 * time.Millisecond << i
			if d < b/2 || d > b {
				t.Errorf("wait %d = %v, want in [%v, %v]", i, d, b/2, b)
			}
		}
	})
	t.Run("GET gives up after max", func(t *testing.T) {
		f, srv := newFake(t)
		f.fail = failFirst(100, 502)
		c, _ := testClient(srv, WithRetry(2, time.Millisecond))
		_, err := c.List(ctx, ListOptions{})
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != 502 {
			t.Errorf("err = %v, want the 502", err)
		}
		if n := len(f.requests()); n != 3 {
			t.Errorf("attempts = %d, want 3", n)
		}
	})
	t.Run("4xx not retried", func(t *testing.T) {
		f, srv := newFake(t)
		c, _ := testClient(srv)
		if _, err := c.Get(ctx, "missing"); !IsNotFound(err) {
			t.Fatal(err)
		}
		if n := len(f.requests()); n != 1 {
			t.Errorf("attempts = %d, want 1", n)
		}
	})
	t.Run("POST never retried", func(t *testing.T) {
		f, srv := newFake(t)
		f.addSandbox("abc")
		c, _ := testClient(srv)
		calls := []struct {
			name string
			call func() error
		}{
			{"create", func() error { _, err := c.Create(ctx, CreateRequest{}); return err }},
			{"actions", func() error { _, err := c.Actions(ctx, "abc", MoveTo(1, 1)); return err }},
			{"exec", func() error { _, err := c.Exec(ctx, "abc", ExecRequest{Command: "x"}); return err }},
			{"exec stream", func() error { _, err := c.ExecStream(ctx, "abc", ExecRequest{Command: "x"}, nil); return err }},
			{"timeout", func() error { _, err := c.SetTimeout(ctx, "abc", 1); return err }},
			{"view", func() error { _, err := c.View(ctx, "abc", ViewRequest{}); return err }},
		}
		for _, tt := range calls {
			before := len(f.requests())
			f.mu.Lock()
			f.fail = func(w http.ResponseWriter, r *http.Request, i int) bool {
				writeErr(w, 503, "capacity_exhausted", "full")
				return true
			}
			f.mu.Unlock()
			if err := tt.call(); !IsCapacityExhausted(err) {
				t.Errorf("%s: err = %v", tt.name, err)
			}
			if n := len(f.requests()) - before; n != 1 {
				t.Errorf("%s: attempts = %d, want 1", tt.name, n)
			}
		}
	})
	t.Run("connection errors retried", func(t *testing.T) {
		var n atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) == 1 {
				// Drop the connection without an answer.
				conn, _, _ := w.(http.Hijacker).Hijack()
				_ = conn.Close()
				return
			}
			writeJSON(w, 200, map[string]string{"status": "ok"})
		}))
		defer srv.Close()
		c, _ := testClient(srv)
		if err := c.Health(ctx); err != nil {
			t.Fatal(err)
		}
		if n.Load() != 2 {
			t.Errorf("attempts = %d, want 2", n.Load())
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		c := New("http://"+addr, WithRetry(2, time.Millisecond))
		var tries int
		c.sleep = func(ctx context.Context, d time.Duration) error { tries++; return nil }
		if err := c.Health(ctx); err == nil {
			t.Fatal("Health on closed port: nil error")
		}
		if tries != 2 {
			t.Errorf("retries = %d, want 2", tries)
		}
	})
	t.Run("upload of seekable body retried whole", func(t *testing.T) {
		f, srv := newFake(t)
		f.addSandbox("abc")
		f.fail = failFirst(1, 503)
		c, _ := testClient(srv)
		r := strings.NewReader("xxhello")
		_, _ = r.Seek(2, io.SeekStart) // uploads from the current offset
		fi, err := c.Upload(ctx, "abc", "/f", r)
		if err != nil || fi.Size != 5 {
			t.Fatalf("Upload = %+v, %v", fi, err)
		}
		reqs := f.requests()
		if len(reqs) != 2 || string(reqs[0].Body) != "hello" || string(reqs[1].Body) != "hello" {
			t.Errorf("bodies = %d requests %q", len(reqs), reqs)
		}
	})
	t.Run("upload of bytes.Buffer retried", func(t *testing.T) {
		f, srv := newFake(t)
		f.addSandbox("abc")
		f.fail = failFirst(1, 504)
		c, _ := testClient(srv)
		buf := bytes.NewBufferString("data")
		if _, err := c.Upload(ctx, "abc", "/f", buf); err != nil {
			t.Fatal(err)
		}
		if reqs := f.requests(); len(reqs) != 2 || string(reqs[1].Body) != "data" {
			t.Errorf("requests = %q", reqs)
		}
	})
	t.Run("upload of plain reader not retried", func(t *testing.T) {
		f, srv := newFake(t)
		f.addSandbox("abc")
		f.fail = failFirst(1, 503)
		c, _ := testClient(srv)
		_, err := c.Upload(ctx, "abc", "/f", io.MultiReader(strings.NewReader("once")))
		if !IsCapacityExhausted(err) {
			t.Errorf("err = %v", err)
		}
		if n := len(f.requests()); n != 1 {
			t.Errorf("attempts = %d, want 1", n)
		}
	})
	t.Run("Retry-After honoured", func(t *testing.T) {
		f, srv := newFake(t)
		f.fail = func(w http.ResponseWriter, r *http.Request, i int) bool {
			if i == 1 {
				w.Header().Set("Retry-After", "2")
				writeErr(w, 503, "capacity_exhausted", "later")
				return true
			}
			return false
		}
		c, waits := testClient(srv, WithRetry(1, time.Millisecond))
		if _, err := c.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if len(*waits) != 1 || (*waits)[0] != 2*time.Second {
			t.Errorf("waits = %v, want [2s]", *waits)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		f, srv := newFake(t)
		f.fail = failFirst(1, 503)
		c, _ := testClient(srv, WithRetry(0, 0))
		if _, err := c.Info(ctx); !IsCapacityExhausted(err) {
			t.Errorf("err = %v", err)
		}
	})
}

func TestContextCancel(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)

	t.Run("during request", func(t *testing.T) {
		c := New(srv.URL)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := c.Get(ctx, "abc"); done <- err }()
		time.Sleep(20 * time.Millisecond)
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Get did not return after cancel")
		}
	})
	t.Run("WithTimeout", func(t *testing.T) {
		c := New(srv.URL, WithTimeout(50*time.Millisecond), WithRetry(0, 0))
		if _, err := c.Info(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want deadline exceeded", err)
		}
	})
	t.Run("during backoff", func(t *testing.T) {
		s503 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeErr(w, 503, "capacity_exhausted", "full")
		}))
		defer s503.Close()
		c := New(s503.URL, WithRetry(5, time.Hour))
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Info(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || !IsCapacityExhausted(err) {
			t.Errorf("err = %v, want deadline and the last API error", err)
		}
		if time.Since(start) > 5*time.Second {
			t.Error("backoff ignored the context")
		}
	})
}

func TestBadBaseURL(t *testing.T) {
	c := New("127.0.0.1:7171") // no scheme
	if _, err := c.Info(context.Background()); err == nil || !strings.Contains(err.Error(), "base URL") {
		t.Errorf("err = %v, want base URL error", err)
	}
}

func TestBasePathPrefix(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.Path
		writeJSON(w, 200, map[string]string{"status": "ok"})
	}))
	defer srv.Close()
	if err := New(srv.URL + "/cubicle/").Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got != "/cubicle/healthz" {
		t.Errorf("path = %q, want /cubicle/healthz", got)
	}
}

func TestResponseHook(t *testing.T) {
	f, srv := newFake(t)
	f.addSandbox("abc")
	var raw []byte
	c, _ := testClient(srv, WithResponseHook(func(resp *http.Response, body []byte) { raw = body }))
	if _, err := c.Get(context.Background(), "abc"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(`"id":"abc"`)) {
		t.Errorf("hook body = %s", raw)
	}
}
