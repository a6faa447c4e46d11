package desktop

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/damage"
	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// CapDamage: the server reports changes on the screen (X DAMAGE), so
// screenshots can wait for the screen to settle and an unchanged screen is
// not encoded twice.
const CapDamage = "damage"

// damageTracker follows changes on the screen through one DAMAGE object on
// the root window (report level NonEmpty): the server sends one event when
// the damage region stops being empty, and the event loop empties it again
// (DamageSubtract) to re-arm it. Every event bumps gen and sets last.
//
// A fence makes what the tracker knows current: the agent changes a
// property of a window of its own, and the server queues the PropertyNotify
// after every damage event it queued before, on the same connection, so
// when the event loop reaches the fence it has seen all the damage done
// before the fence was sent.
type damageTracker struct {
	conn *xgb.Conn
	dmg  damage.Damage
	win  xproto.Window // the fence's window, unmapped, InputOnly
	atom xproto.Atom

	mu     sync.Mutex
	gen    uint64    // damage events seen
	last   time.Time // when the last one arrived
	sent   uint64    // fences sent
	seen   uint64    // fences the event loop has reached
	wake   chan struct{}
	closed bool
}

var errTrackerClosed = errors.New("the X connection closed")

// newDamageTracker sets up the damage object and the fence window, or
// fails if the server has no DAMAGE extension.
func newDamageTracker(conn *xgb.Conn, root xproto.Window, atom xproto.Atom) (*damageTracker, error) {
	if err := damage.Init(conn); err != nil {
		return nil, err
	}
	if _, err := damage.QueryVersion(conn, 1, 1).Reply(); err != nil {
		return nil, err
	}
	t := &damageTracker{conn: conn, atom: atom, wake: make(chan struct{})}
	var err error
	if t.win, err = xproto.NewWindowId(conn); err != nil {
		return nil, err
	}
	err = xproto.CreateWindowChecked(conn, 0, t.win, root, -1, -1, 1, 1, 0, xproto.WindowClassInputOnly, 0,
		xproto.CwOverrideRedirect|xproto.CwEventMask, []uint32{1, xproto.EventMaskPropertyChange}).Check()
	if err != nil {
		return nil, err
	}
	if t.dmg, err = damage.NewDamageId(conn); err != nil {
		return nil, err
	}
	if err := damage.CreateChecked(conn, t.dmg, xproto.Drawable(root), damage.ReportLevelNonEmpty).Check(); err != nil {
		xproto.DestroyWindow(conn, t.win)
		return nil, err
	}
	return t, nil
}

// event handles one event of the connection and reports whether it was
// the tracker's. It runs on the event loop only.
func (t *damageTracker) event(ev xgb.Event) bool {
	switch e := ev.(type) {
	case damage.NotifyEvent:
		if e.Damage != t.dmg {
			return false
		}
		// Re-arm first: the subtract is queued before gen moves, so a
		// capture that read the new gen is processed after it, and any
		// damage after that capture makes a new event.
		damage.Subtract(t.conn, t.dmg, 0, 0)
		t.mu.Lock()
		t.gen++
		t.last = time.Now()
		t.mu.Unlock()
		return true
	case xproto.PropertyNotifyEvent:
		if e.Window != t.win {
			return false
		}
		t.mu.Lock()
		t.seen++
		close(t.wake)
		t.wake = make(chan struct{})
		t.mu.Unlock()
		return true
	}
	return false
}

// close wakes the fences still waiting; the event loop calls it when the
// connection ends.
func (t *damageTracker) close() {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.wake)
	}
	t.mu.Unlock()
}

// fence waits until the event loop has seen every damage event the server
// queued before now, and returns the damage count and the time of the last
// damage then.
func (t *damageTracker) fence(ctx context.Context) (gen uint64, last time.Time, err error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return 0, time.Time{}, errTrackerClosed
	}
	// Fences may reach the server out of the order of their numbers; it
	// does not matter: the n-th PropertyNotify answers a fence numbered n
	// or more, sent after this one was numbered.
	t.sent++
	n := t.sent
	t.mu.Unlock()
	xproto.ChangeProperty(t.conn, xproto.PropModeReplace, t.win, t.atom, xproto.AtomInteger, 32, 0, nil)
	t.mu.Lock()
	for t.seen < n {
		if t.closed {
			t.mu.Unlock()
			return 0, time.Time{}, errTrackerClosed
		}
		wake := t.wake
		t.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, time.Time{}, ctx.Err()
		}
		t.mu.Lock()
	}
	gen, last = t.gen, t.last
	t.mu.Unlock()
	return gen, last, nil
}

// settle waits until the screen has had no damage for quiet, counted from
// the later of start and the last damage, or until start+limit. It returns
// the damage count as of its last fence and whether the screen settled.
func (t *damageTracker) settle(ctx context.Context, start time.Time, quiet, limit time.Duration) (gen uint64, settled bool, err error) {
	deadline := start.Add(max(limit, quiet))
	for {
		gen, last, err := t.fence(ctx)
		if err != nil {
			return 0, false, err
		}
		from := start
		if last.After(from) {
			from = last
		}
		now := time.Now()
		if now.Sub(from) >= quiet {
			return gen, true, nil
		}
		if !now.Before(deadline) {
			return gen, false, nil
		}
		// Nothing can make the screen quiet sooner than from+quiet; a
		// damage in the meantime only moves that later, which the next
		// fence learns.
		wake := from.Add(quiet)
		if wake.After(deadline) {
			wake = deadline
		}
		if err := sleep(ctx, wake.Sub(now)); err != nil {
			return 0, false, err
		}
	}
}

// shotCache keeps the last few encoded screenshots with the damage count
// they were captured at. An entry answers a screenshot with the same
// options while no damage has arrived since: the pixels are those it was
// made from.
type shotCache struct {
	mu      sync.Mutex
	entries [4]cacheEntry
	next    int
}

type cacheEntry struct {
	gen  uint64
	opts action.ScreenshotOptions // settle options zeroed
	shot *Shot
}

// cacheKey is what an encoded screenshot depends on: every option but
// the settle ones.
func cacheKey(o action.ScreenshotOptions) action.ScreenshotOptions {
	o.Settle, o.SettleMax = 0, 0
	return o
}

func (c *shotCache) get(gen uint64, opts action.ScreenshotOptions) *Shot {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.shot != nil && e.gen == gen && e.opts == opts {
			return e.shot
		}
	}
	return nil
}

func (c *shotCache) put(gen uint64, opts action.ScreenshotOptions, shot *Shot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.entries {
		if e := &c.entries[i]; e.shot != nil && (e.gen != gen || e.opts == opts) {
			*e = cacheEntry{} // stale, or this one's older twin
		}
	}
	c.entries[c.next] = cacheEntry{gen: gen, opts: opts, shot: shot}
	c.next = (c.next + 1) % len(c.entries)
}
