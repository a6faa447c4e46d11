// Package desktop is the in-sandbox agent's native X11 desktop: screenshots
// (X GetImage, through MIT-SHM when the server allows it), input (XTEST fake
// events), the keyboard mapping, the window list, the clipboard (the X
// selection protocol, clipboard.go), and the Connect handler that serves
// them to the host (proto/desktop).
//
// It speaks the X protocol itself through github.com/jezek/xgb, a pure-Go X
// client with no cgo, so the agent stays one static binary that runs in any
// image, and no action costs a subprocess (xdotool, scrot).
//
// Only the agent (cmd/cubicle-agent and internal/agent/...) imports it. It
// imports nothing from internal/ except internal/action.
package desktop

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/shm"
	"github.com/jezek/xgb/xfixes"
	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"
)

// Capabilities reported by Capabilities.
const (
	CapXTEST  = "xtest"  // input through fake events (always present)
	CapSHM    = "shm"    // screenshots through a shared-memory segment
	CapXFixes = "xfixes" // the real cursor image can be drawn into screenshots
)

// Desktop is one connection to an X server. It is safe for concurrent use:
// input actions run one at a time, screenshots run beside them.
type Desktop struct {
	conn    *xgb.Conn
	display string
	root    xproto.Window
	width   int
	height  int
	pix     pixelLayout
	xfixes  bool
	atoms   atoms

	// inputMu serializes input so that concurrent actions do not interleave
	// their presses and releases.
	inputMu sync.Mutex
	in      inputSink
	keys    *keyboard
	buttons [10]bool // buttons 1..9 left down by mouse_down

	// shotMu guards the shared-memory segment, which one capture uses at a
	// time; seg is nil when MIT-SHM is unavailable.
	shotMu sync.Mutex
	seg    *shmSegment

	// track follows damage on the screen (nil without DAMAGE); shots
	// keeps the last screenshots, good while no damage arrives.
	track *damageTracker
	shots shotCache

	// clip reads and owns the CLIPBOARD selection (nil if its window
	// could not be made).
	clip *clipboard

	ready     atomic.Bool
	closeOnce sync.Once
	events    chan struct{} // closed when the event loop ends
}

// inputViaXGB makes Open skip the input connection (tests of the fallback).
var inputViaXGB = false

// Open connects to the X server at display (":1"; "" means $DISPLAY) and
// sets up XTEST, MIT-SHM, XFIXES and DAMAGE. XTEST is required; the
// others are used when available (DAMAGE lets screenshots wait for a quiet
// screen and reuse an encoding while nothing changed). Open does not
// retry: waiting for a starting server is the caller's job.
func Open(display string) (*Desktop, error) {
	conn, err := xgb.NewConnDisplay(display)
	if err != nil {
		return nil, fmt.Errorf("connect to X display %q: %w", display, err)
	}
	d, err := setup(conn, display)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return d, nil
}

func setup(conn *xgb.Conn, display string) (*Desktop, error) {
	info := xproto.Setup(conn)
	if len(info.Roots) == 0 {
		return nil, errors.New("the X server has no screens")
	}
	scr := info.DefaultScreen(conn)
	pix, err := layoutFor(info, scr)
	if err != nil {
		return nil, err
	}
	if err := xtest.Init(conn); err != nil {
		return nil, fmt.Errorf("the X server lacks the XTEST extension: %w", err)
	}
	if _, err := xtest.GetVersion(conn, 2, 2).Reply(); err != nil {
		return nil, fmt.Errorf("query XTEST version: %w", err)
	}
	d := &Desktop{
		conn:    conn,
		display: display,
		root:    scr.Root,
		width:   int(scr.WidthInPixels),
		height:  int(scr.HeightInPixels),
		pix:     pix,
		events:  make(chan struct{}),
	}
	d.keys = newKeyboard(d, info.MinKeycode, info.MaxKeycode)
	if d.atoms, err = internAtoms(conn); err != nil {
		return nil, err
	}
	if xfixes.Init(conn) == nil {
		if _, err := xfixes.QueryVersion(conn, 4, 0).Reply(); err == nil {
			d.xfixes = true
		}
	}
	// Without DAMAGE (or its window) a settle cannot be observed and no
	// encoding is reused: screenshots capture at once, every time.
	d.track, _ = newDamageTracker(conn, d.root, d.atoms.fence)
	// Without it (it fails only if the server refuses a window) the
	// clipboard actions fail and the rest works.
	if clip, err := newClipboard(conn, d.root, d.events); err == nil {
		d.clip = clip
	}
	if shm.Init(conn) == nil {
		// A failure here (no SysV IPC, as under some sandboxes, or a server
		// that cannot attach our segment) leaves plain GetImage in use.
		d.seg, _ = newShmSegment(conn, d.width*d.height*4)
	}
	// Input goes through a connection of its own when one can be opened
	// (see xinput), else through this one.
	conn.ExtLock.RLock()
	opcode := conn.Extensions["XTEST"]
	conn.ExtLock.RUnlock()
	d.in = xgbInput{conn: conn, root: d.root}
	if !inputViaXGB {
		if in, err := dialInput(display, opcode, d.root); err == nil {
			d.in = in
		}
	}
	go d.eventLoop()
	return d, nil
}

// eventLoop drains the connection's events, which xgb otherwise buffers
// until it blocks every reply, drops the cached keyboard mapping when the
// mapping changes, hands damage and fences to the tracker and selection
// traffic to the clipboard. It ends when the connection closes.
func (d *Desktop) eventLoop() {
	defer close(d.events)
	if d.track != nil {
		defer d.track.close()
	}
	for {
		ev, err := d.conn.WaitForEvent()
		if ev == nil && err == nil {
			return
		}
		if d.track != nil && d.track.event(ev) {
			continue
		}
		if d.clip != nil && d.clip.event(ev) {
			continue
		}
		if _, ok := ev.(xproto.MappingNotifyEvent); ok {
			d.keys.invalidate()
		}
	}
}

// Close releases the keys and buttons that key_down and mouse_down left
// pressed, restores the keyboard mapping, detaches the shared memory and
// closes the connection. It is safe to call more than once.
func (d *Desktop) Close() error {
	d.closeOnce.Do(func() {
		d.inputMu.Lock()
		d.keys.releaseAll()
		for b, down := range d.buttons {
			if down {
				d.fake(xproto.ButtonRelease, byte(b), 0, 0)
			}
		}
		d.keys.restore(true)
		_ = d.sync()
		d.in.close()
		d.inputMu.Unlock()
		d.shotMu.Lock()
		if d.seg != nil {
			d.seg.close(d.conn)
			d.seg = nil
		}
		d.shotMu.Unlock()
		d.conn.Close()
		<-d.events
	})
	return nil
}

// Display returns the display name Open was given.
func (d *Desktop) Display() string { return d.display }

// Size returns the screen size in pixels.
func (d *Desktop) Size() (width, height int) { return d.width, d.height }

// Ready reports whether a screenshot has succeeded on this connection.
func (d *Desktop) Ready() bool { return d.ready.Load() }

// Capabilities lists what this connection can do: CapXTEST, and CapSHM,
// CapXFixes, CapDamage and CapClipboard when the server supports them.
func (d *Desktop) Capabilities() []string {
	caps := []string{CapXTEST}
	d.shotMu.Lock()
	if d.seg != nil {
		caps = append(caps, CapSHM)
	}
	d.shotMu.Unlock()
	if d.xfixes {
		caps = append(caps, CapXFixes)
	}
	if d.track != nil {
		caps = append(caps, CapDamage)
	}
	if d.clip != nil {
		caps = append(caps, CapClipboard)
	}
	return caps
}

// sync sends the queued input and makes a round trip, so every event sent
// before it has been processed by the server when it returns.
func (d *Desktop) sync() error { return d.in.sync() }

type atoms struct {
	clientList, activeWindow, netWMName, utf8String, wmState xproto.Atom
	wmProtocols, wmDeleteWindow, netWMPid                    xproto.Atom
	fence                                                    xproto.Atom
}

func internAtoms(conn *xgb.Conn) (atoms, error) {
	names := []string{"_NET_CLIENT_LIST", "_NET_ACTIVE_WINDOW", "_NET_WM_NAME", "UTF8_STRING", "WM_STATE",
		"WM_PROTOCOLS", "WM_DELETE_WINDOW", "_NET_WM_PID", "_CUBICLE_FENCE"}
	cookies := make([]xproto.InternAtomCookie, len(names))
	for i, n := range names {
		cookies[i] = xproto.InternAtom(conn, false, uint16(len(n)), n)
	}
	got := make([]xproto.Atom, len(names))
	for i, c := range cookies {
		r, err := c.Reply()
		if err != nil {
			return atoms{}, fmt.Errorf("intern atom %s: %w", names[i], err)
		}
		got[i] = r.Atom
	}
	return atoms{got[0], got[1], got[2], got[3], got[4], got[5], got[6], got[7], got[8]}, nil
}
