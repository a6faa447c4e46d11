package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agent/desktop"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/agentclient"
	dpb "github.com/cubicle-dev/cubicle/proto/desktop"
	fpb "github.com/cubicle-dev/cubicle/proto/filesystem"
	ppb "github.com/cubicle-dev/cubicle/proto/process"
	"github.com/cubicle-dev/cubicle/proto/process/processconnect"
)

// serve runs a server with token on a unix socket and returns its path.
func serve(t *testing.T, token string) string {
	t.Helper()
	sock, _ := serveServer(t, token)
	return sock
}

// serveServer is serve that also returns the server.
func serveServer(t *testing.T, token string) (string, *Server) {
	t.Helper()
	// Own mode: TestDeps in this package runs `go` with os/exec.
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Token: token, Version: "1.2.3", Reaper: r, Desktop: desktop.NewService("1.2.3", ":0")})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "sub", "agent.sock")
	ln, err := ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
		r.Stop()
	})
	return sock, srv
}

func client(sock, token string) *agentclient.Client {
	return agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, token)
}

func TestNoToken(t *testing.T) {
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if _, err := New(Options{Reaper: r}); !errors.Is(err, ErrNoToken) {
		t.Errorf("New without token = %v, want ErrNoToken", err)
	}
	if _, err := New(Options{Reaper: r, Insecure: true}); err != nil {
		t.Errorf("New insecure: %v", err)
	}
}

func TestToken(t *testing.T) {
	sock := serve(t, "s3cret")
	ctx := context.Background()
	calls := map[string]func(c *agentclient.Client) error{
		"desktop.Info": func(c *agentclient.Client) error {
			_, err := c.Desktop.Info(ctx, connect.NewRequest(&dpb.InfoRequest{}))
			return err
		},
		"process.List": func(c *agentclient.Client) error {
			_, err := c.Process.List(ctx, connect.NewRequest(&ppb.ListRequest{}))
			return err
		},
		"process.Start": func(c *agentclient.Client) error {
			st, err := c.Process.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "true"}}))
			if err != nil {
				return err
			}
			defer st.Close()
			for st.Receive() {
			}
			return st.Err()
		},
		"filesystem.Stat": func(c *agentclient.Client) error {
			_, err := c.Filesystem.Stat(ctx, connect.NewRequest(&fpb.StatRequest{Path: "/"}))
			return err
		},
		"GET /files": func(c *agentclient.Client) error {
			body, _, err := c.Download(ctx, "/etc/hostname")
			if err == nil {
				body.Close()
			}
			return err
		},
		"POST /files": func(c *agentclient.Client) error {
			_, err := c.Upload(ctx, filepath.Join(t.TempDir(), "x"), strings.NewReader("x"))
			return err
		},
	}
	for name, call := range calls {
		for _, tok := range []string{"", "wrong", "s3cre", "s3cret2"} {
			t.Run(name+"/"+tok, func(t *testing.T) {
				c := client(sock, tok)
				defer c.Close()
				err := call(c)
				var se *agentclient.StatusError
				switch {
				case errors.As(err, &se):
					if se.Code != http.StatusUnauthorized {
						t.Errorf("status %d, want 401", se.Code)
					}
				case connect.CodeOf(err) != connect.CodeUnauthenticated:
					t.Errorf("err = %v, want unauthenticated", err)
				}
			})
		}
		t.Run(name+"/right", func(t *testing.T) {
			c := client(sock, "s3cret")
			defer c.Close()
			if err := call(c); err != nil {
				t.Errorf("with the right token: %v", err)
			}
		})
	}
}

// TestSetToken: once a warm-pool box takes its session's token, the
// pool's token is refused on every route and the new one accepted.
func TestSetToken(t *testing.T) {
	sock, srv := serveServer(t, "pool-token")
	ctx := context.Background()
	list := func(tok string) error {
		c := client(sock, tok)
		defer c.Close()
		_, err := c.Process.List(ctx, connect.NewRequest(&ppb.ListRequest{}))
		return err
	}
	download := func(tok string) error {
		c := client(sock, tok)
		defer c.Close()
		body, _, err := c.Download(ctx, "/etc/hostname")
		if err == nil {
			body.Close()
		}
		return err
	}
	if err := list("pool-token"); err != nil {
		t.Fatalf("before SetToken: %v", err)
	}
	srv.SetToken("session-token")
	for name, call := range map[string]func(string) error{"process.List": list, "GET /files": download} {
		if err := call("pool-token"); err == nil {
			t.Errorf("%s: the pool's token is still accepted", name)
		}
		if err := call("session-token"); err != nil {
			t.Errorf("%s with the session's token: %v", name, err)
		}
	}
}

func TestInfo(t *testing.T) {
	sock := serve(t, "tok")
	c := client(sock, "tok")
	defer c.Close()
	resp, err := c.Desktop.Info(context.Background(), connect.NewRequest(&dpb.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.GetVersion() != "1.2.3" || !slices.Contains(resp.Msg.GetCapabilities(), "process") || resp.Msg.GetReady() {
		t.Errorf("Info = %v", resp.Msg)
	}
}

func TestHealthAndH2C(t *testing.T) {
	sock := serve(t, "s3cret")
	for _, h2 := range []bool{false, true} {
		var protos http.Protocols
		if h2 {
			protos.SetUnencryptedHTTP2(true)
		} else {
			protos.SetHTTP1(true)
		}
		hc := &http.Client{Transport: &http.Transport{
			Protocols: &protos,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
		}}
		resp, err := hc.Get("http://agent/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get(VersionHeader) != "1.2.3" {
			t.Errorf("h2=%v: /health = %d version %q", h2, resp.StatusCode, resp.Header.Get(VersionHeader))
		}
		if want := map[bool]int{false: 1, true: 2}[h2]; resp.ProtoMajor != want {
			t.Errorf("protocol HTTP/%d, want %d", resp.ProtoMajor, want)
		}
		hc.CloseIdleConnections()
	}
}

// TestInterceptor checks the Connect-level token check on its own, without
// the HTTP middleware.
func TestInterceptor(t *testing.T) {
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	srv, err := New(Options{Token: "tok", Reaper: r})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(srv.Process, connect.WithInterceptors(tokenInterceptor{token: newSecret("tok")})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go hs.Serve(ln)
	defer hs.Close()
	c := processconnect.NewProcessClient(http.DefaultClient, "http://"+ln.Addr().String())
	if _, err := c.List(context.Background(), connect.NewRequest(&ppb.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("unary without token: %v", err)
	}
	st, err := c.Start(context.Background(), connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "true"}}))
	if err == nil {
		for st.Receive() {
		}
		err = st.Err()
	}
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("stream without token: %v", err)
	}
	req := connect.NewRequest(&ppb.ListRequest{})
	req.Header().Set(TokenHeader, "tok")
	if _, err := c.List(context.Background(), req); err != nil {
		t.Errorf("unary with token: %v", err)
	}
}

func TestConnectTimeoutZero(t *testing.T) {
	sock := serve(t, "tok")
	c := client(sock, "tok")
	defer c.Close()
	req := connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "sleep", Args: []string{"0.2"}}, Stdin: new(bool)})
	req.Header().Set("Connect-Timeout-Ms", "0") // envd: no limit
	st, err := c.Process.Start(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var end *ppb.ProcessEvent_EndEvent
	for st.Receive() {
		if e := st.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if st.Err() != nil || end.GetExitCode() != 0 || !end.GetExited() {
		t.Errorf("end %v err %v, want a clean exit", end, st.Err())
	}
}

// TestShutdownReportsCutRequests checks that a shutdown whose deadline cuts
// a request in flight (a process stream that does not end) says so, rather
// than reporting a clean stop.
func TestShutdownReportsCutRequests(t *testing.T) {
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	srv, err := New(Options{Token: "t", Version: "1", Reaper: r, Desktop: desktop.NewService("1", ":0")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ListenUnix(filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	c := client(ln.Addr().String(), "t")
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.Process.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "sleep 30"}}}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() { // the start event: the request is in flight
		t.Fatalf("no start event: %v", stream.Err())
	}
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	err = srv.Shutdown(sctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a request still running = %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v after Shutdown", err)
	}
	srv.Process.Signal(syscall.SIGKILL)
}
