package desktop

import (
	"context"
	"fmt"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/proto/desktop"
)

// Do runs one action. It normalizes a and checks its coordinates against the
// screen first; those errors, and any other mistake of the request, are
// *action.Error. Other errors come from the X server or ctx. Input actions
// return only once the server has processed their events, so a screenshot
// taken next sees the pointer and key state they left.
func (d *Desktop) Do(ctx context.Context, a action.Action) (*desktop.ActionResult, error) {
	a, err := action.Normalize(a)
	if err != nil {
		return nil, err
	}
	if err := action.Validate(a, d.width, d.height); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := &desktop.ActionResult{Type: a.Type}
	switch a.Type {
	case action.TypeWait:
		return res, sleep(ctx, ms(a.DurationMS))
	case action.TypeCursorPosition:
		p, err := xproto.QueryPointer(d.conn, d.root).Reply()
		if err != nil {
			return nil, fmt.Errorf("query pointer: %w", err)
		}
		res.X, res.Y = int32(p.RootX), int32(p.RootY)
		return res, nil
	case action.TypeScreenSize:
		res.Width, res.Height = int32(d.width), int32(d.height)
		return res, nil
	case action.TypeScreenshot:
		opts := a.Screenshot()
		shot, err := d.Screenshot(ctx, opts)
		if err != nil {
			return nil, err
		}
		res.Width, res.Height = int32(shot.Width), int32(shot.Height)
		res.Screenshot = &desktop.ScreenshotResponse{
			Format: shot.Format, Width: int32(shot.Width), Height: int32(shot.Height), Data: shot.Data,
		}
		if opts.Settle > 0 {
			res.Screenshot.Settled = &shot.Settled
			res.Screenshot.SettleWaitMs = uint32(shot.SettleWait.Milliseconds())
		}
		return res, nil
	case action.TypeWindows:
		ws, err := d.Windows(ctx)
		if err != nil {
			return nil, err
		}
		res.Windows = ws
		return res, nil
	case action.TypeClipboardGet:
		text, err := d.ClipboardGet(ctx)
		if err != nil {
			return nil, err
		}
		res.Text = text
		return res, nil
	case action.TypeClipboardSet:
		return res, d.ClipboardSet(ctx, a.Text)
	}

	d.inputMu.Lock()
	defer d.inputMu.Unlock()
	switch a.Type {
	case action.TypeMove:
		d.moveTo(*a.X, *a.Y)
		err = d.sync()
	case action.TypeClick:
		err = d.click(a, a.Count)
	case action.TypeDoubleClick:
		err = d.click(a, 2)
	case action.TypeTripleClick:
		err = d.click(a, 3)
	case action.TypeMouseDown:
		err = d.mouseButton(a, true)
	case action.TypeMouseUp:
		err = d.mouseButton(a, false)
	case action.TypeDrag:
		err = d.drag(a)
	case action.TypeScroll:
		err = d.scroll(a)
	case action.TypeType:
		err = d.typeText(ctx, a.Text, ms(a.DelayMS))
	case action.TypeKey:
		err = d.key(a.Keys)
	case action.TypeKeyDown:
		err = d.keyHalf(a.Keys, true)
	case action.TypeKeyUp:
		err = d.keyHalf(a.Keys, false)
	case action.TypeHoldKey:
		err = d.holdKey(ctx, a.Keys, ms(a.DurationMS))
	default:
		return nil, &action.Error{Msg: fmt.Sprintf("unknown action type %q", a.Type)}
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }
