package agent

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"
)

// CheckpointPath is the agent endpoint a host calls before it
// checkpoints the box (gVisor's runsc checkpoint): the agent lets go of
// every host socket, which a checkpoint cannot save.
const CheckpointPath = "/checkpoint/prepare"

// ReopenSignal tells a detached HostListener to listen again: the host
// sends it to the agent (the box's init) once it has restored the box.
// A file would not do: gVisor caches what it knows of a host directory,
// and does not see a file the host makes in it.
const ReopenSignal = syscall.SIGUSR2

// HostListener is the agent's unix socket on a host bind mount, which
// can let go of the host for a checkpoint and come back after the
// restore. Under gVisor (--host-uds) the socket and every connection on
// it are host sockets, and runsc checkpoint refuses to save those
// ("encoding error at object transport.connectionedEndpoint"), stopping
// the box instead. So before a checkpoint Detach closes the listener and
// its connections, and Reopen (on ReopenSignal) listens again after the
// restore; nothing else in a box talks to the host.
type HostListener struct {
	path string
	log  *slog.Logger

	mu       sync.Mutex
	ln       net.Listener  // nil while detached
	listened chan struct{} // closed when ln is set
	conns    map[net.Conn]struct{}

	closed    chan struct{}
	closeOnce sync.Once
}

// ListenHost listens on the unix socket path (as ListenUnix).
func ListenHost(path string, log *slog.Logger) (*HostListener, error) {
	ln, err := ListenUnix(path)
	if err != nil {
		return nil, err
	}
	l := &HostListener{path: path, log: log, ln: ln, listened: make(chan struct{}),
		conns: make(map[net.Conn]struct{}), closed: make(chan struct{})}
	close(l.listened)
	return l, nil
}

// Accept waits for the next connection, through detaches.
func (l *HostListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		ln, listened := l.ln, l.listened
		l.mu.Unlock()
		if ln == nil {
			select {
			case <-listened:
				continue
			case <-l.closed:
				return nil, net.ErrClosed
			}
		}
		c, err := ln.Accept()
		if err != nil {
			l.mu.Lock()
			detached := l.ln != ln
			l.mu.Unlock()
			if detached {
				continue
			}
			return nil, err
		}
		l.mu.Lock()
		if l.ln != ln { // detached while this one came in
			l.mu.Unlock()
			c.Close()
			continue
		}
		tc := &trackedConn{Conn: c, l: l}
		l.conns[tc] = struct{}{}
		l.mu.Unlock()
		return tc, nil
	}
}

// Detach closes the socket and every connection on it. It is a no-op
// while detached.
func (l *HostListener) Detach() {
	l.mu.Lock()
	if l.ln == nil {
		l.mu.Unlock()
		return
	}
	ln := l.ln
	l.ln, l.listened = nil, make(chan struct{})
	conns := l.conns
	l.conns = make(map[net.Conn]struct{})
	l.mu.Unlock()
	ln.Close()
	for c := range conns {
		c.(*trackedConn).Conn.Close()
	}
	l.log.Info("agent socket detached for a checkpoint", "path", l.path)
}

// Reopen listens on the socket's path again: after a Detach, and also
// when the listener never detached (a pause cut short after the host
// moved its socket file away), since the host cannot tell which and
// makes the path free before it asks. The old listener, if any, is
// closed; its connections are kept.
func (l *HostListener) Reopen() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		return net.ErrClosed
	default:
	}
	var ln net.Listener
	var err error
	for range 3 {
		if ln, err = ListenUnix(l.path); err == nil {
			break
		}
		// gVisor may still think a socket is there that the host
		// removed: ask it to forget it, and try again.
		_ = os.Remove(l.path)
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("listen again after restore: %w", err)
	}
	old := l.ln
	l.ln = ln
	if old == nil {
		close(l.listened)
	} else {
		if ul, ok := old.(*net.UnixListener); ok {
			ul.SetUnlinkOnClose(false) // the path is the new socket's now
		}
		old.Close()
	}
	l.log.Info("agent socket listening again", "path", l.path)
	return nil
}

// Close stops Accept and closes the socket.
func (l *HostListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		return l.ln.Close()
	}
	return nil
}

// Addr is the socket's address.
func (l *HostListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// trackedConn leaves its listener's set when closed.
type trackedConn struct {
	net.Conn
	l    *HostListener
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// checkpointHandler answers POST CheckpointPath: 204, and the
// listeners detach. The answer is written on the hijacked connection
// before the detach closes it, so that when the host reads the answer's
// end (the connection closes) no host socket is left.
func (s *Server) checkpointHandler(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	detach := s.detach
	s.mu.Unlock()
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2: the stream cannot be taken; answer, and detach.
		w.WriteHeader(http.StatusNoContent)
		if detach != nil {
			go detach()
		}
		return
	}
	_, _ = buf.WriteString("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
	_ = buf.Flush()
	if detach != nil {
		detach()
	}
	conn.Close()
}

// OnCheckpoint sets what POST CheckpointPath runs: HostListener.Detach of
// the host socket.
func (s *Server) OnCheckpoint(detach func()) {
	s.mu.Lock()
	s.detach = detach
	s.mu.Unlock()
}
