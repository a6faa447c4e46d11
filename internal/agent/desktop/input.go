package desktop

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// Pauses between synthesized events. They are short, but some toolkits
// need them: a drag must move after the press before it starts, and the
// clicks of a double click must be separate events yet inside the
// double-click time.
const (
	clickGap     = 40 * time.Millisecond
	scrollGap    = 5 * time.Millisecond
	dragSettle   = 30 * time.Millisecond
	dragStepGap  = 2 * time.Millisecond
	dragStepPx   = 8   // pixels per synthesized motion event
	dragMaxSteps = 500 // motion events per drag, whatever its length
)

// fake queues one XTEST event: a key or button press/release (detail is
// the keycode or button) or an absolute motion to (x, y). The queue goes to
// the server at the next pause or sync.
func (d *Desktop) fake(typ, detail byte, x, y int) { d.in.fake(typ, detail, x, y) }

// pause sends the queued events and sleeps for t, so that the pause falls
// between the events before and after it.
func (d *Desktop) pause(t time.Duration) error {
	if err := d.in.flush(); err != nil {
		return err
	}
	time.Sleep(t)
	return nil
}

func (d *Desktop) moveTo(x, y int) { d.fake(xproto.MotionNotify, 0, x, y) }

func buttonNumber(name string) byte {
	switch name {
	case action.ButtonRight:
		return 3
	case action.ButtonMiddle:
		return 2
	case action.ButtonBack:
		return 8
	case action.ButtonForward:
		return 9
	}
	return 1
}

func scrollButton(direction string) byte {
	switch direction {
	case action.DirectionUp:
		return 4
	case action.DirectionDown:
		return 5
	case action.DirectionLeft:
		return 6
	}
	return 7
}

// moveIfGiven moves the pointer to the action's x, y when it has them.
func (d *Desktop) moveIfGiven(a action.Action) {
	if a.X != nil && a.Y != nil {
		d.moveTo(*a.X, *a.Y)
	}
}

func (d *Desktop) click(a action.Action, count int) error {
	d.moveIfGiven(a)
	b := buttonNumber(a.Button)
	for i := 0; i < count; i++ {
		if i > 0 {
			if err := d.pause(clickGap); err != nil {
				return err
			}
		}
		d.fake(xproto.ButtonPress, b, 0, 0)
		d.fake(xproto.ButtonRelease, b, 0, 0)
	}
	return d.sync()
}

func (d *Desktop) mouseButton(a action.Action, down bool) error {
	d.moveIfGiven(a)
	typ := byte(xproto.ButtonRelease)
	if down {
		typ = xproto.ButtonPress
	}
	b := buttonNumber(a.Button)
	d.fake(typ, b, 0, 0)
	d.buttons[b] = down
	return d.sync()
}

// drag presses at the first point, moves through the others in small steps
// and releases at the last.
func (d *Desktop) drag(a action.Action) error {
	b := buttonNumber(a.Button)
	p0 := a.Path[0]
	d.moveTo(p0[0], p0[1])
	if err := d.sync(); err != nil {
		return err
	}
	d.fake(xproto.ButtonPress, b, 0, 0)
	if err := d.pause(dragSettle); err != nil {
		return err
	}
	total := 0.0
	for i := 1; i < len(a.Path); i++ {
		total += math.Hypot(float64(a.Path[i][0]-a.Path[i-1][0]), float64(a.Path[i][1]-a.Path[i-1][1]))
	}
	step := math.Max(dragStepPx, total/dragMaxSteps)
	for i := 1; i < len(a.Path); i++ {
		from, to := a.Path[i-1], a.Path[i]
		n := max(1, int(math.Ceil(math.Hypot(float64(to[0]-from[0]), float64(to[1]-from[1]))/step)))
		for s := 1; s <= n; s++ {
			x := from[0] + (to[0]-from[0])*s/n
			y := from[1] + (to[1]-from[1])*s/n
			d.moveTo(x, y)
			if err := d.pause(dragStepGap); err != nil {
				return err
			}
		}
	}
	if err := d.pause(dragSettle); err != nil {
		return err
	}
	d.fake(xproto.ButtonRelease, b, 0, 0)
	return d.sync()
}

func (d *Desktop) scroll(a action.Action) error {
	d.moveIfGiven(a)
	b := scrollButton(a.Direction)
	for i := 0; i < a.Amount; i++ {
		if i > 0 {
			if err := d.pause(scrollGap); err != nil {
				return err
			}
		}
		d.fake(xproto.ButtonPress, b, 0, 0)
		d.fake(xproto.ButtonRelease, b, 0, 0)
	}
	return d.sync()
}

// comboCodes resolves a combo to the keycodes to press in order. A key on
// the shifted level gets Shift pressed before it unless the combo already
// holds Shift.
func (d *Desktop) comboCodes(keys []string) ([]xproto.Keycode, error) {
	syms, err := action.ParseCombo(keys)
	if err != nil {
		return nil, &action.Error{Msg: err.Error()}
	}
	var codes []xproto.Keycode
	shiftDown := false
	for _, ks := range syms {
		p, err := d.keys.lookup(ks)
		if err != nil {
			return nil, err
		}
		if p.shift && !shiftDown {
			sp, err := d.keys.lookup(action.KeysymShiftL)
			if err != nil {
				return nil, err
			}
			codes = append(codes, sp.code)
			shiftDown = true
		}
		if ks == action.KeysymShiftL || ks == 0xffe2 {
			shiftDown = true
		}
		codes = append(codes, p.code)
	}
	return codes, nil
}

// key presses a combo and releases it in reverse order.
func (d *Desktop) key(keys []string) error {
	codes, err := d.comboCodes(keys)
	if err != nil {
		return err
	}
	for _, c := range codes {
		d.keys.press(c, true, false)
	}
	for i := len(codes) - 1; i >= 0; i-- {
		d.keys.press(codes[i], false, false)
	}
	d.keys.scheduleRestore()
	return d.sync()
}

// keyHalf presses (key_down) or releases (key_up) a combo; releases go in
// reverse order.
func (d *Desktop) keyHalf(keys []string, down bool) error {
	codes, err := d.comboCodes(keys)
	if err != nil {
		return err
	}
	if down {
		for _, c := range codes {
			d.keys.press(c, true, true)
		}
	} else {
		for i := len(codes) - 1; i >= 0; i-- {
			d.keys.press(codes[i], false, true)
		}
		d.keys.scheduleRestore()
	}
	return d.sync()
}

// holdKey presses a combo for duration. The keys are released even when
// ctx ends first.
func (d *Desktop) holdKey(ctx context.Context, keys []string, duration time.Duration) error {
	codes, err := d.comboCodes(keys)
	if err != nil {
		return err
	}
	for _, c := range codes {
		d.keys.press(c, true, true)
	}
	if err := d.sync(); err != nil {
		return err
	}
	waitErr := sleep(ctx, duration)
	for i := len(codes) - 1; i >= 0; i-- {
		d.keys.press(codes[i], false, true)
	}
	d.keys.scheduleRestore()
	if err := d.sync(); err != nil {
		return err
	}
	return waitErr
}

// bindSettle is how long typing waits after binding keycodes for the
// characters the keyboard lacks, before the first of them is typed.
const bindSettle = 50 * time.Millisecond

// settleBindings gives clients a moment to take in a burst of new
// bindings before the first key that needs them: without it the first
// key was lost in one try of ten.
func (d *Desktop) settleBindings(ctx context.Context) error {
	if err := d.sync(); err != nil {
		return err
	}
	return sleep(ctx, bindSettle)
}

// typeText types text one character at a time, delay apart. "\r\n" types
// one Return.
func (d *Desktop) typeText(ctx context.Context, text string, delay time.Duration) error {
	defer d.keys.scheduleRestore()
	var syms []action.Keysym
	prev := rune(0)
	for _, r := range text {
		if r == '\n' && prev == '\r' {
			prev = r
			continue
		}
		prev = r
		ks, ok := action.RuneKeysym(r)
		if !ok {
			return &action.Error{Msg: fmt.Sprintf("the character U+%04X cannot be typed", r)}
		}
		syms = append(syms, ks)
	}
	var shift *keyPos
	shifted := false
	defer func() {
		if shifted { // an error ended the text with Shift down
			d.keys.press(shift.code, false, false)
			_ = d.sync()
		}
	}()
	for i, ks := range syms {
		if err := ctx.Err(); err != nil {
			return err
		}
		if i > 0 && delay > 0 {
			if err := d.sync(); err != nil {
				return err
			}
			if err := sleep(ctx, delay); err != nil {
				return err
			}
		}
		if i == 0 || !d.keys.has(ks) {
			n, err := d.keys.prebind(syms[i:])
			if err != nil {
				return err
			}
			if n > 0 {
				if err := d.settleBindings(ctx); err != nil {
					return err
				}
			}
		}
		p, err := d.keys.lookup(ks)
		if err != nil {
			return err
		}
		if p.shift && shift == nil {
			sp, err := d.keys.lookup(action.KeysymShiftL)
			if err != nil {
				return err
			}
			shift = &sp
		}
		// Shift stays down across a run of shifted characters: every
		// press and release of a modifier is an XKB state change that
		// Xvfb sends to each client of the display, and under gVisor 60
		// capitals typed with a Shift each took 600 ms.
		if p.shift != shifted {
			d.keys.press(shift.code, p.shift, false)
			shifted = p.shift
		}
		d.keys.press(p.code, true, false)
		d.keys.press(p.code, false, false)
	}
	if shifted {
		d.keys.press(shift.code, false, false)
		shifted = false
	}
	return d.sync()
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
