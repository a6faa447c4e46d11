package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
)

// echoServer listens on the loopback and upper-cases what it reads, line by
// line; it returns the port.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := io.WriteString(c, strings.ToUpper(sc.Text())+"\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestForward(t *testing.T) {
	sock := serve(t, "tok")
	port := echoServer(t)
	c := client(sock, "tok")
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Several streams at once, each a full duplex conversation.
	for i := 0; i < 3; i++ {
		s, err := c.Forward(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(s)
		for _, line := range []string{"hello", "vnc bytes"} {
			if _, err := io.WriteString(s, line+"\n"); err != nil {
				t.Fatal(err)
			}
			got, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.ToUpper(line) + "\n"; got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestForwardErrors(t *testing.T) {
	sock := serve(t, "tok")
	port := echoServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A closed port: bind one and release it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	good := client(sock, "tok")
	defer good.Close()
	bad := client(sock, "wrong")
	defer bad.Close()
	tests := []struct {
		name string
		c    *agentclient.Client
		port int
		code int
	}{
		{"wrong token", bad, port, http.StatusUnauthorized},
		{"nothing listening", good, closed, http.StatusBadGateway},
		{"port zero", good, 0, http.StatusBadRequest},
		{"port too big", good, 70000, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := tt.c.Forward(ctx, tt.port)
			if err == nil {
				s.Close()
				t.Fatal("forward succeeded")
			}
			var se *agentclient.StatusError
			if !errors.As(err, &se) || se.Code != tt.code {
				t.Fatalf("err = %v, want status %d", err, tt.code)
			}
		})
	}

	// Without the upgrade headers the endpoint refuses.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/forward?port=1", nil)
	resp, err := good.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("plain GET /forward: %d, want 400", resp.StatusCode)
	}
}

// TestForwardClosesBoth checks that when the service inside closes, the
// daemon's side sees EOF, and when the daemon closes, the service does.
func TestForwardClosesBoth(t *testing.T) {
	sock := serve(t, "tok")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	c := client(sock, "tok")
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port := ln.Addr().(*net.TCPAddr).Port

	// Service closes: the stream ends.
	s, err := c.Forward(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	up := <-accepted
	up.Close()
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(s); done <- err }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stream still open after the service closed")
	}
	s.Close()

	// Daemon closes: the service reads EOF.
	s, err = c.Forward(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	up = <-accepted
	s.Close()
	_ = up.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(up); err != nil {
		t.Fatalf("service side: %v (want EOF)", err)
	}
	up.Close()
}

// TestDialPort checks the forward as a net.Conn under an http.Transport:
// HTTP to a loopback-only server, the way the daemon asks Chromium's
// DevTools for /json/version.
func TestDialPort(t *testing.T) {
	sock := serve(t, "tok")
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "host "+r.Host+" path "+r.URL.Path)
	}))
	defer hs.Close()
	port := hs.Listener.Addr().(*net.TCPAddr).Port
	c := client(sock, "tok")
	defer c.Close()
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return c.DialPort(ctx, port) },
		DisableKeepAlives: true,
	}}
	resp, err := hc.Get("http://127.0.0.1:9222/json/version")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got, want := string(b), "host 127.0.0.1:9222 path /json/version"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := c.DialPort(context.Background(), 1); err == nil {
		t.Error("DialPort to a closed port succeeded")
	}
}

// TestForwardOnDemand: a forward to a port whose program runs on demand
// marks it in use before dialing, waits while the program starts (the
// first dials are refused), and ends the use when the stream closes.
func TestForwardOnDemand(t *testing.T) {
	sock, srv := serveServer(t, "tok")
	// A port nothing listens on yet.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()

	var mu sync.Mutex
	acquired, released := 0, 0
	srv.SetDemand(func(p int) (func(), bool) {
		if p != port {
			return func() {}, false
		}
		mu.Lock()
		acquired++
		first := acquired == 1
		mu.Unlock()
		if first {
			// The program listens 300 ms after it was asked for.
			time.AfterFunc(300*time.Millisecond, func() {
				ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
				if err != nil {
					t.Error(err)
					return
				}
				t.Cleanup(func() { ln.Close() })
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						_, _ = io.WriteString(c, "RFB 003.008\n")
					}
				}()
			})
		}
		return func() { mu.Lock(); released++; mu.Unlock() }, true
	})
	c := client(sock, "tok")
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Forward(ctx, port)
	if err != nil {
		t.Fatalf("forward to an on-demand port: %v", err)
	}
	line, err := bufio.NewReader(s).ReadString('\n')
	if err != nil || line != "RFB 003.008\n" {
		t.Fatalf("read %q, %v; want the program's greeting", line, err)
	}
	mu.Lock()
	a, r := acquired, released
	mu.Unlock()
	if a != 1 || r != 0 {
		t.Errorf("while the stream is open: acquired %d, released %d; want 1, 0", a, r)
	}
	s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		r = released
		mu.Unlock()
		if r == 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r != 1 {
		t.Errorf("after the stream closed: released %d times, want 1", r)
	}
	// A port with no on-demand program is dialed once: refused at once.
	began := time.Now()
	if _, err := c.Forward(ctx, port+1); err == nil {
		t.Skipf("port %d answers; cannot check a refused dial", port+1)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("a refused forward to an ordinary port took %v; want no retrying", d)
	}
}
