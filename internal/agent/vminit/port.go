package vminit

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// YamuxConfig is the yamux configuration of both ends of the agent
// channel. Keepalives notice a host that went away without closing.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 30 * time.Second
	return c
}

// ListenPort returns a listener whose connections are yamux streams opened
// by the host on the virtio-serial port called name.
//
// Why yamux: a virtio-serial port is one byte stream, like a serial cable,
// while the agent protocol is HTTP with many concurrent requests (and long
// process streams); yamux multiplexes any number of independent streams,
// each a net.Conn the agent's http.Server serves as if it were a TCP
// connection.
//
// The host end (the daemon, through QEMU's chardev socket) comes and goes —
// a daemon restart drops it — so when the yamux session dies (the port
// reads EOF once the host disconnects), the listener reopens the port and
// starts a new session for the next host. Accept blocks until a stream
// arrives or Close is called.
func ListenPort(name string, log *slog.Logger) net.Listener {
	return &portListener{name: name, log: log, closed: make(chan struct{})}
}

type portListener struct {
	name string
	log  *slog.Logger

	mu   sync.Mutex
	f    *os.File
	sess *yamux.Session

	closed    chan struct{}
	closeOnce sync.Once
}

// findPort returns the device of the virtio-serial port called name: the
// /dev/virtio-ports/NAME symlink is made by udev, which a cubicle VM does
// not run, so the name is looked up in sysfs.
func findPort(name string) (string, error) {
	if _, err := os.Stat("/dev/virtio-ports/" + name); err == nil {
		return "/dev/virtio-ports/" + name, nil
	}
	ports, _ := filepath.Glob("/sys/class/virtio-ports/*")
	for _, p := range ports {
		n, err := os.ReadFile(filepath.Join(p, "name"))
		if err == nil && strings.TrimSpace(string(n)) == name {
			return "/dev/" + filepath.Base(p), nil
		}
	}
	return "", fmt.Errorf("virtio-serial port %q not found", name)
}

// session returns the current yamux session, opening the port and making
// a new one if there is none.
func (l *portListener) session() (*yamux.Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	if l.sess != nil && !l.sess.IsClosed() {
		return l.sess, nil
	}
	l.dropLocked()
	dev, err := findPort(l.name)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	sess, err := yamux.Server(f, YamuxConfig())
	if err != nil {
		f.Close()
		return nil, err
	}
	l.f, l.sess = f, sess
	return sess, nil
}

func (l *portListener) dropLocked() {
	if l.sess != nil {
		l.sess.Close()
		l.sess = nil
	}
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// Accept returns the next stream the host opens.
func (l *portListener) Accept() (net.Conn, error) {
	var lastErr string
	for {
		sess, err := l.session()
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		if err == nil {
			c, aerr := sess.Accept()
			if aerr == nil {
				return c, nil
			}
			err = aerr
		}
		// The host is not connected (a read gives EOF at once until it is)
		// or went away: start over after a pause. Log changes only.
		if s := err.Error(); s != lastErr && !errors.Is(err, io.EOF) {
			l.log.Debug("agent port", "err", err)
			lastErr = s
		}
		select {
		case <-l.closed:
			return nil, net.ErrClosed
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close stops Accept and closes the port.
func (l *portListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropLocked()
	return nil
}

// Addr names the port.
func (l *portListener) Addr() net.Addr { return portAddr(l.name) }

type portAddr string

func (a portAddr) Network() string { return "virtio-serial" }
func (a portAddr) String() string  { return string(a) }
