package desktop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"
	"golang.org/x/sys/unix"
)

// inputSink carries the XTEST events of input actions to the server.
//
// fake queues an event, flush sends the queue, and sync sends it and waits
// until the server has processed everything sent before. Callers flush
// before pausing between events (so that the pause happens between their
// arrivals at the server) and sync before returning from an action.
type inputSink interface {
	fake(typ, detail byte, x, y int)
	flush() error
	sync() error
	close()
}

// xinput is a second X connection, used only for input, that the agent
// drives synchronously without xgb.
//
// Through xgb every request is a hand-off between goroutines (the caller,
// the sequence-number generator, the writer) and a write system call of
// its own, and every reply a wake-up through the network poller, the
// reader goroutine and a channel. That costs little on a normal kernel, but
// under gVisor, which traps every system call and futex wake-up, a click
// (motion, press, release and a round trip) cost 4 ms in the sandbox for
// 0.15 ms outside. Here a click is one write of the four requests (so the
// server also wakes once for them) and a blocking read of the reply.
//
// Requests on two connections are not ordered against each other, so
// every action syncs before it returns: whatever the agent sends next on
// the main connection (GetImage, QueryPointer, ChangeKeyboardMapping)
// reaches the server after the input. Keyboard mapping changes are sent on
// the main connection and checked (a round trip) before any event that
// uses them is queued here.
type xinput struct {
	mu    sync.Mutex
	rw    io.ReadWriteCloser
	xtest byte // major opcode of XTEST
	root  xproto.Window
	out   []byte // queued requests
	seq   uint16 // sequence number of the last request queued
	in    [32]byte
	err   error // the connection is broken
}

// dialInput opens the input connection to display, authenticating the way
// xgb does. xtestOpcode is XTEST's major opcode, learned on the main
// connection (extension opcodes belong to the server, not the connection).
func dialInput(display string, xtestOpcode byte, root xproto.Window) (*xinput, error) {
	a, err := parseDisplay(display)
	if err != nil {
		return nil, err
	}
	var rw io.ReadWriteCloser
	if a.network == "unix" {
		rw, err = dialUnixBlocking(a.address)
	} else {
		rw, err = net.Dial(a.network, a.address)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to X display %q: %w", display, err)
	}
	if err := handshake(rw, a.host, a.number); err != nil {
		rw.Close()
		return nil, fmt.Errorf("set up input connection to X display %q: %w", display, err)
	}
	return &xinput{rw: rw, xtest: xtestOpcode, root: root, out: make([]byte, 0, 256)}, nil
}

func (c *xinput) fake(typ, detail byte, x, y int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var r [36]byte // xtest FakeInput
	r[0], r[1] = c.xtest, 2
	binary.LittleEndian.PutUint16(r[2:], uint16(len(r)/4))
	r[4], r[5] = typ, detail
	// r[8:12] time: CurrentTime (0)
	binary.LittleEndian.PutUint32(r[12:], uint32(c.root))
	binary.LittleEndian.PutUint16(r[24:], uint16(int16(x)))
	binary.LittleEndian.PutUint16(r[26:], uint16(int16(y)))
	// r[35] device: none (0)
	c.out = append(c.out, r[:]...)
	c.seq++
}

func (c *xinput) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flushLocked()
}

func (c *xinput) flushLocked() error {
	if c.err != nil {
		return c.err
	}
	out := c.out
	c.out = c.out[:0]
	for len(out) > 0 {
		n, err := c.rw.Write(out)
		if err != nil {
			c.err = fmt.Errorf("write to the X server: %w", err)
			return c.err
		}
		out = out[n:]
	}
	return nil
}

// sync sends the queue and a GetInputFocus, and reads until its reply.
// Errors the server reports for the events are dropped, as they were when
// xgb sent them unchecked; events (MappingNotify goes to every client) are
// skipped.
func (c *xinput) sync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out = append(c.out, 43, 0, 1, 0) // GetInputFocus
	c.seq++
	want := c.seq
	if err := c.flushLocked(); err != nil {
		return err
	}
	for {
		if _, err := io.ReadFull(c.rw, c.in[:]); err != nil {
			c.err = fmt.Errorf("read from the X server: %w", err)
			return c.err
		}
		extra := 0
		switch c.in[0] {
		case 0: // error
		case 1: // reply
			extra = 4 * int(binary.LittleEndian.Uint32(c.in[4:]))
		default: // event
			if c.in[0]&0x7f == xproto.GeGeneric {
				extra = 4 * int(binary.LittleEndian.Uint32(c.in[4:]))
			}
		}
		if extra > 0 {
			if _, err := io.CopyN(io.Discard, c.rw, int64(extra)); err != nil {
				c.err = fmt.Errorf("read from the X server: %w", err)
				return c.err
			}
		}
		if c.in[0] == 1 && binary.LittleEndian.Uint16(c.in[2:]) == want {
			return nil
		}
	}
}

func (c *xinput) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = errors.New("the input connection is closed")
	}
	c.rw.Close()
}

// xgbInput sends input through the main xgb connection: the fallback when
// the input connection cannot be opened.
type xgbInput struct {
	conn *xgb.Conn
	root xproto.Window
}

func (x xgbInput) fake(typ, detail byte, px, py int) {
	xtest.FakeInput(x.conn, typ, detail, xproto.TimeCurrentTime, x.root, int16(px), int16(py), 0)
}

func (x xgbInput) flush() error { return nil } // xgb writes each request at once

func (x xgbInput) sync() error {
	if _, err := xproto.GetInputFocus(x.conn).Reply(); err != nil {
		return fmt.Errorf("round trip to the X server: %w", err)
	}
	return nil
}

func (x xgbInput) close() {}

// displayAddr is where a display name points, as xgb reads it.
type displayAddr struct {
	network, address string
	host             string // for the Xauthority lookup; "" for local
	number           string // display number
}

// parseDisplay reads a display name the way xgb's dial does: ":1", ":1.0",
// "unix:1", "/path/to/socket:1", "host:1", "tcp/host:1"; "" is $DISPLAY.
func parseDisplay(display string) (displayAddr, error) {
	if display == "" {
		display = os.Getenv("DISPLAY")
	}
	orig := display
	bad := fmt.Errorf("bad display string %q", orig)
	colon := strings.LastIndex(display, ":")
	if colon < 0 {
		return displayAddr{}, bad
	}
	var a displayAddr
	var socket, protocol string
	if display[0] == '/' {
		socket = display[:colon]
	} else if slash := strings.LastIndex(display[:colon], "/"); slash >= 0 {
		protocol, a.host = display[:slash], display[slash+1:colon]
	} else {
		a.host = display[:colon]
	}
	num := display[colon+1:]
	if dot := strings.LastIndex(num, "."); dot >= 0 {
		num = num[:dot]
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 {
		return displayAddr{}, bad
	}
	a.number = num
	switch {
	case socket != "":
		a.network, a.address = "unix", socket+":"+num
	case a.host != "" && a.host != "unix":
		if protocol == "" {
			protocol = "tcp"
		}
		a.network, a.address = protocol, net.JoinHostPort(a.host, strconv.Itoa(6000+n))
	default:
		a.host = ""
		a.network, a.address = "unix", "/tmp/.X11-unix/X"+num
	}
	return a, nil
}

// fdConn is a blocking unix socket used with plain read and write system
// calls: a reply costs one blocking read instead of a trip through the
// network poller.
type fdConn struct{ fd int }

func dialUnixBlocking(path string) (*fdConn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &fdConn{fd: fd}, nil
}

func (c *fdConn) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(c.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *fdConn) Write(p []byte) (int, error) {
	for {
		n, err := unix.Write(c.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, nil
	}
}

func (c *fdConn) Close() error {
	// Shutdown wakes a read blocked on the socket, which close alone may not.
	_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
	return unix.Close(c.fd)
}

// handshake sets up an X connection on rw (little-endian, protocol 11.0)
// with the MIT-MAGIC-COOKIE-1 cookie from the Xauthority file when it has
// one for the display, as xgb does, and skips the server's setup data.
func handshake(rw io.ReadWriter, host, number string) error {
	name, data, err := readAuthority(host, number)
	if err != nil {
		name, data = "", nil // try without, like xgb
	} else if name != "MIT-MAGIC-COOKIE-1" || len(data) != 16 {
		return fmt.Errorf("unsupported auth protocol %q", name)
	}
	req := make([]byte, 12+pad4(len(name))+pad4(len(data)))
	req[0] = 'l'
	binary.LittleEndian.PutUint16(req[2:], 11)
	binary.LittleEndian.PutUint16(req[6:], uint16(len(name)))
	binary.LittleEndian.PutUint16(req[8:], uint16(len(data)))
	copy(req[12:], name)
	copy(req[12+pad4(len(name)):], data)
	if _, err := rw.Write(req); err != nil {
		return err
	}
	var head [8]byte
	if _, err := io.ReadFull(rw, head[:]); err != nil {
		return err
	}
	rest := make([]byte, 4*int(binary.LittleEndian.Uint16(head[6:])))
	if _, err := io.ReadFull(rw, rest); err != nil {
		return err
	}
	if head[0] != 1 {
		reason := rest
		if n := int(head[1]); head[0] == 0 && n <= len(rest) {
			reason = rest[:n]
		}
		return fmt.Errorf("connection refused by the X server: %s", strings.TrimSpace(string(reason)))
	}
	return nil
}

func pad4(n int) int { return (n + 3) &^ 3 }

// readAuthority finds the cookie for host (""/"localhost": this machine)
// and display number in $XAUTHORITY or ~/.Xauthority, matching entries the
// way xgb does.
func readAuthority(host, number string) (name string, data []byte, err error) {
	const familyLocal, familyWild = 256, 65535
	if host == "" || host == "localhost" {
		if host, err = os.Hostname(); err != nil {
			return "", nil, err
		}
	}
	fname := os.Getenv("XAUTHORITY")
	if fname == "" {
		home := os.Getenv("HOME")
		if home == "" {
			return "", nil, errors.New("no Xauthority: $XAUTHORITY and $HOME are unset")
		}
		fname = home + "/.Xauthority"
	}
	b, err := os.ReadFile(fname)
	if err != nil {
		return "", nil, err
	}
	field := func() ([]byte, bool) {
		if len(b) < 2 {
			return nil, false
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n {
			return nil, false
		}
		f := b[2 : 2+n]
		b = b[2+n:]
		return f, true
	}
	for len(b) >= 2 {
		family := binary.BigEndian.Uint16(b)
		b = b[2:]
		addr, ok1 := field()
		disp, ok2 := field()
		nm, ok3 := field()
		dt, ok4 := field()
		if !ok1 || !ok2 || !ok3 || !ok4 {
			break
		}
		if (family == familyWild || family == familyLocal && string(addr) == host) &&
			(len(disp) == 0 || string(disp) == number) {
			return string(nm), dt, nil
		}
	}
	return "", nil, errors.New("no matching Xauthority entry")
}
