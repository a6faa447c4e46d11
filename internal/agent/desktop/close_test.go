package desktop

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
)

// TestCloseWindows checks that CloseWindows sends WM_DELETE_WINDOW to a
// window that takes it, and reports its owner's pid, and leaves alone a
// window that does not take it (closing that one would need a kill).
func TestCloseWindows(t *testing.T) {
	d, display := openDesktop(t)
	taker := newClient(t, display, 0, 0, 100, 100, "takes delete")
	other := newClient(t, display, 200, 0, 100, 100, "does not")
	protocols := internAtom(t, taker.conn, "WM_PROTOCOLS")
	del := internAtom(t, taker.conn, "WM_DELETE_WINDOW")
	atomList := make([]byte, 4)
	binary.LittleEndian.PutUint32(atomList, uint32(del))
	xproto.ChangeProperty(taker.conn, xproto.PropModeReplace, taker.win, protocols, xproto.AtomAtom, 32, 1, atomList)
	pid := make([]byte, 4)
	binary.LittleEndian.PutUint32(pid, 4242)
	xproto.ChangeProperty(taker.conn, xproto.PropModeReplace, taker.win, internAtom(t, taker.conn, "_NET_WM_PID"), xproto.AtomCardinal, 32, 1, pid)
	taker.sync()
	taker.drain()
	other.drain()

	pids, err := d.CloseWindows(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) != 1 || pids[0] != 4242 {
		t.Errorf("CloseWindows = %v, want the taker's pid [4242]", pids)
	}
	ev := taker.waitFor(func(ev xgb.Event) bool { _, ok := ev.(xproto.ClientMessageEvent); return ok }).(xproto.ClientMessageEvent)
	if ev.Type != protocols || ev.Format != 32 || xproto.Atom(ev.Data.Data32[0]) != del {
		t.Errorf("the taker got %+v, want WM_PROTOCOLS / WM_DELETE_WINDOW", ev)
	}
	other.sync()
	other.mu.Lock()
	defer other.mu.Unlock()
	for _, e := range other.events {
		if _, ok := e.(xproto.ClientMessageEvent); ok {
			t.Errorf("a window without WM_DELETE_WINDOW got %+v", e)
		}
	}
}
