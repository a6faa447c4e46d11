package computer

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/proto/desktop"
)

// recordingDesktop is a test double of the agent's desktop service (not a
// real desktop): it records the actions it is sent and answers each with
// what the real agent would report for a screen of its size — the cursor
// where the last pointer action left it, screenshots of the size asked
// for, whose data names the request. failAt, if >= 0, makes it refuse that
// action the way the agent refuses one.
type recordingDesktop struct {
	mu       sync.Mutex
	screen   Size
	failAt   int
	failCode string
	got      [][]action.Action
	cursor   Point
	clip     string // what clipboard_set left, as the agent holds it
}

func newRecordingDesktop(w, h int) *recordingDesktop {
	return &recordingDesktop{screen: Size{w, h}, failAt: -1}
}

func (d *recordingDesktop) Act(_ context.Context, req *connect.Request[desktop.ActRequest]) (*connect.Response[desktop.ActResponse], error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	resp := &desktop.ActResponse{FailedIndex: -1}
	var acts []action.Action
	for i, p := range req.Msg.GetActions() {
		a := action.FromProto(p)
		acts = append(acts, a)
		if i == d.failAt {
			resp.FailedIndex, resp.ErrorCode = int32(i), d.failCode
			resp.Error = fmt.Sprintf("action %d: refused by the test double", i)
			break
		}
		res := &desktop.ActionResult{Type: a.Type}
		switch a.Type {
		case action.TypeScreenSize:
			res.Width, res.Height = int32(d.screen.Width), int32(d.screen.Height)
		case action.TypeCursorPosition:
			res.X, res.Y = int32(d.cursor.X), int32(d.cursor.Y)
		case action.TypeScreenshot:
			w, h := d.screen.Width, d.screen.Height
			if a.W > 0 {
				w, h = a.W, a.H
			}
			if a.Width > 0 && a.Width < w {
				h = heightFor(Size{w, h}, a.Width)
				w = a.Width
			}
			desc, _ := json.Marshal(a)
			res.Screenshot = &desktop.ScreenshotResponse{Format: a.Format, Width: int32(w), Height: int32(h), Data: desc}
		case action.TypeClipboardSet:
			d.clip = a.Text
		case action.TypeClipboardGet:
			res.Text = d.clip
		default:
			if a.X != nil {
				d.cursor = Point{*a.X, *a.Y}
			}
		}
		resp.Results = append(resp.Results, res)
	}
	d.got = append(d.got, acts)
	return connect.NewResponse(resp), nil
}

// last returns the actions of the last call, without the screen_size
// probe calls.
func (d *recordingDesktop) last() []action.Action {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.got) == 0 {
		return nil
	}
	return d.got[len(d.got)-1]
}
