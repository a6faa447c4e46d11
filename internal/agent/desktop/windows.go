package desktop

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/proto/desktop"
)

// maxPropertyWords bounds how much of a property is read (4 bytes a word).
const maxPropertyWords = 1 << 14

// Windows lists the top-level client windows: those in _NET_CLIENT_LIST when
// the window manager keeps one, else the viewable children of the root (or,
// under a reparenting manager without EWMH, the client inside each frame)
// that have a name or WM_STATE. Positions are in root coordinates.
func (d *Desktop) Windows(ctx context.Context) ([]*desktop.Window, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, err := d.clientList()
	if err != nil {
		return nil, err
	}
	focus := d.focusedWindow()
	out := make([]*desktop.Window, 0, len(ids))
	for _, id := range ids {
		w, err := d.describe(id)
		if err != nil {
			continue // the window went away while we looked
		}
		w.Focused = focus != 0 && d.isAncestorOrSelf(id, focus)
		out = append(out, w)
	}
	return out, nil
}

func (d *Desktop) property(win xproto.Window, prop xproto.Atom) (*xproto.GetPropertyReply, error) {
	return xproto.GetProperty(d.conn, false, win, prop, xproto.GetPropertyTypeAny, 0, maxPropertyWords).Reply()
}

func windowsOf(r *xproto.GetPropertyReply) []xproto.Window {
	if r == nil || r.Format != 32 {
		return nil
	}
	var out []xproto.Window
	for i := 0; i+4 <= len(r.Value); i += 4 {
		out = append(out, xproto.Window(binary.LittleEndian.Uint32(r.Value[i:])))
	}
	return out
}

func (d *Desktop) clientList() ([]xproto.Window, error) {
	if r, err := d.property(d.root, d.atoms.clientList); err == nil {
		if ids := windowsOf(r); len(ids) > 0 {
			return ids, nil
		}
	}
	tree, err := xproto.QueryTree(d.conn, d.root).Reply()
	if err != nil {
		return nil, fmt.Errorf("query window tree: %w", err)
	}
	var out []xproto.Window
	for _, w := range tree.Children {
		attr, err := xproto.GetWindowAttributes(d.conn, w).Reply()
		if err != nil || attr.MapState != xproto.MapStateViewable || attr.OverrideRedirect {
			continue
		}
		if d.isClient(w) {
			out = append(out, w)
			continue
		}
		// A frame of a reparenting window manager: look one level down.
		sub, err := xproto.QueryTree(d.conn, w).Reply()
		if err != nil {
			continue
		}
		for _, c := range sub.Children {
			if d.isClient(c) {
				out = append(out, c)
				break
			}
		}
	}
	return out, nil
}

// isClient reports whether w is an application's window: it has WM_STATE
// (set by a window manager) or a name.
func (d *Desktop) isClient(w xproto.Window) bool {
	for _, atom := range []xproto.Atom{d.atoms.wmState, d.atoms.netWMName, xproto.AtomWmName} {
		if r, err := d.property(w, atom); err == nil && r.Format != 0 && len(r.Value) > 0 {
			return true
		}
	}
	return false
}

func (d *Desktop) describe(w xproto.Window) (*desktop.Window, error) {
	geo, err := xproto.GetGeometry(d.conn, xproto.Drawable(w)).Reply()
	if err != nil {
		return nil, err
	}
	pos, err := xproto.TranslateCoordinates(d.conn, w, d.root, 0, 0).Reply()
	if err != nil {
		return nil, err
	}
	out := &desktop.Window{
		Id:     uint32(w),
		X:      int32(pos.DstX),
		Y:      int32(pos.DstY),
		Width:  int32(geo.Width),
		Height: int32(geo.Height),
		Title:  d.title(w),
	}
	if r, err := d.property(w, xproto.AtomWmClass); err == nil && r.Format == 8 {
		// WM_CLASS is "instance\0class\0"; the class names the application.
		parts := strings.Split(strings.TrimRight(string(r.Value), "\x00"), "\x00")
		out.Class = latin1(parts[len(parts)-1])
	}
	return out, nil
}

// title returns _NET_WM_NAME (UTF-8) or else WM_NAME (Latin-1).
func (d *Desktop) title(w xproto.Window) string {
	if r, err := d.property(w, d.atoms.netWMName); err == nil && r.Format == 8 && len(r.Value) > 0 {
		return strings.ToValidUTF8(string(r.Value), "\uFFFD")
	}
	if r, err := d.property(w, xproto.AtomWmName); err == nil && r.Format == 8 {
		if r.Type == d.atoms.utf8String {
			return strings.ToValidUTF8(string(r.Value), "\uFFFD")
		}
		return latin1(string(r.Value))
	}
	return ""
}

func latin1(s string) string {
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		b.WriteRune(rune(s[i]))
	}
	return b.String()
}

// focusedWindow returns _NET_ACTIVE_WINDOW, or the input focus when the
// window manager does not set it.
func (d *Desktop) focusedWindow() xproto.Window {
	if r, err := d.property(d.root, d.atoms.activeWindow); err == nil {
		if ids := windowsOf(r); len(ids) > 0 && ids[0] != 0 {
			return ids[0]
		}
	}
	f, err := xproto.GetInputFocus(d.conn).Reply()
	if err != nil || f.Focus == xproto.InputFocusPointerRoot || f.Focus == xproto.InputFocusNone || f.Focus == d.root {
		return 0
	}
	return f.Focus
}

// isAncestorOrSelf reports whether w is win or one of its ancestors (the
// focus may sit on a child of a top-level window).
func (d *Desktop) isAncestorOrSelf(w, win xproto.Window) bool {
	for i := 0; i < 32 && win != 0 && win != d.root; i++ {
		if win == w {
			return true
		}
		t, err := xproto.QueryTree(d.conn, win).Reply()
		if err != nil {
			return false
		}
		win = t.Parent
	}
	return false
}

// CloseWindows asks every top-level window that takes WM_DELETE_WINDOW
// to close, as its close button would, and returns the processes that
// own them (_NET_WM_PID), where the windows say. An application closed
// this way shuts down as it does for its user: a browser writes its
// cookies and releases its profile, which a signal does not make it do.
func (d *Desktop) CloseWindows(ctx context.Context) ([]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, err := d.clientList()
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, w := range ids {
		if !d.takesDelete(w) {
			continue
		}
		var data [20]byte
		binary.LittleEndian.PutUint32(data[0:], uint32(d.atoms.wmDeleteWindow))
		binary.LittleEndian.PutUint32(data[4:], uint32(xproto.TimeCurrentTime))
		ev := xproto.ClientMessageEvent{
			Format: 32, Window: w, Type: d.atoms.wmProtocols,
			Data: xproto.ClientMessageDataUnionData8New(data[:]),
		}
		if err := xproto.SendEventChecked(d.conn, false, w, xproto.EventMaskNoEvent, string(ev.Bytes())).Check(); err != nil {
			continue // the window went away
		}
		if r, err := d.property(w, d.atoms.netWMPid); err == nil && r.Format == 32 && len(r.Value) >= 4 {
			pids = append(pids, int(binary.LittleEndian.Uint32(r.Value)))
		}
	}
	return pids, d.sync()
}

// takesDelete reports whether w lists WM_DELETE_WINDOW in WM_PROTOCOLS.
func (d *Desktop) takesDelete(w xproto.Window) bool {
	r, err := d.property(w, d.atoms.wmProtocols)
	if err != nil {
		return false
	}
	for _, a := range windowsOf(r) { // a list of 32-bit atoms
		if xproto.Atom(a) == d.atoms.wmDeleteWindow {
			return true
		}
	}
	return false
}
