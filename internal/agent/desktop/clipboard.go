package desktop

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// CapClipboard: the agent reads and writes the CLIPBOARD selection
// (clipboard_get, clipboard_set).
const CapClipboard = "clipboard"

// clipboardTimeout bounds each wait on the X server or another client: the
// answer to a conversion, each chunk of an incremental transfer, a
// timestamp. An application that holds the clipboard but does not answer
// (hung, or stopped in a debugger) fails the action after this long
// rather than tying up the desktop. A variable for tests.
var clipboardTimeout = 5 * time.Second

// propertyChunkWords is how much of a property one GetProperty reads
// (4 bytes a word): 256 KiB, the most X sends in one piece by default.
const propertyChunkWords = 1 << 16

// clipboard is the agent's side of the X selection protocol (ICCCM §2) for
// the CLIPBOARD selection, on the desktop's own connection.
//
// One unmapped InputOnly window is both the owner and the requestor. To
// set the clipboard the agent becomes the selection's owner and answers
// SelectionRequest events with the text (TARGETS, TIMESTAMP, UTF8_STRING,
// text/plain;charset=utf-8 and STRING) until SelectionClear says another
// client has taken it. To read it the agent asks the owner to convert the
// selection into a property of the window, waits for SelectionNotify, and
// reads the property, following an incremental (INCR) transfer when the
// owner sends one.
//
// The desktop's event loop hands the clipboard its events (event). It
// answers requests there, with requests that need no reply, so that it
// never waits on the server from the loop; get and set run on the
// caller's goroutine and receive the events they wait for through evs.
// No goroutine of its own: when the connection closes, the event loop ends,
// done is closed, waits return, and the server drops the window and the
// ownership with the connection.
type clipboard struct {
	conn  *xgb.Conn
	win   xproto.Window
	atoms clipAtoms
	done  <-chan struct{} // closed when the event loop ends
	evs   chan xgb.Event  // SelectionNotify and PropertyNotify of win

	// opMu lets one get or set run at a time: they share win's
	// property and evs.
	opMu sync.Mutex

	mu    sync.Mutex
	owned bool             // the agent owns CLIPBOARD
	text  []byte           // what it serves, UTF-8
	since xproto.Timestamp // when it took ownership
}

type clipAtoms struct {
	clipboard, targets, timestamp, utf8, textPlainUTF8, incr xproto.Atom

	// prop is the property conversions are delivered into; stamp the
	// one changed to learn the server's time.
	prop, stamp xproto.Atom
}

// errClipboardClosed ends a wait when the connection closes; it wraps
// net.ErrClosed so that the service answers it as the display going away
// (unavailable, retry) like any other broken X connection.
var errClipboardClosed = fmt.Errorf("the X connection closed: %w", net.ErrClosed)

// newClipboard makes the clipboard's window. done is closed when the
// connection's event loop ends.
func newClipboard(conn *xgb.Conn, root xproto.Window, done <-chan struct{}) (*clipboard, error) {
	names := []string{"CLIPBOARD", "TARGETS", "TIMESTAMP", "UTF8_STRING", "text/plain;charset=utf-8", "INCR",
		"_CUBICLE_CLIPBOARD", "_CUBICLE_CLIPBOARD_TIME"}
	cookies := make([]xproto.InternAtomCookie, len(names))
	for i, n := range names {
		cookies[i] = xproto.InternAtom(conn, false, uint16(len(n)), n)
	}
	got := make([]xproto.Atom, len(names))
	for i, c := range cookies {
		r, err := c.Reply()
		if err != nil {
			return nil, fmt.Errorf("intern atom %s: %w", names[i], err)
		}
		got[i] = r.Atom
	}
	c := &clipboard{
		conn:  conn,
		atoms: clipAtoms{got[0], got[1], got[2], got[3], got[4], got[5], got[6], got[7]},
		done:  done,
		evs:   make(chan xgb.Event, 64),
	}
	var err error
	if c.win, err = xproto.NewWindowId(conn); err != nil {
		return nil, fmt.Errorf("allocate the clipboard window: %w", err)
	}
	// PropertyChange: conversions and INCR chunks arrive as property
	// changes, and changing a property is how the agent learns the time.
	err = xproto.CreateWindowChecked(conn, 0, c.win, root, -1, -1, 1, 1, 0, xproto.WindowClassInputOnly, 0,
		xproto.CwOverrideRedirect|xproto.CwEventMask, []uint32{1, xproto.EventMaskPropertyChange}).Check()
	if err != nil {
		return nil, fmt.Errorf("create the clipboard window: %w", err)
	}
	return c, nil
}

// event handles one event of the connection and reports whether it was
// the clipboard's. It runs on the event loop only and never waits for a
// reply.
func (c *clipboard) event(ev xgb.Event) bool {
	switch e := ev.(type) {
	case xproto.SelectionRequestEvent:
		if e.Owner != c.win {
			return false
		}
		c.serve(e)
	case xproto.SelectionClearEvent:
		if e.Owner != c.win {
			return false
		}
		c.mu.Lock()
		// A clear from before the agent took the selection again (its
		// time is the new owner's, earlier than ours) is stale.
		if e.Selection == c.atoms.clipboard && !before(e.Time, c.since) {
			c.owned, c.text = false, nil
		}
		c.mu.Unlock()
	case xproto.SelectionNotifyEvent:
		if e.Requestor != c.win {
			return false
		}
		c.deliver(ev)
	case xproto.PropertyNotifyEvent:
		if e.Window != c.win {
			return false
		}
		c.deliver(ev)
	default:
		return false
	}
	return true
}

// deliver passes an event to the operation waiting for it. Without one the
// buffer fills with what nobody wants, so a full buffer drops the event:
// an operation drains it before it starts.
func (c *clipboard) deliver(ev xgb.Event) {
	select {
	case c.evs <- ev:
	default:
	}
}

func (c *clipboard) drain() {
	for {
		select {
		case <-c.evs:
		default:
			return
		}
	}
}

// before reports whether X timestamp a is earlier than b. Timestamps are
// milliseconds that wrap around every 49.7 days; the difference tells.
func before(a, b xproto.Timestamp) bool { return int32(a-b) < 0 }

// serve answers a request for the selection: it writes the text in the
// form asked for to the requestor's property and tells the requestor, or
// tells it the conversion was refused (property None).
func (c *clipboard) serve(e xproto.SelectionRequestEvent) {
	prop := e.Property
	if prop == xproto.AtomNone {
		prop = e.Target // an obsolete requestor (ICCCM §2.2)
	}
	c.mu.Lock()
	owned, text, since := c.owned, c.text, c.since
	c.mu.Unlock()
	ok := owned && e.Selection == c.atoms.clipboard &&
		(e.Time == xproto.TimeCurrentTime || !before(e.Time, since))
	if ok {
		ok = c.convert(e.Requestor, prop, e.Target, text, since)
	}
	if !ok {
		prop = xproto.AtomNone
	}
	n := xproto.SelectionNotifyEvent{Time: e.Time, Requestor: e.Requestor, Selection: e.Selection,
		Target: e.Target, Property: prop}
	// Unchecked: a requestor that went away makes a BadWindow error,
	// which the event loop drops.
	xproto.SendEvent(c.conn, false, e.Requestor, xproto.EventMaskNoEvent, string(n.Bytes()))
}

// convert writes text as target to the property prop of win and reports
// whether it knows the target. The text fits one request
// (action.MaxClipboardBytes), so it never needs an INCR transfer.
func (c *clipboard) convert(win xproto.Window, prop, target xproto.Atom, text []byte, since xproto.Timestamp) bool {
	switch target {
	case c.atoms.targets:
		list := []xproto.Atom{c.atoms.targets, c.atoms.timestamp, c.atoms.utf8, c.atoms.textPlainUTF8, xproto.AtomString}
		data := make([]byte, 4*len(list))
		for i, a := range list {
			binary.LittleEndian.PutUint32(data[4*i:], uint32(a))
		}
		xproto.ChangeProperty(c.conn, xproto.PropModeReplace, win, prop, xproto.AtomAtom, 32, uint32(len(list)), data)
	case c.atoms.timestamp:
		data := binary.LittleEndian.AppendUint32(nil, uint32(since))
		xproto.ChangeProperty(c.conn, xproto.PropModeReplace, win, prop, xproto.AtomInteger, 32, 1, data)
	case c.atoms.utf8, c.atoms.textPlainUTF8:
		xproto.ChangeProperty(c.conn, xproto.PropModeReplace, win, prop, target, 8, uint32(len(text)), text)
	case xproto.AtomString:
		data := toLatin1(text)
		xproto.ChangeProperty(c.conn, xproto.PropModeReplace, win, prop, xproto.AtomString, 8, uint32(len(data)), data)
	default:
		return false
	}
	return true
}

// toLatin1 is text as ISO Latin-1 (STRING), for the old clients that ask
// for nothing else: a character Latin-1 lacks becomes '?', and so does a
// control character other than tab and newline, which STRING excludes.
func toLatin1(text []byte) []byte {
	out := make([]byte, 0, len(text))
	for _, r := range string(text) {
		switch {
		case r == '\t' || r == '\n' || (r >= 0x20 && r < 0x7f) || (r >= 0xa0 && r <= 0xff):
			out = append(out, byte(r))
		default:
			out = append(out, '?')
		}
	}
	return out
}

// set makes the agent the owner of CLIPBOARD, serving text.
func (c *clipboard) set(ctx context.Context, text string) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.drain()
	// ICCCM §2.1: take the selection with the time of a real event, not
	// CurrentTime, so that requests and clears can be ordered against it.
	t, err := c.serverTime(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.owned, c.text, c.since = true, []byte(text), t
	c.mu.Unlock()
	if err := xproto.SetSelectionOwnerChecked(c.conn, c.win, c.atoms.clipboard, t).Check(); err != nil {
		return fmt.Errorf("take the clipboard: %w", err)
	}
	r, err := xproto.GetSelectionOwner(c.conn, c.atoms.clipboard).Reply()
	if err != nil {
		return fmt.Errorf("check the clipboard's owner: %w", err)
	}
	if r.Owner != c.win {
		// The server kept an owner that took the selection later than
		// the time we asked with.
		c.mu.Lock()
		if c.since == t {
			c.owned, c.text = false, nil
		}
		c.mu.Unlock()
		return fmt.Errorf("the clipboard stayed with window 0x%x, which took it at the same moment", r.Owner)
	}
	return nil
}

// serverTime returns the X server's time: it appends nothing to a
// property of the window and takes the time of the PropertyNotify.
func (c *clipboard) serverTime(ctx context.Context) (xproto.Timestamp, error) {
	xproto.ChangeProperty(c.conn, xproto.PropModeAppend, c.win, c.atoms.stamp, xproto.AtomInteger, 32, 0, nil)
	ev, err := c.wait(ctx, "the X server", xproto.WindowNone, func(ev xgb.Event) bool {
		e, ok := ev.(xproto.PropertyNotifyEvent)
		return ok && e.Atom == c.atoms.stamp
	})
	if err != nil {
		return 0, err
	}
	return ev.(xproto.PropertyNotifyEvent).Time, nil
}

// ownerPoll is how often a wait on the clipboard's owner checks that it
// still is the owner: an application that quits (or copies anew) while
// asked for its text never answers the request it was sent.
const ownerPoll = 200 * time.Millisecond

// errOwnerChanged: the clipboard changed hands during a read.
var errOwnerChanged = errors.New("the clipboard changed hands")

// wait returns the first event that match accepts, dropping the others,
// within clipboardTimeout. what names who is to answer, for the error.
// With an owner other than None it fails with errOwnerChanged as soon as
// the clipboard is no longer that window's.
func (c *clipboard) wait(ctx context.Context, what string, owner xproto.Window, match func(xgb.Event) bool) (xgb.Event, error) {
	timer := time.NewTimer(clipboardTimeout)
	defer timer.Stop()
	var poll <-chan time.Time
	if owner != xproto.WindowNone {
		t := time.NewTicker(ownerPoll)
		defer t.Stop()
		poll = t.C
	}
	for {
		select {
		case ev := <-c.evs:
			if match(ev) {
				return ev, nil
			}
		case <-poll:
			r, err := xproto.GetSelectionOwner(c.conn, c.atoms.clipboard).Reply()
			if err != nil {
				return nil, fmt.Errorf("get the clipboard's owner: %w", err)
			}
			if r.Owner != owner {
				return nil, errOwnerChanged
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.done:
			return nil, errClipboardClosed
		case <-timer.C:
			return nil, &action.Error{Msg: fmt.Sprintf("%s did not answer within %v", what, clipboardTimeout)}
		}
	}
}

// get returns the text on CLIPBOARD: "" when nobody owns it or its owner
// has no text to give. When the clipboard changes hands during the read,
// it reads again from the new owner, a few times.
func (c *clipboard) get(ctx context.Context) (string, error) {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	for range 3 {
		text, err := c.getFrom(ctx)
		if !errors.Is(err, errOwnerChanged) {
			return text, err
		}
	}
	return "", &action.Error{Msg: "the clipboard kept changing hands while it was read; try again"}
}

func (c *clipboard) getFrom(ctx context.Context) (string, error) {
	r, err := xproto.GetSelectionOwner(c.conn, c.atoms.clipboard).Reply()
	if err != nil {
		return "", fmt.Errorf("get the clipboard's owner: %w", err)
	}
	if r.Owner == xproto.WindowNone {
		return "", nil
	}
	owner := r.Owner
	who := fmt.Sprintf("the application holding the clipboard (window 0x%x)", owner)
	// UTF8_STRING is what nearly every toolkit offers; the MIME name is
	// for those that offer only it, STRING for the oldest clients.
	for _, target := range []xproto.Atom{c.atoms.utf8, c.atoms.textPlainUTF8, xproto.AtomString} {
		c.drain()
		// Delete what a conversion that timed out may have left, so it
		// cannot pass for this one's answer.
		xproto.DeleteProperty(c.conn, c.win, c.atoms.prop)
		xproto.ConvertSelection(c.conn, c.win, c.atoms.clipboard, target, c.atoms.prop, xproto.TimeCurrentTime)
		ev, err := c.wait(ctx, who, owner, func(ev xgb.Event) bool {
			e, ok := ev.(xproto.SelectionNotifyEvent)
			return ok && e.Selection == c.atoms.clipboard && e.Target == target
		})
		if err != nil {
			return "", err
		}
		if ev.(xproto.SelectionNotifyEvent).Property == xproto.AtomNone {
			continue // refused: try the next form
		}
		data, typ, err := c.read(ctx, who, owner)
		if err != nil {
			return "", err
		}
		return decodeText(data, typ), nil
	}
	return "", nil // the owner holds something else (an image, files)
}

// decodeText turns a converted property, as another client wrote it,
// into text: STRING is Latin-1, the rest UTF-8 (made valid). Trailing
// NULs, which some C programs send, are dropped.
func decodeText(data []byte, typ xproto.Atom) string {
	s := strings.TrimRight(string(data), "\x00")
	if typ == xproto.AtomString {
		return latin1(s)
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return s
}

// read reads and deletes the converted property, following an INCR
// transfer: deleting the INCR property asks the owner for the first
// chunk, each chunk arrives as a new value of the property, deleting it
// asks for the next, and an empty one ends the transfer.
func (c *clipboard) read(ctx context.Context, who string, owner xproto.Window) ([]byte, xproto.Atom, error) {
	data, typ, err := c.readProperty(0)
	if err != nil || typ != c.atoms.incr {
		return data, typ, err
	}
	var out []byte
	for {
		_, err := c.wait(ctx, who, owner, func(ev xgb.Event) bool {
			e, ok := ev.(xproto.PropertyNotifyEvent)
			return ok && e.Atom == c.atoms.prop && e.State == xproto.PropertyNewValue
		})
		if err != nil {
			return nil, 0, err
		}
		chunk, ctyp, err := c.readProperty(len(out))
		if err != nil {
			return nil, 0, err
		}
		if len(chunk) == 0 {
			return out, typ, nil
		}
		out, typ = append(out, chunk...), ctyp
	}
}

// readProperty reads the whole converted property, in chunks, and deletes
// it (GetProperty deletes once the last byte is read). have is what an
// INCR transfer has read so far, which counts against the limit.
func (c *clipboard) readProperty(have int) ([]byte, xproto.Atom, error) {
	var out []byte
	var typ xproto.Atom
	for offset := uint32(0); ; {
		r, err := xproto.GetProperty(c.conn, true, c.win, c.atoms.prop, xproto.GetPropertyTypeAny, offset, propertyChunkWords).Reply()
		if err != nil {
			return nil, 0, fmt.Errorf("read the clipboard's text: %w", err)
		}
		typ = r.Type
		out = append(out, r.Value...)
		if have+len(out) > action.MaxClipboardReadBytes {
			xproto.DeleteProperty(c.conn, c.win, c.atoms.prop)
			return nil, 0, &action.Error{Msg: fmt.Sprintf("the clipboard holds more than %d bytes of text, the most clipboard_get reads", action.MaxClipboardReadBytes)}
		}
		if r.BytesAfter == 0 || len(r.Value) == 0 {
			return out, typ, nil
		}
		offset += uint32(len(r.Value)) / 4
	}
}

var errNoClipboard = errors.New("the clipboard is not available on this display")

// ClipboardGet returns the text of the CLIPBOARD selection, converted to
// UTF-8: "" when the clipboard is empty or holds no text. An owner that
// does not answer within 5 s, or holds more than
// action.MaxClipboardReadBytes, is an *action.Error. PRIMARY is not
// read.
func (d *Desktop) ClipboardGet(ctx context.Context) (string, error) {
	if d.clip == nil {
		return "", errNoClipboard
	}
	return d.clip.get(ctx)
}

// ClipboardSet puts text on the CLIPBOARD selection: the agent owns it
// and gives the text to every application that pastes, until one of them
// copies something else or the agent's X connection closes (the X server
// then empties the clipboard). PRIMARY, the selection a mouse selection
// sets and a middle click pastes, is left as it was. Callers check text
// (action.Normalize does).
func (d *Desktop) ClipboardSet(ctx context.Context, text string) error {
	if d.clip == nil {
		return errNoClipboard
	}
	return d.clip.set(ctx, text)
}
