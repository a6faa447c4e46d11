// Package computer is the one path from the API's front ends to a
// sandbox's desktop. The native action list (POST …/actions) and the
// vendors' computer-use endpoints (Anthropic's computer tool, OpenAI's
// computer_call) each translate their own language into action.Action
// values, hand them to Run, and render the typed Outcome in their own
// language: none of them touches the agent's protobuf messages.
//
// Run sends the whole list to the agent in one round trip; the agent runs
// it in order and stops at the first action that fails. The Frame type
// maps between the screen and the smaller picture a model is shown, so
// that every front end scales screenshots and coordinates the same way.
package computer

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/proto/desktop"
)

// Desktop is the part of the agent's desktop service Run needs; the
// agent client's Desktop field is one.
type Desktop interface {
	Act(context.Context, *connect.Request[desktop.ActRequest]) (*connect.Response[desktop.ActResponse], error)
}

// Point is a position in screen pixels, origin top-left.
type Point struct{ X, Y int }

// Size is a width and height in pixels.
type Size struct{ Width, Height int }

// Image is an encoded screenshot.
type Image struct {
	Format        string // action.FormatPNG or action.FormatJPEG
	Width, Height int
	Data          []byte
	// Settled, for a screenshot that asked to wait for the screen to
	// settle, says whether it did (false: the wait hit its bound), and
	// SettleWait how long the wait was. Nil for one that did not ask.
	Settled    *bool
	SettleWait time.Duration
}

// MediaType is the image's MIME type ("image/png").
func (im Image) MediaType() string { return "image/" + im.Format }

// Window is a top-level window of the desktop.
type Window struct {
	ID            uint32
	Title, Class  string
	X, Y          int
	Width, Height int
	Focused       bool
}

// Result is what one action reported. Only the field of its type is set:
// Cursor for cursor_position, Size for screen_size, Image for screenshot,
// Windows for windows, Text for clipboard_get (pointing at "" when the
// clipboard holds no text); the other types report nothing.
type Result struct {
	Type    string
	Cursor  *Point
	Size    *Size
	Image   *Image
	Windows []Window
	Text    *string
}

// Failure codes: the API error code an agent-side failure maps to.
const (
	// CodeInvalid: the action cannot run on this desktop (a point
	// outside the screen, a key the keyboard map lacks).
	CodeInvalid = "invalid_argument"
	// CodeUnavailable: the desktop is restarting; the caller may retry.
	CodeUnavailable = "unavailable"
	// CodeInternal: the desktop failed.
	CodeInternal = "internal"
)

// Failure is an action the agent refused or could not run. The actions
// before Index ran; the ones after it did not.
type Failure struct {
	Index   int
	Type    string // the failed action's type
	Code    string // CodeInvalid, CodeUnavailable or CodeInternal
	Message string // the agent's words, cleaned for a caller
}

func (f *Failure) Error() string {
	return fmt.Sprintf("action %d (%s): %s", f.Index, f.Type, f.Message)
}

// Outcome is the result of Run: one Result per action that ran, and the
// Failure that stopped the list, if one did.
type Outcome struct {
	Results  []Result
	Failure  *Failure
	Duration time.Duration // the agent round trip
}

// Run runs acts, in order, in one round trip to the agent. The actions
// must be normalized (action.Normalize); Run does not check them again,
// the agent does. The error is for a call that did not reach the agent or
// got no answer; a refused action is Outcome.Failure.
func Run(ctx context.Context, d Desktop, acts []action.Action) (Outcome, error) {
	req := &desktop.ActRequest{Actions: make([]*desktop.Action, len(acts))}
	for i, a := range acts {
		req.Actions[i] = action.ToProto(a)
	}
	start := time.Now()
	resp, err := d.Act(ctx, connect.NewRequest(req))
	out := Outcome{Duration: time.Since(start)}
	if err != nil {
		return out, err
	}
	msg := resp.Msg
	out.Results = make([]Result, 0, len(msg.GetResults()))
	for _, res := range msg.GetResults() {
		out.Results = append(out.Results, fromProto(res))
	}
	if i := int(msg.GetFailedIndex()); i >= 0 && (msg.GetError() != "" || msg.GetErrorCode() != "") {
		if i >= len(acts) {
			i = len(acts) - 1
		}
		f := &Failure{Index: i, Message: agentMessage(msg.GetError())}
		if i >= 0 {
			f.Type = acts[i].Type
		}
		switch msg.GetErrorCode() {
		case CodeInvalid:
			f.Code = CodeInvalid
		case CodeUnavailable:
			f.Code = CodeUnavailable
		default:
			f.Code = CodeInternal
		}
		out.Failure = f
	}
	return out, nil
}

// ScreenSize asks the agent for the size of the screen.
func ScreenSize(ctx context.Context, d Desktop) (Size, error) {
	out, err := Run(ctx, d, []action.Action{{Type: action.TypeScreenSize}})
	if err != nil {
		return Size{}, err
	}
	if out.Failure != nil {
		return Size{}, out.Failure
	}
	if len(out.Results) != 1 || out.Results[0].Size == nil || out.Results[0].Size.Width < 1 || out.Results[0].Size.Height < 1 {
		return Size{}, fmt.Errorf("screen_size: the agent reported no size")
	}
	return *out.Results[0].Size, nil
}

func fromProto(res *desktop.ActionResult) Result {
	r := Result{Type: res.GetType()}
	switch r.Type {
	case action.TypeCursorPosition:
		r.Cursor = &Point{X: int(res.GetX()), Y: int(res.GetY())}
	case action.TypeScreenSize:
		r.Size = &Size{Width: int(res.GetWidth()), Height: int(res.GetHeight())}
	case action.TypeScreenshot:
		shot := res.GetScreenshot()
		r.Image = &Image{Format: shot.GetFormat(), Width: int(shot.GetWidth()), Height: int(shot.GetHeight()), Data: shot.GetData(),
			Settled: shot.Settled, SettleWait: time.Duration(shot.GetSettleWaitMs()) * time.Millisecond}
	case action.TypeWindows:
		r.Windows = make([]Window, 0, len(res.GetWindows()))
		for _, w := range res.GetWindows() {
			r.Windows = append(r.Windows, Window{
				ID: w.GetId(), Title: w.GetTitle(), Class: w.GetClass(),
				X: int(w.GetX()), Y: int(w.GetY()), Width: int(w.GetWidth()), Height: int(w.GetHeight()),
				Focused: w.GetFocused(),
			})
		}
	case action.TypeClipboardGet:
		// The agent checks the text; a caller gets valid UTF-8 even from
		// one that did not.
		text := strings.ToValidUTF8(res.GetText(), "\uFFFD")
		r.Text = &text
	}
	return r
}

// agentMessage makes the agent's error text fit for a caller: its first
// line, valid UTF-8, at most 512 bytes, without the "action N: " prefix
// the agent's validation errors carry (the index is reported separately,
// relative to the caller's own list).
func agentMessage(msg string) string {
	msg = strings.TrimSpace(strings.ToValidUTF8(msg, "\uFFFD"))
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	if rest, ok := strings.CutPrefix(msg, "action "); ok {
		if i := strings.Index(rest, ": "); i > 0 && strings.Trim(rest[:i], "0123456789") == "" {
			msg = rest[i+2:]
		}
	}
	const maxLen = 512
	if len(msg) > maxLen {
		cut := maxLen
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return msg
}
