package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ForwardProtocol is the Upgrade token of GET /forward. The daemon reaches
// services that listen only on the sandbox's loopback (x11vnc for the live
// view, any guest port for E2B's host routing) through the agent channel it
// already has, so nothing inside a sandbox is ever published on the host.
const ForwardProtocol = "cubicle-forward"

// forwardDialTimeout bounds the dial of the loopback port; a service that
// does not answer at once is not there.
const forwardDialTimeout = 5 * time.Second

// forward serves GET /forward?port=N with "Upgrade: cubicle-forward": it
// dials 127.0.0.1:N inside the sandbox and, once connected, answers 101 and
// splices the two byte streams until either side closes. An HTTP/1.1
// upgrade keeps the forward a plain TCP-like stream on every transport (unix
// socket, yamux over virtio-serial, vsock) without framing overhead. Errors
// before the upgrade are ordinary HTTP answers, so the daemon can tell "no
// such service" (502) from a broken channel.
func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), ForwardProtocol) || !headerHasToken(r.Header, "Connection", "upgrade") {
		http.Error(w, "GET /forward needs Connection: Upgrade and Upgrade: "+ForwardProtocol, http.StatusBadRequest)
		return
	}
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	if err != nil || port < 1 || port > 65535 {
		http.Error(w, "port must be 1..65535", http.StatusBadRequest)
		return
	}
	release, onDemand := s.acquire(port)
	defer release()
	up, err := dialLoopback(r.Context(), port, onDemand)
	if err != nil {
		http.Error(w, "dial port "+strconv.Itoa(port)+": "+err.Error(), http.StatusBadGateway)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		// HTTP/2 streams cannot be hijacked.
		http.Error(w, "forward needs HTTP/1.1: "+err.Error(), http.StatusHTTPVersionNotSupported)
		return
	}
	_, err = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + ForwardProtocol + "\r\n\r\n")
	if err == nil {
		err = brw.Flush()
	}
	if err != nil {
		up.Close()
		conn.Close()
		return
	}
	// Bytes the client sent after its request are already in brw's buffer.
	var down io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		pre, _ := brw.Reader.Peek(n)
		down = io.MultiReader(strings.NewReader(string(pre)), conn)
	}
	splice(conn, down, up)
}

// demandStartTimeout bounds how long a forward waits for an on-demand
// program it has just started to listen.
const demandStartTimeout = 15 * time.Second

// Demand marks the on-demand program serving a loopback port as in use,
// starting it if need be (session.Supervisor.Acquire): release ends the
// use; ok is false when no such program serves port.
type Demand func(port int) (release func(), ok bool)

// SetDemand makes forwards to on-demand programs start them first. The
// session is set up after the server already serves, so this is a setter.
func (s *Server) SetDemand(d Demand) {
	s.mu.Lock()
	s.demand = d
	s.mu.Unlock()
}

func (s *Server) acquire(port int) (release func(), ok bool) {
	s.mu.Lock()
	d := s.demand
	s.mu.Unlock()
	if d == nil {
		return func() {}, false
	}
	return d(port)
}

// dialLoopback connects to 127.0.0.1:port. A program started on demand
// needs a moment before it listens, so then a refused connection is
// retried until it listens or demandStartTimeout passes.
func dialLoopback(ctx context.Context, port int, onDemand bool) (net.Conn, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	d := net.Dialer{Timeout: forwardDialTimeout}
	if !onDemand {
		return d.DialContext(ctx, "tcp", addr)
	}
	ctx, cancel := context.WithTimeout(ctx, demandStartTimeout)
	defer cancel()
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (started on demand, not listening after %v)", err, demandStartTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// splice copies both ways; when either direction ends, both connections
// are closed. Whole-connection close (not half-close) is deliberate: RFB and
// the HTTP the E2B routing carries do not need half-close, and it guarantees
// that no goroutine outlives the pair whichever side goes away.
func splice(client net.Conn, clientR io.Reader, up net.Conn) {
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			client.Close()
			up.Close()
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, clientR)
		closeBoth()
	}()
	_, _ = io.Copy(client, up)
	closeBoth()
	<-done
}

// headerHasToken reports whether the comma-separated header name contains
// token (case-insensitive), as "Connection: keep-alive, Upgrade" does.
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
