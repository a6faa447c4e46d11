package computer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/strictjson"
)

// OpenAI's computer tool types.
const (
	OpenAIPreview = "computer_use_preview"
	OpenAIGA      = "computer"
)

// OpenAI's scroll is in pixels; X scrolls in wheel clicks. Chromium on X11
// scrolls about this far per click, so a model's scroll_y of 300 moves
// the page about as far as it asked.
const openaiPixelsPerClick = 100

// openaiWaitMS is how long OpenAI's wait action waits: the vendor's sample
// apps wait 1 to 2 seconds.
const openaiWaitMS = 1000

// OpenAIActions lists every action of OpenAI's computer tool that cubicle
// runs.
func OpenAIActions() []string {
	return []string{"click", "double_click", "drag", "keypress", "move", "scroll", "type", "wait", "screenshot"}
}

// OpenAITool is the tool definition the caller gave OpenAI's API.
type OpenAITool struct {
	Type          string `json:"type"`
	DisplayWidth  int    `json:"display_width,omitempty"`
	DisplayHeight int    `json:"display_height,omitempty"`
	Environment   string `json:"environment,omitempty"`
}

// OpenAISafetyCheck is a pending safety check of a computer_call.
type OpenAISafetyCheck struct {
	ID      string `json:"id"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// OpenAIComputerCall is a computer_call output item, as the API returned
// it: one action (preview) or a batch of actions (GA).
type OpenAIComputerCall struct {
	Type                string              `json:"type,omitempty"`
	ID                  string              `json:"id,omitempty"`
	CallID              string              `json:"call_id"`
	Status              string              `json:"status,omitempty"`
	Action              json.RawMessage     `json:"action,omitempty"`
	Actions             []json.RawMessage   `json:"actions,omitempty"`
	PendingSafetyChecks []OpenAISafetyCheck `json:"pending_safety_checks,omitempty"`
}

type openaiRequest struct {
	Tool                    json.RawMessage `json:"tool,omitempty"`
	ComputerCall            json.RawMessage `json:"computer_call"`
	AcknowledgeSafetyChecks bool            `json:"acknowledge_safety_checks,omitempty"`
	Image                   *ImageOptions   `json:"image,omitempty"`
}

type openaiPoint struct {
	X int `json:"x"`
	Y int `json:"y"`
}

// openaiAction is one action of a computer_call.
type openaiAction struct {
	Type    string        `json:"type"`
	X       *int          `json:"x,omitempty"`
	Y       *int          `json:"y,omitempty"`
	Button  string        `json:"button,omitempty"`
	Keys    []string      `json:"keys,omitempty"`
	Path    []openaiPoint `json:"path,omitempty"`
	ScrollX *int          `json:"scroll_x,omitempty"`
	ScrollY *int          `json:"scroll_y,omitempty"`
	Text    *string       `json:"text,omitempty"`
}

// OpenAICall is a parsed request of OpenAI's computer tool.
type OpenAICall struct {
	display     Size
	call        OpenAIComputerCall
	actions     []openaiAction
	acknowledge bool
	image       ImageOptions
}

// ParseOpenAI parses the body of POST …/computer/openai: {"tool"?,
// "computer_call", "acknowledge_safety_checks"?, "image"?}. The error is a
// *RequestError; the call comes with it when only an action is wrong, for
// Observe.
func ParseOpenAI(body []byte) (*OpenAICall, error) {
	var req openaiRequest
	if err := strictjson.Decode(body, &req); err != nil {
		return nil, badRequest(-1, "invalid request: %v", err)
	}
	c := &OpenAICall{acknowledge: req.AcknowledgeSafetyChecks}
	if req.Image != nil {
		if err := req.Image.check(); err != nil {
			return nil, badRequest(-1, "%v", err)
		}
		c.image = *req.Image
	}
	if len(req.Tool) > 0 {
		var tool OpenAITool
		if err := strictjson.DecodeWith(req.Tool, &tool, strictjson.Options{AllowUnknownFields: true}); err != nil {
			return nil, badRequest(-1, "invalid tool: %v", err)
		}
		switch tool.Type {
		case OpenAIPreview, OpenAIGA:
		default:
			return nil, badRequest(-1, "tool.type must be %q or %q, not %q", OpenAIPreview, OpenAIGA, tool.Type)
		}
		if (tool.DisplayWidth == 0) != (tool.DisplayHeight == 0) || tool.DisplayWidth < 0 || tool.DisplayHeight < 0 {
			return nil, badRequest(-1, "tool.display_width and display_height must be given together, both positive")
		}
		if tool.Type == OpenAIPreview && tool.DisplayWidth == 0 {
			return nil, badRequest(-1, "tool %s needs display_width and display_height", OpenAIPreview)
		}
		c.display = Size{tool.DisplayWidth, tool.DisplayHeight}
	}
	if len(req.ComputerCall) == 0 {
		return nil, badRequest(-1, `the request needs "computer_call": the computer_call item of the model's response`)
	}
	if err := strictjson.DecodeWith(req.ComputerCall, &c.call, strictjson.Options{AllowUnknownFields: true}); err != nil {
		return nil, badRequest(-1, "invalid computer_call: %v", err)
	}
	if c.call.Type != "" && c.call.Type != "computer_call" {
		return nil, badRequest(-1, `computer_call.type must be "computer_call", not %q`, c.call.Type)
	}
	if c.call.CallID == "" {
		return nil, badRequest(-1, "computer_call needs call_id")
	}
	raws := c.call.Actions
	switch {
	case len(c.call.Action) > 0 && raws != nil:
		return nil, badRequest(-1, `computer_call has both "action" and "actions"`)
	case len(c.call.Action) > 0:
		raws = []json.RawMessage{c.call.Action}
	case len(raws) == 0:
		return nil, badRequest(-1, `computer_call has no "action" or "actions"`)
	case len(raws) > action.MaxActions/10:
		return nil, badRequest(-1, "too many actions: %d (at most %d)", len(raws), action.MaxActions/10)
	}
	for i, raw := range raws {
		var a openaiAction
		if err := strictjson.Decode(raw, &a); err != nil {
			return c, badRequest(i, "action %d: invalid action: %v", i, err)
		}
		if err := checkOpenAI(a); err != nil {
			return c, badRequest(i, "action %d (%s): %v", i, a.Type, err)
		}
		c.actions = append(c.actions, a)
	}
	return c, nil
}

// checkOpenAI checks that an action has exactly the fields its type takes.
func checkOpenAI(a openaiAction) error {
	set := map[string]bool{
		"x": a.X != nil, "y": a.Y != nil, "button": a.Button != "", "keys": a.Keys != nil,
		"path": a.Path != nil, "scroll_x": a.ScrollX != nil, "scroll_y": a.ScrollY != nil, "text": a.Text != nil,
	}
	var allowed, required []string
	switch a.Type {
	case "click":
		allowed, required = []string{"x", "y", "button", "keys"}, []string{"x", "y"}
	case "double_click", "move":
		allowed, required = []string{"x", "y", "keys"}, []string{"x", "y"}
	case "drag":
		allowed, required = []string{"path", "keys"}, []string{"path"}
	case "keypress":
		allowed, required = []string{"keys"}, []string{"keys"}
	case "scroll":
		allowed, required = []string{"x", "y", "scroll_x", "scroll_y", "keys"}, []string{"x", "y"}
	case "type":
		allowed, required = []string{"text"}, []string{"text"}
	case "wait", "screenshot":
	case "":
		return fmt.Errorf(`the action needs "type": one of %s`, strings.Join(OpenAIActions(), ", "))
	default:
		return fmt.Errorf("unknown action type %q: use one of %s", a.Type, strings.Join(OpenAIActions(), ", "))
	}
	for _, f := range required {
		if !set[f] {
			return fmt.Errorf("%s needs %s", a.Type, f)
		}
	}
	for f, ok := range set {
		if ok && !contains(allowed, f) {
			return fmt.Errorf("%s does not take %s", a.Type, f)
		}
	}
	if a.Type == "keypress" && len(a.Keys) == 0 {
		return fmt.Errorf("keypress needs at least one key")
	}
	if a.Type == "type" && *a.Text == "" {
		return fmt.Errorf("type needs a non-empty text")
	}
	if a.Type == "drag" && len(a.Path) < 2 {
		return fmt.Errorf("drag needs a path of at least 2 points")
	}
	if a.Type == "scroll" && deref(a.ScrollX) == 0 && deref(a.ScrollY) == 0 {
		return fmt.Errorf("scroll needs a non-zero scroll_x or scroll_y")
	}
	return nil
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// SafetyChecks returns the call's pending safety checks and whether the
// caller acknowledged them.
func (c *OpenAICall) SafetyChecks() ([]OpenAISafetyCheck, bool) {
	return c.call.PendingSafetyChecks, c.acknowledge
}

// OpenAIFrame is the frame a call shows the screen in: the tool's display
// size, or the screen itself.
func (c *OpenAICall) OpenAIFrame(screen Size) Frame { return Fit(screen, c.display) }

// openaiKeys maps OpenAI's key names to the action language's: names are
// matched case-insensitively (the action language's aliases cover the
// sample apps' ENTER, ESC, CTRL, CMD, OPTION, ARROWLEFT, PAGEDOWN, F1–F35),
// and a letter in a combo with a modifier is the letter's key, not its
// capital ("CTRL"+"C" is ctrl+c, not ctrl+shift+c).
func openaiKeys(keys []string) ([]string, error) {
	out := make([]string, len(keys))
	for i, k := range keys {
		k = strings.TrimSpace(k)
		if utf8.RuneCountInString(k) == 1 && len(keys) > 1 {
			k = strings.ToLower(k)
		}
		out[i] = k
	}
	if _, err := action.ParseCombo(out); err != nil {
		return nil, err
	}
	return out, nil
}

// openaiButton maps OpenAI's button names to the action language's.
func openaiButton(b string) (string, error) {
	switch strings.ToLower(b) {
	case "", "left":
		return action.ButtonLeft, nil
	case "right":
		return action.ButtonRight, nil
	case "wheel", "middle":
		return action.ButtonMiddle, nil
	case "back":
		return action.ButtonBack, nil
	case "forward":
		return action.ButtonForward, nil
	}
	return "", fmt.Errorf("button must be left, right, wheel, back or forward, not %q", b)
}

// scrollClicks turns a scroll in pixels into wheel clicks: at least one
// for any non-zero scroll, at most the action language's maximum.
func scrollClicks(px int) int {
	if px < 0 {
		px = -px
	}
	return min(action.MaxScrollAmount, max(1, (px+openaiPixelsPerClick/2)/openaiPixelsPerClick))
}

func (c *OpenAICall) translate(a openaiAction, f Frame) ([]action.Action, error) {
	var x, y *int
	if a.X != nil {
		p, err := f.ToScreen(Point{*a.X, *a.Y})
		if err != nil {
			return nil, err
		}
		x, y = &p.X, &p.Y
	}
	var down, up []action.Action
	if len(a.Keys) > 0 && a.Type != "keypress" {
		keys, err := openaiKeys(a.Keys)
		if err != nil {
			return nil, fmt.Errorf("keys (held): %v", err)
		}
		down, up = []action.Action{{Type: action.TypeKeyDown, Keys: keys}}, []action.Action{{Type: action.TypeKeyUp, Keys: keys}}
	}
	held := func(as ...action.Action) []action.Action { return append(append(down, as...), up...) }
	switch a.Type {
	case "click":
		b, err := openaiButton(a.Button)
		if err != nil {
			return nil, err
		}
		return held(action.Action{Type: action.TypeClick, X: x, Y: y, Button: b}), nil
	case "double_click":
		return held(action.Action{Type: action.TypeDoubleClick, X: x, Y: y}), nil
	case "move":
		return held(action.Action{Type: action.TypeMove, X: x, Y: y}), nil
	case "drag":
		path := make([][2]int, len(a.Path))
		for i, p := range a.Path {
			sp, err := f.ToScreen(Point(p))
			if err != nil {
				return nil, fmt.Errorf("path[%d]: %v", i, err)
			}
			path[i] = [2]int{sp.X, sp.Y}
		}
		return held(action.Action{Type: action.TypeDrag, Path: path}), nil
	case "keypress":
		keys, err := openaiKeys(a.Keys)
		if err != nil {
			return nil, err
		}
		return []action.Action{{Type: action.TypeKey, Keys: keys}}, nil
	case "scroll":
		var as []action.Action
		if sy := deref(a.ScrollY); sy != 0 {
			dir := action.DirectionDown
			if sy < 0 {
				dir = action.DirectionUp
			}
			as = append(as, action.Action{Type: action.TypeScroll, X: x, Y: y, Direction: dir, Amount: scrollClicks(sy)})
		}
		if sx := deref(a.ScrollX); sx != 0 {
			dir := action.DirectionRight
			if sx < 0 {
				dir = action.DirectionLeft
			}
			as = append(as, action.Action{Type: action.TypeScroll, X: x, Y: y, Direction: dir, Amount: scrollClicks(sx)})
		}
		return held(as...), nil
	case "type":
		return []action.Action{{Type: action.TypeType, Text: *a.Text}}, nil
	case "wait":
		return []action.Action{{Type: action.TypeWait, DurationMS: openaiWaitMS}}, nil
	case "screenshot":
		return nil, nil // every call ends with one
	}
	return nil, fmt.Errorf("unknown action type %q", a.Type)
}

// OpenAIOutput is the computer_call_output item to send back.
type OpenAIOutput struct {
	Type                     string              `json:"type"` // "computer_call_output"
	CallID                   string              `json:"call_id"`
	Output                   OpenAIScreenshot    `json:"output"`
	AcknowledgedSafetyChecks []OpenAISafetyCheck `json:"acknowledged_safety_checks,omitempty"`
}

// OpenAIScreenshot is the output of a computer call.
type OpenAIScreenshot struct {
	Type     string `json:"type"` // "computer_screenshot"
	ImageURL string `json:"image_url"`
}

// Run runs the call's actions on a desktop whose screen is screen and
// takes the screenshot that answers it. A *RequestError means nothing ran;
// a *Failure that the agent stopped at an action (Index is the
// computer_call's action); other errors are the agent's transport. The
// caller checks the safety checks first.
func (c *OpenAICall) Run(ctx context.Context, d Desktop, screen Size) (OpenAIOutput, error) {
	f := c.OpenAIFrame(screen)
	var acts []action.Action
	var owner []int // owner[k]: the computer_call action of native action k
	for i, a := range c.actions {
		as, err := c.translate(a, f)
		if err != nil {
			return OpenAIOutput{}, badRequest(i, "action %d (%s): %v", i, a.Type, err)
		}
		for _, na := range as {
			n, err := action.Normalize(na)
			if err != nil {
				return OpenAIOutput{}, badRequest(i, "action %d (%s): %s", i, a.Type, strings.TrimPrefix(err.Error(), "action 0: "))
			}
			acts = append(acts, n)
			owner = append(owner, i)
		}
	}
	acts = append(acts, c.image.screenshot(Point{}, Size{}, scaledTo(f)))
	owner = append(owner, len(c.actions)-1)
	out, err := Run(ctx, d, acts)
	if err != nil {
		return OpenAIOutput{}, err
	}
	if out.Failure != nil {
		fl := *out.Failure
		fl.Index = owner[min(max(fl.Index, 0), len(owner)-1)]
		fl.Type = c.actions[fl.Index].Type
		return OpenAIOutput{}, &fl
	}
	im := out.Results[len(out.Results)-1].Image
	if im == nil {
		return OpenAIOutput{}, fmt.Errorf("the agent returned no screenshot")
	}
	o := c.output(*im)
	if c.acknowledge {
		o.AcknowledgedSafetyChecks = c.call.PendingSafetyChecks
	}
	return o, nil
}

// Observe takes the screenshot that answers the call without running any
// of its actions. An error answer carries it: the Responses API wants a
// computer_call_output for every call before the conversation goes on, so
// an agent loop can send it with the reason and let the model try again.
func (c *OpenAICall) Observe(ctx context.Context, d Desktop, screen Size) (OpenAIOutput, error) {
	out, err := Run(ctx, d, []action.Action{c.image.screenshot(Point{}, Size{}, scaledTo(c.OpenAIFrame(screen)))})
	if err != nil {
		return OpenAIOutput{}, err
	}
	if out.Failure != nil {
		return OpenAIOutput{}, out.Failure
	}
	if len(out.Results) != 1 || out.Results[0].Image == nil {
		return OpenAIOutput{}, fmt.Errorf("the agent returned no screenshot")
	}
	return c.output(*out.Results[0].Image), nil
}

func (c *OpenAICall) output(im Image) OpenAIOutput {
	return OpenAIOutput{
		Type: "computer_call_output", CallID: c.call.CallID,
		Output: OpenAIScreenshot{Type: "computer_screenshot",
			ImageURL: "data:" + im.MediaType() + ";base64," + base64.StdEncoding.EncodeToString(im.Data)},
	}
}
