package api

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubicle-dev/cubicle/internal/inflight"
)

// TestInFlightBound: with two uploads to a sandbox stalled in progress and a
// bound of two, a third request to that sandbox's agent is refused at once
// with 429; control routes still answer; once the uploads end, the sandbox
// is usable again and its count is back to zero.
func TestInFlightBound(t *testing.T) {
	lim := inflight.New(2)
	e := newTestEnv(t, Config{InFlight: lim})
	var writers []*io.PipeWriter
	done := make(chan int, 2)
	for range 2 {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		go func() { done <- e.do("PUT", "/v1/sandboxes/"+runningID+"/files?path=/root/slow", pr).Code }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for lim.InFlight(runningID) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("uploads not in progress: %d", lim.InFlight(runningID))
		}
		time.Sleep(5 * time.Millisecond)
	}
	w := e.do("GET", "/v1/sandboxes/"+runningID+"/screenshot", nil)
	msg := wantError(t, w, http.StatusTooManyRequests, codeRateLimited)
	if !strings.Contains(msg.Message, "in progress") || w.Header().Get("Retry-After") == "" {
		t.Errorf("refusal %q, Retry-After %q", msg.Message, w.Header().Get("Retry-After"))
	}
	if got := testutil.ToFloat64(e.metrics.InFlightRefused); got != 1 {
		t.Errorf("refused counter = %v, want 1", got)
	}
	if w := e.do("GET", "/v1/sandboxes/"+runningID, nil); w.Code != http.StatusOK {
		t.Errorf("GET the sandbox while it is at its bound: %d", w.Code)
	}
	for _, pw := range writers {
		pw.Write([]byte("data"))
		pw.Close()
	}
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Errorf("stalled upload ended with %d", code)
		}
	}
	if w := e.do("GET", "/v1/sandboxes/"+runningID+"/screenshot", nil); w.Code != http.StatusOK {
		t.Errorf("screenshot after the uploads ended: %d %s", w.Code, w.Body)
	}
	if n := lim.Sandboxes(); n != 0 {
		t.Errorf("%d sandboxes still counted", n)
	}
}

// TestStalledBodyIsCut: a client that announces a body and stops sending
// it loses the connection after BodyIdle, and frees its slot; one that
// keeps sending slowly is not cut.
func TestStalledBodyIsCut(t *testing.T) {
	lim := inflight.New(8)
	e := newTestEnv(t, Config{InFlight: lim, BodyIdle: 2 * time.Second})
	srv := httptest.NewServer(e.h)
	defer srv.Close()

	send := func(body func(net.Conn)) (string, time.Duration) {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		t0 := time.Now()
		io.WriteString(c, "PUT /v1/sandboxes/"+runningID+"/files?path=/root/x HTTP/1.1\r\nHost: x\r\nX-API-Key: "+testKey+"\r\nContent-Length: 20\r\n\r\n")
		body(c)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line, time.Since(t0)
	}
	// Stalled after 5 of 20 bytes.
	line, took := send(func(c net.Conn) { io.WriteString(c, "12345") })
	if took > 8*time.Second || strings.Contains(line, " 200 ") {
		t.Errorf("stalled body: answered %q after %v, want cut after about 2s", line, took)
	}
	t.Logf("stalled body: %q after %v", strings.TrimSpace(line), took.Round(time.Millisecond))
	// 20 bytes, one every 100 ms: slow but alive (20 times the pause
	// allowed, for loaded machines).
	line, _ = send(func(c net.Conn) {
		for range 20 {
			time.Sleep(100 * time.Millisecond)
			io.WriteString(c, "x")
		}
	})
	if !strings.Contains(line, " 200 ") {
		t.Errorf("slow but steady body: %q, want 200", line)
	}
	deadline := time.Now().Add(5 * time.Second)
	for lim.Sandboxes() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := lim.Sandboxes(); n != 0 {
		t.Errorf("%d sandboxes still counted after the connections ended", n)
	}
}
