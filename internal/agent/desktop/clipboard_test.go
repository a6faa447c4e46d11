package desktop

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// selApp is a second X client playing an application that copies and
// pastes: it owns the clipboard with a serve function of the test's, or
// reads the clipboard the way a toolkit does.
type selApp struct {
	tb   testing.TB
	conn *xgb.Conn
	win  xproto.Window

	mu    sync.Mutex
	serve func(a *selApp, e xproto.SelectionRequestEvent)

	notes chan xproto.SelectionNotifyEvent
	props chan xproto.PropertyNotifyEvent // of windows not its own (INCR)
	own   chan xproto.PropertyNotifyEvent // of its window
	clear chan xproto.SelectionClearEvent
}

func newSelApp(tb testing.TB, display string) *selApp {
	tb.Helper()
	conn, err := xgb.NewConnDisplay(display)
	if err != nil {
		tb.Fatal(err)
	}
	a := &selApp{tb: tb, conn: conn,
		notes: make(chan xproto.SelectionNotifyEvent, 16), props: make(chan xproto.PropertyNotifyEvent, 256),
		own: make(chan xproto.PropertyNotifyEvent, 256), clear: make(chan xproto.SelectionClearEvent, 4)}
	done := make(chan struct{})
	tb.Cleanup(func() {
		conn.Close()
		<-done
	})
	scr := xproto.Setup(conn).DefaultScreen(conn)
	if a.win, err = xproto.NewWindowId(conn); err != nil {
		tb.Fatal(err)
	}
	err = xproto.CreateWindowChecked(conn, 0, a.win, scr.Root, 0, 0, 1, 1, 0, xproto.WindowClassInputOnly, 0,
		xproto.CwEventMask, []uint32{xproto.EventMaskPropertyChange}).Check()
	if err != nil {
		tb.Fatal(err)
	}
	go func() {
		defer close(done)
		defer close(a.props)
		for {
			ev, err := conn.WaitForEvent()
			if ev == nil && err == nil {
				return
			}
			switch e := ev.(type) {
			case xproto.SelectionRequestEvent:
				a.mu.Lock()
				serve := a.serve
				a.mu.Unlock()
				if serve != nil {
					serve(a, e)
				}
			case xproto.SelectionNotifyEvent:
				a.notes <- e
			case xproto.SelectionClearEvent:
				a.clear <- e
			case xproto.PropertyNotifyEvent:
				if e.Window == a.win {
					a.own <- e
				} else {
					a.props <- e
				}
			}
		}
	}()
	return a
}

// atom and atomName answer 0 and "" once the app's connection has
// closed: the serve functions call them on the app's event loop, where a
// test that closed the app may still be answering a request.
func (a *selApp) atom(name string) xproto.Atom {
	r, err := xproto.InternAtom(a.conn, false, uint16(len(name)), name).Reply()
	if err != nil {
		return 0
	}
	return r.Atom
}

func (a *selApp) atomName(atom xproto.Atom) string {
	if atom == xproto.AtomNone {
		return "None"
	}
	r, err := xproto.GetAtomName(a.conn, atom).Reply()
	if err != nil {
		return ""
	}
	return r.Name
}

// takeClipboard makes the app the clipboard's owner, answering requests
// with serve.
func (a *selApp) takeClipboard(serve func(a *selApp, e xproto.SelectionRequestEvent)) {
	a.tb.Helper()
	a.mu.Lock()
	a.serve = serve
	a.mu.Unlock()
	clip := a.atom("CLIPBOARD")
	xproto.SetSelectionOwner(a.conn, a.win, clip, xproto.TimeCurrentTime)
	if r, err := xproto.GetSelectionOwner(a.conn, clip).Reply(); err != nil || r.Owner != a.win {
		a.tb.Fatalf("the app could not take the clipboard: %v", err)
	}
}

// reply writes data as typ to the requestor's property and tells it.
func (a *selApp) reply(e xproto.SelectionRequestEvent, typ xproto.Atom, format byte, data []byte) {
	xproto.ChangeProperty(a.conn, xproto.PropModeReplace, e.Requestor, e.Property, typ, format, uint32(len(data))/uint32(format/8), data)
	a.notify(e, e.Property)
}

func (a *selApp) notify(e xproto.SelectionRequestEvent, prop xproto.Atom) {
	n := xproto.SelectionNotifyEvent{Time: e.Time, Requestor: e.Requestor, Selection: e.Selection, Target: e.Target, Property: prop}
	xproto.SendEvent(a.conn, false, e.Requestor, xproto.EventMaskNoEvent, string(n.Bytes()))
}

// serveText answers the targets in forms with text, and refuses the rest.
func serveText(forms map[string]string) func(a *selApp, e xproto.SelectionRequestEvent) {
	return func(a *selApp, e xproto.SelectionRequestEvent) {
		name := a.atomName(e.Target)
		if text, ok := forms[name]; ok {
			a.reply(e, e.Target, 8, []byte(text))
			return
		}
		a.notify(e, xproto.AtomNone)
	}
}

// serveINCR answers UTF8_STRING with an incremental transfer of text in
// chunks of chunk bytes, as GTK and Chromium do for large selections.
func serveINCR(text []byte, chunk int) func(a *selApp, e xproto.SelectionRequestEvent) {
	return func(a *selApp, e xproto.SelectionRequestEvent) {
		utf8Atom := a.atom("UTF8_STRING")
		if e.Target != utf8Atom {
			a.notify(e, xproto.AtomNone)
			return
		}
		// Follow the requestor's deletions of the property.
		xproto.ChangeWindowAttributes(a.conn, e.Requestor, xproto.CwEventMask, []uint32{xproto.EventMaskPropertyChange})
		size := make([]byte, 4)
		size[0], size[1], size[2] = byte(len(text)), byte(len(text)>>8), byte(len(text)>>16)
		a.reply(e, a.atom("INCR"), 32, size)
		// Each chunk waits for the requestor to delete what is there;
		// the app's end (props closed) ends an unfinished transfer.
		deleted := func() bool {
			for ev := range a.props {
				if ev.Window == e.Requestor && ev.Atom == e.Property && ev.State == xproto.PropertyDelete {
					return true
				}
			}
			return false
		}
		go func() {
			rest := text
			for deleted() {
				n := min(chunk, len(rest))
				xproto.ChangeProperty(a.conn, xproto.PropModeReplace, e.Requestor, e.Property, utf8Atom, 8, uint32(n), rest[:n])
				if n == 0 {
					return
				}
				rest = rest[n:]
			}
		}()
	}
}

// read asks for the clipboard as target, as a pasting application does,
// and returns the property's type name and value; ok is false when the
// owner refused.
func (a *selApp) read(target string) (typ string, data []byte, ok bool) {
	a.tb.Helper()
	prop := a.atom("APP_PASTE")
	xproto.ConvertSelection(a.conn, a.win, a.atom("CLIPBOARD"), a.atom(target), prop, xproto.TimeCurrentTime)
	select {
	case n := <-a.notes:
		if n.Property == xproto.AtomNone {
			return "", nil, false
		}
	case <-time.After(5 * time.Second):
		a.tb.Fatalf("no SelectionNotify for %s", target)
	}
	r, err := xproto.GetProperty(a.conn, true, a.win, prop, xproto.GetPropertyTypeAny, 0, 1<<20).Reply()
	if err != nil {
		a.tb.Fatal(err)
	}
	return a.atomName(r.Type), r.Value, true
}

func clipText(tb testing.TB, d *Desktop) string {
	tb.Helper()
	text, err := d.ClipboardGet(context.Background())
	if err != nil {
		tb.Fatalf("ClipboardGet: %v", err)
	}
	return text
}

// TestClipboardSet: what the agent puts on the clipboard, another client
// pastes in every form it offers, and the agent reads it back; a copy in
// another application takes the clipboard over, and a second set takes
// it back.
func TestClipboardSet(t *testing.T) {
	d, display := openDesktop(t)
	app := newSelApp(t, display)

	if got := clipText(t, d); got != "" {
		t.Errorf("fresh display: clipboard %q, want empty", got)
	}
	if !strings.Contains(strings.Join(d.Capabilities(), " "), CapClipboard) {
		t.Errorf("capabilities %v lack %s", d.Capabilities(), CapClipboard)
	}

	const text = "héllo ✓ 東京\n\ttab 😀"
	if _, err := d.Do(context.Background(), action.Action{Type: action.TypeClipboardSet, Text: text}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		target, typ, want string
	}{
		{"UTF8_STRING", "UTF8_STRING", text},
		{"text/plain;charset=utf-8", "text/plain;charset=utf-8", text},
		// Latin-1 for the oldest clients: what it lacks becomes '?'.
		{"STRING", "STRING", "h\xe9llo ? ??\n\ttab ?"},
	} {
		typ, data, ok := app.read(c.target)
		if !ok || typ != c.typ || string(data) != c.want {
			t.Errorf("paste as %s: %v %s %q, want %s %q", c.target, ok, typ, data, c.typ, c.want)
		}
	}
	typ, data, ok := app.read("TARGETS")
	var targets []string
	for i := 0; i+4 <= len(data); i += 4 {
		targets = append(targets, app.atomName(xproto.Atom(uint32(data[i])|uint32(data[i+1])<<8|uint32(data[i+2])<<16|uint32(data[i+3])<<24)))
	}
	if want := "TARGETS TIMESTAMP UTF8_STRING text/plain;charset=utf-8 STRING"; !ok || typ != "ATOM" || strings.Join(targets, " ") != want {
		t.Errorf("TARGETS: %v %s %q, want ATOM %q", ok, typ, targets, want)
	}
	if typ, data, ok := app.read("TIMESTAMP"); !ok || typ != "INTEGER" || len(data) != 4 {
		t.Errorf("TIMESTAMP: %v %s %x", ok, typ, data)
	}
	if _, _, ok := app.read("image/png"); ok {
		t.Error("the agent gave the text as image/png")
	}
	if got := clipText(t, d); got != text {
		t.Errorf("clipboard_get after clipboard_set: %q, want %q", got, text)
	}
	res, err := d.Do(context.Background(), action.Action{Type: action.TypeClipboardGet})
	if err != nil || res.GetType() != action.TypeClipboardGet || res.GetText() != text {
		t.Errorf("Do(clipboard_get) = %v, %v", res, err)
	}

	// Another application copies: it owns the clipboard now, and the
	// agent reads its text.
	app.takeClipboard(serveText(map[string]string{"UTF8_STRING": "copied in the app ✓"}))
	if got := clipText(t, d); got != "copied in the app ✓" {
		t.Errorf("after the app copied: %q", got)
	}
	waitUntil(t, "the agent lets go of the clipboard", func() bool {
		d.clip.mu.Lock()
		defer d.clip.mu.Unlock()
		return !d.clip.owned && d.clip.text == nil
	})

	// And the agent takes it back.
	if err := d.ClipboardSet(context.Background(), "second"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-app.clear:
	case <-time.After(5 * time.Second):
		t.Error("the app was not told it lost the clipboard")
	}
	if typ, data, ok := app.read("UTF8_STRING"); !ok || typ != "UTF8_STRING" || string(data) != "second" {
		t.Errorf("paste after the second set: %v %s %q", ok, typ, data)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClipboardGet reads what other applications hold, in the forms they
// offer.
func TestClipboardGet(t *testing.T) {
	d, display := openDesktop(t)
	big := bytes.Repeat([]byte("0123456789abcdé✓\n"), 40000) // 800 KB, more than one property read
	tests := []struct {
		name  string
		serve func(a *selApp, e xproto.SelectionRequestEvent)
		want  string
	}{
		{"UTF8_STRING", serveText(map[string]string{"UTF8_STRING": "ünïcödé 東京 ✓", "STRING": "wrong"}), "ünïcödé 東京 ✓"},
		{"MIME only", serveText(map[string]string{"text/plain;charset=utf-8": "mime ✓"}), "mime ✓"},
		{"STRING only", serveText(map[string]string{"STRING": "caf\xe9"}), "café"},
		{"trailing NUL", serveText(map[string]string{"UTF8_STRING": "c string\x00"}), "c string"},
		{"invalid UTF-8", serveText(map[string]string{"UTF8_STRING": "a\xffb"}), "a\uFFFDb"},
		{"no text", serveText(map[string]string{"image/png": "\x89PNG"}), ""},
		{"empty text", serveText(map[string]string{"UTF8_STRING": ""}), ""},
		{"INCR", serveINCR(big, 65536), string(big)},
		{"INCR small chunks", serveINCR([]byte("in ✓ pieces"), 3), "in ✓ pieces"},
		{"large property", func(a *selApp, e xproto.SelectionRequestEvent) {
			// Appended in pieces, as one request holds at most 256 KiB.
			for i := 0; i < len(big); i += 200000 {
				chunk := big[i:min(i+200000, len(big))]
				xproto.ChangeProperty(a.conn, xproto.PropModeAppend, e.Requestor, e.Property, e.Target, 8, uint32(len(chunk)), chunk)
			}
			a.notify(e, e.Property)
		}, string(big)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := newSelApp(t, display)
			app.takeClipboard(tt.serve)
			got := clipText(t, d)
			if got != tt.want {
				t.Errorf("clipboard_get: %d bytes %.60q, want %d bytes %.60q", len(got), got, len(tt.want), tt.want)
			}
		})
	}

	// An application that quits takes its clipboard with it.
	t.Run("owner gone", func(t *testing.T) {
		app := newSelApp(t, display)
		app.takeClipboard(serveText(map[string]string{"UTF8_STRING": "soon gone"}))
		app.conn.Close()
		waitUntil(t, "the clipboard is empty", func() bool { return clipText(t, d) == "" })
	})
	// One that quits when asked, without an answer: the read sees the
	// clipboard empty, without waiting for the answer that never comes.
	t.Run("owner quits when asked", func(t *testing.T) {
		app := newSelApp(t, display)
		app.takeClipboard(func(a *selApp, _ xproto.SelectionRequestEvent) { go a.conn.Close() })
		start := time.Now()
		if got := clipText(t, d); got != "" {
			t.Errorf("clipboard_get: %q, want empty", got)
		}
		if took := time.Since(start); took >= clipboardTimeout {
			t.Errorf("clipboard_get took %v: it waited for the owner that quit", took)
		}
	})
}

// TestClipboardGetErrors: an owner that never answers, and one that holds
// more than clipboard_get reads, fail the action with a message for the
// user (*action.Error) and leave the agent working.
func TestClipboardGetErrors(t *testing.T) {
	d, display := openDesktop(t)
	defer func(old time.Duration) { clipboardTimeout = old }(clipboardTimeout)
	clipboardTimeout = 300 * time.Millisecond
	huge := bytes.Repeat([]byte("x"), action.MaxClipboardReadBytes+1)
	for _, tt := range []struct {
		name  string
		serve func(a *selApp, e xproto.SelectionRequestEvent)
		want  string
	}{
		{"silent owner", func(*selApp, xproto.SelectionRequestEvent) {}, "did not answer"},
		{"too large", serveINCR(huge, 200000), "more than 1048576 bytes"},
		{"INCR stalls", func(a *selApp, e xproto.SelectionRequestEvent) {
			a.reply(e, a.atom("INCR"), 32, []byte{0, 0, 1, 0})
		}, "did not answer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			app := newSelApp(t, display)
			app.takeClipboard(tt.serve)
			start := time.Now()
			_, err := d.Do(context.Background(), action.Action{Type: action.TypeClipboardGet})
			var ae *action.Error
			if !errors.As(err, &ae) || !strings.Contains(ae.Msg, tt.want) {
				t.Errorf("clipboard_get: %v, want an *action.Error saying %q", err, tt.want)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("clipboard_get took %v", took)
			}
		})
	}
	// The agent still works.
	if err := d.ClipboardSet(context.Background(), "after"); err != nil {
		t.Fatal(err)
	}
	if got := clipText(t, d); got != "after" {
		t.Errorf("clipboard after the errors: %q", got)
	}
}

// TestClipboardClose: closing the desktop ends a read waiting on a silent
// owner at once, and lets go of the clipboard it owned.
func TestClipboardClose(t *testing.T) {
	display := startXvfb(t)
	d, err := Open(display)
	if err != nil {
		t.Fatal(err)
	}
	app := newSelApp(t, display)
	if err := d.ClipboardSet(context.Background(), "owned by the agent"); err != nil {
		t.Fatal(err)
	}
	if _, data, ok := app.read("UTF8_STRING"); !ok || string(data) != "owned by the agent" {
		t.Fatalf("paste: %v %q", ok, data)
	}
	d.Close()
	r, err := xproto.GetSelectionOwner(app.conn, app.atom("CLIPBOARD")).Reply()
	if err != nil || r.Owner != xproto.WindowNone {
		t.Errorf("after Close the clipboard's owner is 0x%x (%v), want none", r.Owner, err)
	}

	d, err = Open(display)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	app.takeClipboard(func(*selApp, xproto.SelectionRequestEvent) {}) // never answers
	got := make(chan error, 1)
	go func() {
		_, err := d.ClipboardGet(context.Background())
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // the read is waiting for the owner
	start := time.Now()
	d.Close()
	select {
	case err := <-got:
		if !displayGone(err) {
			t.Errorf("ClipboardGet on a closed desktop: %v, want the display gone (a retry helps)", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("ClipboardGet returned %v after Close", took)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("ClipboardGet still waits after Close")
	}
	if _, err := d.ClipboardGet(context.Background()); err == nil {
		t.Error("ClipboardGet after Close succeeded")
	}
}

// TestClipboardCancel: a read waiting on a silent owner ends with its
// context.
func TestClipboardCancel(t *testing.T) {
	d, display := openDesktop(t)
	app := newSelApp(t, display)
	app.takeClipboard(func(*selApp, xproto.SelectionRequestEvent) {})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := d.ClipboardGet(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ClipboardGet with an expired context: %v", err)
	}
}

func TestToLatin1(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"plain", "plain"},
		{"café ÿ", "caf\xe9 \xff"},
		{"✓ 東\x01\r\n\t", "? ???\n\t"},
		{"\u0100\u00a0", "?\xa0"},
	} {
		if got := string(toLatin1([]byte(tt.in))); got != tt.want {
			t.Errorf("toLatin1(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// FuzzDecodeText: whatever another client writes to the property, the
// text is valid UTF-8 without a trailing NUL, and Latin-1 text survives
// the trip through STRING.
func FuzzDecodeText(f *testing.F) {
	for _, s := range []string{"", "plain", "héllo ✓ 東京", "caf\xe9", "a\xffb", "c string\x00\x00", "\x00", "😀\n\t"} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, latin bool) {
		typ := xproto.Atom(300) // some UTF-8 type
		if latin {
			typ = xproto.AtomString
		}
		got := decodeText(data, typ)
		if !utf8.ValidString(got) {
			t.Fatalf("decodeText(%q) = %q, not valid UTF-8", data, got)
		}
		if strings.HasSuffix(got, "\x00") {
			t.Fatalf("decodeText(%q) = %q ends in NUL", data, got)
		}
		if latin {
			if n := utf8.RuneCountInString(got); n > len(data) {
				t.Fatalf("decodeText(%q) has %d characters, more than its %d bytes", data, n, len(data))
			}
			// Back to STRING: the same bytes, where STRING allows them.
			back := toLatin1([]byte(got))
			if len(back) != utf8.RuneCountInString(got) {
				t.Fatalf("toLatin1(%q) = %q, not one byte a character", got, back)
			}
		}
		if utf8.Valid(data) && !latin && !bytes.HasSuffix(data, []byte{0}) && got != string(data) {
			t.Fatalf("decodeText(%q) = %q, want the UTF-8 as it is", data, got)
		}
	})
}
