package desktop

import (
	"bufio"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

func TestMain(m *testing.M) {
	// xgb logs every connection made without an Xauthority file.
	xgb.Logger = log.New(io.Discard, "", 0)
	os.Exit(m.Run())
}

// startXvfb starts a 1024x768x24 Xvfb on a free display (Xvfb picks it and
// reports it through -displayfd) and stops it when the test ends.
func startXvfb(tb testing.TB) string {
	tb.Helper()
	needs.Xvfb(tb)
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("Xvfb", "-displayfd", "3", "-screen", "0", "1024x768x24", "-nolisten", "tcp", "-noreset")
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start Xvfb: %v", err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		r.Close()
		line <- strings.TrimSpace(s)
	}()
	select {
	case n := <-line:
		if n == "" {
			tb.Fatal("Xvfb exited without reporting a display")
		}
		return ":" + n
	case err := <-exited:
		tb.Fatalf("Xvfb exited: %v", err)
	case <-time.After(20 * time.Second):
		tb.Fatal("Xvfb did not start within 20s")
	}
	return ""
}

// openDesktop starts Xvfb and opens a Desktop on it.
func openDesktop(tb testing.TB) (*Desktop, string) {
	tb.Helper()
	display := startXvfb(tb)
	d, err := Open(display)
	if err != nil {
		tb.Fatalf("Open(%s): %v", display, err)
	}
	tb.Cleanup(func() { d.Close() })
	return d, display
}

// client is a second X connection playing an application: it owns a test
// window and records the events sent to it, translating key presses to
// runes with the keyboard mapping in force when each event is read.
type client struct {
	tb   testing.TB
	conn *xgb.Conn
	win  xproto.Window
	gc   xproto.Gcontext

	closed atomic.Bool

	mu     sync.Mutex
	events []xgb.Event
	typed  []rune
	keys   keymapCopy
	notify chan struct{}
}

type keymapCopy struct {
	min  xproto.Keycode
	per  int
	syms []xproto.Keysym
}

func (k *keymapCopy) load(conn *xgb.Conn) error {
	setup := xproto.Setup(conn)
	n := int(setup.MaxKeycode) - int(setup.MinKeycode) + 1
	r, err := xproto.GetKeyboardMapping(conn, setup.MinKeycode, byte(n)).Reply()
	if err != nil {
		return err
	}
	k.min, k.per, k.syms = setup.MinKeycode, int(r.KeysymsPerKeycode), r.Keysyms
	return nil
}

// keysym translates a key event the way Xlib does for the first group.
func (k *keymapCopy) keysym(code xproto.Keycode, state uint16) action.Keysym {
	i := int(code-k.min) * k.per
	if i < 0 || i+1 >= len(k.syms) {
		return 0
	}
	ks := k.syms[i]
	if state&xproto.ModMaskShift != 0 && k.syms[i+1] != 0 {
		ks = k.syms[i+1]
	}
	return action.Keysym(ks)
}

func newClient(tb testing.TB, display string, x, y, w, h int, title string) *client {
	tb.Helper()
	conn, err := xgb.NewConnDisplay(display)
	if err != nil {
		tb.Fatal(err)
	}
	c := &client{tb: tb, conn: conn, notify: make(chan struct{}, 1)}
	tb.Cleanup(func() {
		c.closed.Store(true)
		conn.Close()
	})
	if err := c.keys.load(conn); err != nil {
		tb.Fatal(err)
	}
	scr := xproto.Setup(conn).DefaultScreen(conn)
	c.win, err = xproto.NewWindowId(conn)
	if err != nil {
		tb.Fatal(err)
	}
	mask := uint32(xproto.EventMaskKeyPress | xproto.EventMaskKeyRelease | xproto.EventMaskButtonPress |
		xproto.EventMaskButtonRelease | xproto.EventMaskPointerMotion | xproto.EventMaskExposure |
		xproto.EventMaskStructureNotify)
	err = xproto.CreateWindowChecked(conn, scr.RootDepth, c.win, scr.Root, int16(x), int16(y), uint16(w), uint16(h), 0,
		xproto.WindowClassInputOutput, scr.RootVisual, xproto.CwBackPixel|xproto.CwEventMask,
		[]uint32{0xffffff, mask}).Check()
	if err != nil {
		tb.Fatal(err)
	}
	setProp := func(name, typ string, value []byte) {
		atom := internAtom(tb, conn, name)
		t := internAtom(tb, conn, typ)
		xproto.ChangeProperty(conn, xproto.PropModeReplace, c.win, atom, t, 8, uint32(len(value)), value)
	}
	setProp("_NET_WM_NAME", "UTF8_STRING", []byte(title))
	setProp("WM_NAME", "STRING", []byte("latin1 name"))
	setProp("WM_CLASS", "STRING", []byte("cubicletest\x00CubicleTest\x00"))
	c.gc, err = xproto.NewGcontextId(conn)
	if err != nil {
		tb.Fatal(err)
	}
	xproto.CreateGC(conn, c.gc, xproto.Drawable(c.win), 0, nil)
	go c.readEvents()
	xproto.MapWindow(conn, c.win)
	c.waitFor(func(ev xgb.Event) bool { _, ok := ev.(xproto.ExposeEvent); return ok })
	xproto.SetInputFocus(conn, xproto.InputFocusParent, c.win, xproto.TimeCurrentTime)
	c.sync()
	return c
}

func internAtom(tb testing.TB, conn *xgb.Conn, name string) xproto.Atom {
	r, err := xproto.InternAtom(conn, false, uint16(len(name)), name).Reply()
	if err != nil {
		tb.Fatal(err)
	}
	return r.Atom
}

func (c *client) sync() {
	if _, err := xproto.GetInputFocus(c.conn).Reply(); err != nil {
		c.tb.Fatal(err)
	}
}

func (c *client) readEvents() {
	for {
		ev, err := c.conn.WaitForEvent()
		if ev == nil && err == nil {
			return
		}
		if ev == nil {
			continue
		}
		c.mu.Lock()
		switch e := ev.(type) {
		case xproto.MappingNotifyEvent:
			// Reload now, in event order, as a client's Xlib would before
			// translating the next key event.
			if err := c.keys.load(c.conn); err != nil && !c.closed.Load() {
				c.tb.Errorf("reload keymap: %v", err)
			}
		case xproto.KeyPressEvent:
			if r, ok := action.KeysymRune(c.keys.keysym(e.Detail, e.State)); ok {
				c.typed = append(c.typed, r)
			}
		}
		c.events = append(c.events, ev)
		c.mu.Unlock()
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

// waitFor waits until an event that match accepts has arrived and returns
// it; it consumes the events up to and including it.
func (c *client) waitFor(match func(xgb.Event) bool) xgb.Event {
	c.tb.Helper()
	deadline := time.After(5 * time.Second)
	for {
		c.mu.Lock()
		for i, ev := range c.events {
			if match(ev) {
				c.events = c.events[i+1:]
				c.mu.Unlock()
				return ev
			}
		}
		c.mu.Unlock()
		select {
		case <-c.notify:
		case <-deadline:
			c.tb.Fatalf("timed out waiting for an event")
			return nil
		}
	}
}

// drain forgets the events received so far, after a round trip.
func (c *client) drain() {
	c.sync()
	time.Sleep(20 * time.Millisecond)
	c.mu.Lock()
	c.events = nil
	c.typed = nil
	c.mu.Unlock()
}

// waitTyped waits up to timeout for the window to have received exactly
// text, and fails the test if it does not.
func (c *client) waitTyped(text string, timeout time.Duration) {
	c.tb.Helper()
	c.sync()
	deadline := time.Now().Add(timeout)
	for c.typedText() != text && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := c.typedText(); got != text {
		c.tb.Errorf("typed %q, window got %q", text, got)
	}
}

// typedText returns the runes typed so far.
func (c *client) typedText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.typed)
}

// fill paints a rectangle of the window with an RGB color.
func (c *client) fill(x, y, w, h int, rgb uint32) {
	xproto.ChangeGC(c.conn, c.gc, xproto.GcForeground, []uint32{rgb})
	xproto.PolyFillRectangle(c.conn, xproto.Drawable(c.win), c.gc,
		[]xproto.Rectangle{{X: int16(x), Y: int16(y), Width: uint16(w), Height: uint16(h)}})
	c.sync()
}
