package computer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/strictjson"
)

// Anthropic's computer tool versions (the "type" of its tool definition).
const (
	AnthropicV20241022 = "computer_20241022"
	AnthropicV20250124 = "computer_20250124"
	AnthropicV20251124 = "computer_20251124"
	AnthropicToolset   = "computer_toolset_20260801"
)

// Anthropic's image limits: an image whose long edge exceeds 1568 pixels or
// whose area exceeds about 1.15 megapixels is resized by the API (older
// models) or refused (the current toolset), so cubicle never sends one.
const (
	anthropicMaxEdge   = 1568
	anthropicMaxPixels = 1_150_000
	// maxAnthropicSeconds bounds wait and hold_key, as the reference
	// implementation does: a model asking for longer has lost its way.
	maxAnthropicSeconds = 100
	maxRepeat           = 100
)

// anthropicTargets are the screenshot sizes Anthropic recommends, chosen by
// the screen's aspect ratio (XGA 4:3, WXGA 16:10, FWXGA ~16:9).
var anthropicTargets = []Size{{1024, 768}, {1280, 800}, {1366, 768}}

// since lists each action with the first tool version that has it.
var anthropicSince = map[string]string{
	"key": AnthropicV20241022, "type": AnthropicV20241022, "mouse_move": AnthropicV20241022,
	"left_click": AnthropicV20241022, "left_click_drag": AnthropicV20241022,
	"right_click": AnthropicV20241022, "middle_click": AnthropicV20241022,
	"double_click": AnthropicV20241022, "screenshot": AnthropicV20241022,
	"cursor_position": AnthropicV20241022,
	"left_mouse_down": AnthropicV20250124, "left_mouse_up": AnthropicV20250124,
	"scroll": AnthropicV20250124, "hold_key": AnthropicV20250124, "wait": AnthropicV20250124,
	"triple_click": AnthropicV20250124,
	"zoom":         AnthropicV20251124,
}

var anthropicOrder = map[string]int{AnthropicV20241022: 0, AnthropicV20250124: 1, AnthropicV20251124: 2, AnthropicToolset: 3}

// AnthropicActions lists every action of Anthropic's computer tool that
// cubicle runs, in the order of Anthropic's documentation.
func AnthropicActions() []string {
	return []string{"key", "type", "mouse_move", "left_click", "left_click_drag", "right_click",
		"middle_click", "double_click", "triple_click", "screenshot", "cursor_position",
		"left_mouse_down", "left_mouse_up", "scroll", "hold_key", "wait", "zoom"}
}

// AnthropicTool is the tool definition the caller gave Anthropic's API;
// cubicle reads its version, display size and zoom switch from it. Its
// other fields (name, cache_control, …) are accepted and ignored.
type AnthropicTool struct {
	Type            string                     `json:"type"`
	DisplayWidthPx  int                        `json:"display_width_px,omitempty"`
	DisplayHeightPx int                        `json:"display_height_px,omitempty"`
	EnableZoom      *bool                      `json:"enable_zoom,omitempty"`
	Configs         map[string]AnthropicConfig `json:"configs,omitempty"`
}

// AnthropicConfig is a member's entry in a toolset's configs.
type AnthropicConfig struct {
	Enabled *bool `json:"enabled,omitempty"`
}

// AnthropicToolUse is a tool_use block of a model's answer, as the API
// returned it.
type AnthropicToolUse struct {
	Type        string          `json:"type,omitempty"`
	ID          string          `json:"id"`
	Name        string          `json:"name"`
	Input       json.RawMessage `json:"input"`
	ToolsetName string          `json:"toolset_name,omitempty"`
}

// anthropicRequest is the body of POST /v1/sandboxes/{id}/computer/anthropic.
type anthropicRequest struct {
	Tool     json.RawMessage   `json:"tool,omitempty"`
	Input    json.RawMessage   `json:"input,omitempty"`
	ToolUses []json.RawMessage `json:"tool_uses,omitempty"`
	Observe  *bool             `json:"observe,omitempty"`
	Image    *ImageOptions     `json:"image,omitempty"`
}

// ImageOptions choose how the vendor endpoints encode screenshots.
type ImageOptions struct {
	// Format is "png" (the default) or "jpeg", smaller on photos and
	// gradients.
	Format string `json:"format,omitempty"`
	// Quality is the JPEG quality, 1..100 (default 80).
	Quality int `json:"quality,omitempty"`
	// SettleMS, when set, takes each observing screenshot only once the
	// screen has had no change for this long (at most SettleMaxMS).
	SettleMS    int `json:"settle_ms,omitempty"`
	SettleMaxMS int `json:"settle_max_ms,omitempty"`
}

func (o *ImageOptions) check() error {
	switch o.Format {
	case "", action.FormatPNG, action.FormatJPEG:
	default:
		return fmt.Errorf(`image.format must be "png" or "jpeg", not %q`, o.Format)
	}
	if o.Quality < 0 || o.Quality > 100 || (o.Quality != 0 && o.Format != action.FormatJPEG) {
		return fmt.Errorf("image.quality must be 1..100 and only with format jpeg")
	}
	if o.SettleMS < 0 || o.SettleMS > action.MaxSettleMS || o.SettleMaxMS < 0 || o.SettleMaxMS > action.MaxSettleMS || (o.SettleMaxMS != 0 && o.SettleMS == 0) {
		return fmt.Errorf("image.settle_ms and settle_max_ms must be 0..%d, settle_max_ms only with settle_ms", action.MaxSettleMS)
	}
	return nil
}

// screenshot is the action that takes a picture of region (the whole
// screen when size is zero) at width w (0: unscaled).
func (o ImageOptions) screenshot(origin Point, size Size, w int) action.Action {
	a := action.Action{Type: action.TypeScreenshot, Format: o.Format, Quality: o.Quality, Width: w}
	if a.Format == "" {
		a.Format = action.FormatPNG
	}
	if size.Width > 0 {
		x, y := origin.X, origin.Y
		a.X, a.Y, a.W, a.H = &x, &y, size.Width, size.Height
	}
	applySettle(&a, o)
	return a
}

// anthropicInput is the input of one tool_use: the parameters of every
// action; which ones an action may have is checked per action.
type anthropicInput struct {
	Action          string   `json:"action,omitempty"`
	Coordinate      []int    `json:"coordinate,omitempty"`
	StartCoordinate []int    `json:"start_coordinate,omitempty"`
	Text            *string  `json:"text,omitempty"`
	ScrollDirection string   `json:"scroll_direction,omitempty"`
	ScrollAmount    *int     `json:"scroll_amount,omitempty"`
	Duration        *float64 `json:"duration,omitempty"`
	Region          []int    `json:"region,omitempty"`
	Repeat          *int     `json:"repeat,omitempty"`
}

// RequestError is a request that cannot run as given: nothing ran. Index
// is the tool use (or action) at fault, or -1.
type RequestError struct {
	Index int
	Msg   string
}

func (e *RequestError) Error() string { return e.Msg }

func badRequest(index int, format string, args ...any) *RequestError {
	return &RequestError{Index: index, Msg: fmt.Sprintf(format, args...)}
}

// AnthropicCall is a parsed request of Anthropic's computer tool.
type AnthropicCall struct {
	version  string
	display  Size // the tool's display size; zero: chosen by aspect ratio
	zoom     bool
	disabled map[string]bool // toolset members switched off
	single   bool            // the body had "input", not "tool_uses"
	observe  bool
	image    ImageOptions
	uses     []AnthropicToolUse
	inputs   []anthropicInput
}

// ParseAnthropic parses the body of POST …/computer/anthropic: {"tool"?,
// "input"} for one action or {"tool"?, "tool_uses": [...]} for the
// tool_use blocks of one model turn, plus "observe" (default true: a
// screenshot after actions that report nothing) and "image" options. The
// error is a *RequestError; the call comes with it once its tool uses are
// known, for ErrorResponse.
func ParseAnthropic(body []byte) (*AnthropicCall, error) {
	var req anthropicRequest
	if err := strictjson.Decode(body, &req); err != nil {
		return nil, badRequest(-1, "invalid request: %v", err)
	}
	c := &AnthropicCall{version: AnthropicToolset, zoom: true, observe: true}
	if req.Observe != nil {
		c.observe = *req.Observe
	}
	if req.Image != nil {
		if err := req.Image.check(); err != nil {
			return nil, badRequest(-1, "%v", err)
		}
		c.image = *req.Image
	}
	switch {
	case len(req.Input) > 0 && req.ToolUses != nil:
		return nil, badRequest(-1, `give "input" (one action) or "tool_uses" (a turn's tool_use blocks), not both`)
	case len(req.Input) > 0:
		c.single = true
		c.uses = []AnthropicToolUse{{Name: "computer", Input: req.Input}}
	case len(req.ToolUses) > 0:
		if len(req.ToolUses) > action.MaxActions/10 {
			return nil, badRequest(-1, "too many tool_uses: %d (at most %d)", len(req.ToolUses), action.MaxActions/10)
		}
		for i, raw := range req.ToolUses {
			var u AnthropicToolUse
			if err := strictjson.DecodeWith(raw, &u, strictjson.Options{AllowUnknownFields: true}); err != nil {
				return nil, badRequest(i, "tool_uses[%d]: %v", i, err)
			}
			if u.Type != "" && u.Type != "tool_use" {
				return nil, badRequest(i, `tool_uses[%d]: type must be "tool_use", not %q`, i, u.Type)
			}
			if len(u.Input) == 0 {
				return nil, badRequest(i, "tool_uses[%d] has no input", i)
			}
			c.uses = append(c.uses, u)
		}
	default:
		return nil, badRequest(-1, `the request needs "input" (a tool_use's input, such as {"action": "screenshot"}) or "tool_uses"`)
	}
	if len(req.Tool) > 0 {
		var tool AnthropicTool
		if err := strictjson.DecodeWith(req.Tool, &tool, strictjson.Options{AllowUnknownFields: true}); err != nil {
			return c, badRequest(-1, "invalid tool: %v", err)
		}
		if err := c.setTool(tool); err != nil {
			return c, err
		}
	}
	for i, u := range c.uses {
		in, err := c.parseInput(u)
		if err != nil {
			return c, badRequest(i, "%s", err)
		}
		c.inputs = append(c.inputs, in)
	}
	return c, nil
}

func (c *AnthropicCall) setTool(t AnthropicTool) error {
	if _, ok := anthropicOrder[t.Type]; !ok {
		return badRequest(-1, "tool.type %q is not a computer tool cubicle knows: %s, %s, %s or %s",
			t.Type, AnthropicV20241022, AnthropicV20250124, AnthropicV20251124, AnthropicToolset)
	}
	c.version = t.Type
	if (t.DisplayWidthPx == 0) != (t.DisplayHeightPx == 0) || t.DisplayWidthPx < 0 || t.DisplayHeightPx < 0 {
		return badRequest(-1, "tool.display_width_px and display_height_px must be given together, both positive")
	}
	if t.DisplayWidthPx > 0 {
		if max(t.DisplayWidthPx, t.DisplayHeightPx) > anthropicMaxEdge || t.DisplayWidthPx*t.DisplayHeightPx > anthropicMaxPixels {
			return badRequest(-1, "tool display %d×%d is larger than Anthropic accepts for images (long edge at most %d px, at most %d pixels); use a scale target such as 1024×768 (XGA) or 1280×800 (WXGA)",
				t.DisplayWidthPx, t.DisplayHeightPx, anthropicMaxEdge, anthropicMaxPixels)
		}
		c.display = Size{t.DisplayWidthPx, t.DisplayHeightPx}
	} else if t.Type != AnthropicToolset {
		return badRequest(-1, "tool %s needs display_width_px and display_height_px", t.Type)
	}
	switch t.Type {
	case AnthropicToolset:
		c.zoom = t.EnableZoom == nil || *t.EnableZoom
		for name, cfg := range t.Configs {
			if _, ok := anthropicSince[name]; !ok {
				return badRequest(-1, "tool.configs names %q, which is not a member of %s", name, t.Type)
			}
			if cfg.Enabled != nil && !*cfg.Enabled {
				if c.disabled == nil {
					c.disabled = map[string]bool{}
				}
				c.disabled[name] = true
			}
		}
	case AnthropicV20251124:
		c.zoom = t.EnableZoom != nil && *t.EnableZoom
	default:
		if t.EnableZoom != nil && *t.EnableZoom {
			return badRequest(-1, "tool %s has no zoom action; enable_zoom needs %s or later", t.Type, AnthropicV20251124)
		}
		c.zoom = false
	}
	return nil
}

// parseInput decodes one tool_use's input and checks it against the tool
// version: the action exists there and has exactly the parameters it
// takes. In a toolset the action is the block's name.
func (c *AnthropicCall) parseInput(u AnthropicToolUse) (anthropicInput, error) {
	var in anthropicInput
	if err := strictjson.Decode(u.Input, &in); err != nil {
		return in, fmt.Errorf("invalid input: %v", err)
	}
	if u.ToolsetName != "" || (u.Name != "computer" && u.Name != "") {
		// A toolset member: the block's name is the action.
		if in.Action != "" && in.Action != u.Name {
			return in, fmt.Errorf("input.action %q differs from the tool_use's name %q", in.Action, u.Name)
		}
		in.Action = u.Name
	}
	since, ok := anthropicSince[in.Action]
	switch {
	case in.Action == "":
		return in, fmt.Errorf(`input needs "action": one of %s`, strings.Join(AnthropicActions(), ", "))
	case !ok:
		return in, fmt.Errorf("unknown action %q: use one of %s", in.Action, strings.Join(AnthropicActions(), ", "))
	case anthropicOrder[since] > anthropicOrder[c.version]:
		return in, fmt.Errorf("action %s is not part of %s (it came with %s)", in.Action, c.version, since)
	case in.Action == "zoom" && !c.zoom:
		return in, fmt.Errorf("zoom is not enabled for this tool (enable_zoom)")
	case c.disabled[in.Action]:
		return in, fmt.Errorf("action %s is disabled in the toolset's configs", in.Action)
	}
	if in.Repeat != nil && (in.Action != "key" || c.version != AnthropicToolset) {
		return in, fmt.Errorf("repeat is taken only by key, in %s", AnthropicToolset)
	}
	v1 := c.version == AnthropicV20241022
	params := map[string]bool{
		"coordinate": in.Coordinate != nil, "start_coordinate": in.StartCoordinate != nil,
		"text": in.Text != nil, "scroll_direction": in.ScrollDirection != "",
		"scroll_amount": in.ScrollAmount != nil, "duration": in.Duration != nil,
		"region": in.Region != nil, "repeat": in.Repeat != nil,
	}
	var allowed, required []string
	switch in.Action {
	case "key":
		allowed, required = []string{"text", "repeat"}, []string{"text"}
	case "type":
		allowed, required = []string{"text"}, []string{"text"}
	case "mouse_move":
		allowed, required = []string{"coordinate"}, []string{"coordinate"}
	case "left_click", "right_click", "middle_click", "double_click", "triple_click":
		if !v1 {
			allowed = []string{"coordinate", "text"}
		}
	case "left_click_drag":
		allowed, required = []string{"coordinate"}, []string{"coordinate"}
		if !v1 {
			allowed = append(allowed, "start_coordinate")
		}
	case "left_mouse_down", "left_mouse_up":
		allowed = []string{"coordinate"}
	case "scroll":
		allowed, required = []string{"coordinate", "text", "scroll_direction", "scroll_amount"}, []string{"scroll_direction", "scroll_amount"}
	case "hold_key":
		allowed, required = []string{"text", "duration"}, []string{"text", "duration"}
	case "wait":
		allowed, required = []string{"duration"}, []string{"duration"}
	case "zoom":
		allowed, required = []string{"region"}, []string{"region"}
	}
	for _, p := range required {
		if !params[p] {
			return in, fmt.Errorf("%s needs %s", in.Action, p)
		}
	}
	for p, set := range params {
		if set && !contains(allowed, p) {
			return in, fmt.Errorf("%s does not take %s", in.Action, p)
		}
	}
	for name, pt := range map[string][]int{"coordinate": in.Coordinate, "start_coordinate": in.StartCoordinate} {
		if pt != nil && len(pt) != 2 {
			return in, fmt.Errorf("%s must be [x, y]", name)
		}
	}
	if in.Region != nil && len(in.Region) != 4 {
		return in, fmt.Errorf("region must be [x0, y0, x1, y1]")
	}
	if in.Text != nil && *in.Text == "" && in.Action != "left_click" && in.Action != "right_click" &&
		in.Action != "middle_click" && in.Action != "double_click" && in.Action != "triple_click" && in.Action != "scroll" {
		return in, fmt.Errorf("%s needs a non-empty text", in.Action)
	}
	if in.Repeat != nil && (*in.Repeat < 1 || *in.Repeat > maxRepeat) {
		return in, fmt.Errorf("repeat must be 1..%d, not %d", maxRepeat, *in.Repeat)
	}
	if in.Duration != nil && (math.IsNaN(*in.Duration) || *in.Duration <= 0 || *in.Duration > maxAnthropicSeconds) {
		return in, fmt.Errorf("duration must be more than 0 and at most %d seconds, not %v", maxAnthropicSeconds, *in.Duration)
	}
	if in.ScrollAmount != nil && (*in.ScrollAmount < 1 || *in.ScrollAmount > action.MaxScrollAmount) {
		return in, fmt.Errorf("scroll_amount must be 1..%d, not %d", action.MaxScrollAmount, *in.ScrollAmount)
	}
	return in, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// AnthropicFrame is the frame a call shows the screen in: the tool's
// display size, or, without one, the recommended target of the screen's
// aspect ratio when the screen is larger, or else a size within
// Anthropic's image limits.
func (c *AnthropicCall) AnthropicFrame(screen Size) Frame {
	if c.display.Width > 0 {
		return Fit(screen, c.display)
	}
	ratio := float64(screen.Width) / float64(screen.Height)
	for _, t := range anthropicTargets {
		if math.Abs(ratio-float64(t.Width)/float64(t.Height)) < 0.02 {
			return Fit(screen, t)
		}
	}
	f := Fit(screen, Size{anthropicMaxEdge, anthropicMaxEdge})
	for f.Image.Width*f.Image.Height > anthropicMaxPixels {
		f = Fit(screen, Size{f.Image.Width - 16, f.Image.Height - 16})
	}
	return f
}

// anthropicStep is the native actions one tool_use runs, and which of
// their results answers it.
type anthropicStep struct {
	first, n int    // the step's actions in the batch
	answer   string // "image", "cursor" or "" (nothing of its own)
}

// plan translates every tool_use into native actions in screen
// coordinates, in one batch, with a screenshot at the end when the last
// tool_use reports nothing of its own and the call observes.
func (c *AnthropicCall) plan(f Frame) ([]action.Action, []anthropicStep, error) {
	var acts []action.Action
	steps := make([]anthropicStep, len(c.inputs))
	for i, in := range c.inputs {
		as, answer, err := c.translate(in, f)
		if err != nil {
			return nil, nil, badRequest(i, "%s", err)
		}
		for j := range as {
			n, err := action.Normalize(as[j])
			if err != nil {
				return nil, nil, badRequest(i, "%s: %s", in.Action, strings.TrimPrefix(err.Error(), "action 0: "))
			}
			as[j] = n
		}
		steps[i] = anthropicStep{first: len(acts), n: len(as), answer: answer}
		acts = append(acts, as...)
	}
	if len(acts) > action.MaxActions {
		return nil, nil, badRequest(-1, "the tool uses make %d actions (at most %d)", len(acts), action.MaxActions)
	}
	return acts, steps, nil
}

// point maps a model coordinate to the screen.
func point(f Frame, xy []int) (*int, *int, error) {
	p, err := f.ToScreen(Point{xy[0], xy[1]})
	if err != nil {
		return nil, nil, err
	}
	return &p.X, &p.Y, nil
}

// modifiers returns the key_down and key_up actions that hold the keys
// of text ("ctrl+shift") around other actions; none for an empty text.
func modifiers(text *string) (down, up []action.Action, err error) {
	if text == nil || strings.TrimSpace(*text) == "" {
		return nil, nil, nil
	}
	keys := action.SplitCombo(strings.TrimSpace(*text))
	if _, err := action.ParseCombo(keys); err != nil {
		return nil, nil, fmt.Errorf("text (the keys held): %v", err)
	}
	return []action.Action{{Type: action.TypeKeyDown, Keys: keys}}, []action.Action{{Type: action.TypeKeyUp, Keys: keys}}, nil
}

func (c *AnthropicCall) translate(in anthropicInput, f Frame) ([]action.Action, string, error) {
	var x, y *int
	if in.Coordinate != nil {
		var err error
		if x, y, err = point(f, in.Coordinate); err != nil {
			return nil, "", err
		}
	}
	wrap := func(as ...action.Action) ([]action.Action, string, error) {
		down, up, err := modifiers(in.Text)
		if err != nil {
			return nil, "", err
		}
		return append(append(down, as...), up...), "", nil
	}
	switch in.Action {
	case "key":
		combos := strings.Fields(*in.Text)
		n := 1
		if in.Repeat != nil {
			n = *in.Repeat
		}
		var as []action.Action
		for r := 0; r < n; r++ {
			for _, combo := range combos {
				as = append(as, action.Action{Type: action.TypeKey, Keys: action.SplitCombo(combo)})
			}
		}
		return as, "", nil
	case "type":
		return []action.Action{{Type: action.TypeType, Text: *in.Text}}, "", nil
	case "mouse_move":
		return []action.Action{{Type: action.TypeMove, X: x, Y: y}}, "", nil
	case "left_click", "right_click", "middle_click":
		button := strings.TrimSuffix(in.Action, "_click")
		return wrap(action.Action{Type: action.TypeClick, X: x, Y: y, Button: button})
	case "double_click":
		return wrap(action.Action{Type: action.TypeDoubleClick, X: x, Y: y})
	case "triple_click":
		return wrap(action.Action{Type: action.TypeTripleClick, X: x, Y: y})
	case "left_click_drag":
		if in.StartCoordinate == nil {
			// computer_20241022: from wherever the pointer is.
			return []action.Action{{Type: action.TypeMouseDown}, {Type: action.TypeMove, X: x, Y: y}, {Type: action.TypeMouseUp}}, "", nil
		}
		sx, sy, err := point(f, in.StartCoordinate)
		if err != nil {
			return nil, "", fmt.Errorf("start_coordinate: %v", err)
		}
		return []action.Action{{Type: action.TypeDrag, Path: [][2]int{{*sx, *sy}, {*x, *y}}}}, "", nil
	case "left_mouse_down":
		return []action.Action{{Type: action.TypeMouseDown, X: x, Y: y}}, "", nil
	case "left_mouse_up":
		return []action.Action{{Type: action.TypeMouseUp, X: x, Y: y}}, "", nil
	case "scroll":
		switch in.ScrollDirection {
		case action.DirectionUp, action.DirectionDown, action.DirectionLeft, action.DirectionRight:
		default:
			return nil, "", fmt.Errorf("scroll_direction must be up, down, left or right, not %q", in.ScrollDirection)
		}
		return wrap(action.Action{Type: action.TypeScroll, X: x, Y: y, Direction: in.ScrollDirection, Amount: *in.ScrollAmount})
	case "hold_key":
		keys := action.SplitCombo(strings.TrimSpace(*in.Text))
		ms := int(math.Round(*in.Duration * 1000))
		if ms <= action.MaxDurationMS {
			return []action.Action{{Type: action.TypeHoldKey, Keys: keys, DurationMS: max(ms, 1)}}, "", nil
		}
		as := []action.Action{{Type: action.TypeKeyDown, Keys: keys}}
		as = append(as, waits(ms)...)
		return append(as, action.Action{Type: action.TypeKeyUp, Keys: keys}), "", nil
	case "wait":
		return waits(int(math.Round(*in.Duration * 1000))), "", nil
	case "cursor_position":
		return []action.Action{{Type: action.TypeCursorPosition}}, "cursor", nil
	case "screenshot":
		return []action.Action{c.image.screenshot(Point{}, Size{}, scaledTo(f))}, "image", nil
	case "zoom":
		r := in.Region
		origin, size, err := f.RegionToScreen(r[0], r[1], r[2], r[3])
		if err != nil {
			return nil, "", err
		}
		// The region at full resolution, but never larger than the
		// picture the model is shown.
		zf := Fit(size, f.Image)
		return []action.Action{c.image.screenshot(origin, size, scaledTo(zf))}, "image", nil
	}
	return nil, "", fmt.Errorf("unknown action %q", in.Action)
}

// scaledTo is the width to ask a screenshot for: 0 when unscaled.
func scaledTo(f Frame) int {
	if f.Scaled() {
		return f.Image.Width
	}
	return 0
}

// waits splits ms into wait actions the action language accepts.
func waits(ms int) []action.Action {
	var as []action.Action
	for ms > 0 {
		d := min(ms, action.MaxDurationMS)
		as = append(as, action.Action{Type: action.TypeWait, DurationMS: d})
		ms -= d
	}
	return as
}

// AnthropicContent is one block of a tool_result's content.
type AnthropicContent struct {
	Type   string                `json:"type"` // "text" or "image"
	Text   string                `json:"text,omitempty"`
	Source *AnthropicImageSource `json:"source,omitempty"`
}

// AnthropicImageSource is an image block's source.
type AnthropicImageSource struct {
	Type      string `json:"type"` // "base64"
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
}

// AnthropicResult is a tool_result block, ready to go back to the model.
type AnthropicResult struct {
	Type        string             `json:"type"` // "tool_result"
	ToolUseID   string             `json:"tool_use_id,omitempty"`
	ToolsetName string             `json:"toolset_name,omitempty"`
	Content     []AnthropicContent `json:"content,omitempty"`
	IsError     bool               `json:"is_error"`
}

// AnthropicResponse is the answer of the endpoint: the one tool_result
// (for "input") or one per tool_use (for "tool_uses").
type AnthropicResponse struct {
	Result  *AnthropicResult  // "input"
	Results []AnthropicResult // "tool_uses"
}

// MarshalJSON renders the single form as the tool_result itself and the
// batch form as {"tool_results": [...]}.
func (r AnthropicResponse) MarshalJSON() ([]byte, error) {
	if r.Result != nil {
		return json.Marshal(r.Result)
	}
	return json.Marshal(struct {
		Results []AnthropicResult `json:"tool_results"`
	}{r.Results})
}

// Run runs the call on a desktop whose screen is screen. A *RequestError
// means nothing ran (a point outside the screen); a *Failure that the
// agent stopped at an action, whose tool_use and the later ones are
// answered as errors in the response that comes with it. Any other error
// is the agent's transport.
func (c *AnthropicCall) Run(ctx context.Context, d Desktop, screen Size) (AnthropicResponse, error) {
	f := c.AnthropicFrame(screen)
	acts, steps, err := c.plan(f)
	if err != nil {
		return c.ErrorResponse(err), err
	}
	last := steps[len(steps)-1]
	observed := c.observe && last.answer == ""
	if observed {
		acts = append(acts, c.image.screenshot(Point{}, Size{}, scaledTo(f)))
	}
	out, err := Run(ctx, d, acts)
	if err != nil {
		return AnthropicResponse{}, err
	}
	results := make([]AnthropicResult, len(steps))
	failedAt := len(steps)
	if out.Failure != nil {
		failedAt = len(steps) - 1 // the observing screenshot failed: the last
		for i, s := range steps {
			if out.Failure.Index < s.first+s.n {
				failedAt = i
				break
			}
		}
	}
	for i, s := range steps {
		r := &results[i]
		r.Type, r.ToolUseID, r.ToolsetName = "tool_result", c.uses[i].ID, c.uses[i].ToolsetName
		switch {
		case i == failedAt:
			r.IsError = true
			r.Content = textContent(fmt.Sprintf("%s failed: %s", c.inputs[i].Action, out.Failure.Message))
			continue
		case i > failedAt:
			r.IsError = true
			r.Content = textContent(fmt.Sprintf("%s was not executed: an earlier action of this turn failed", c.inputs[i].Action))
			continue
		}
		idx := s.first + s.n - 1
		switch s.answer {
		case "cursor":
			if idx < len(out.Results) && out.Results[idx].Cursor != nil {
				p := f.ToImage(*out.Results[idx].Cursor)
				r.Content = textContent(fmt.Sprintf("X=%d,Y=%d", p.X, p.Y))
			}
		case "image":
			if idx < len(out.Results) && out.Results[idx].Image != nil {
				r.Content = imageContent(*out.Results[idx].Image)
			}
		}
	}
	if observed && failedAt == len(steps) && len(out.Results) == len(acts) {
		if im := out.Results[len(acts)-1].Image; im != nil {
			results[len(steps)-1].Content = imageContent(*im)
		}
	}
	resp := AnthropicResponse{Results: results}
	if c.single {
		resp = AnthropicResponse{Result: &results[0]}
	}
	if out.Failure != nil {
		return resp, out.Failure
	}
	return resp, nil
}

// ErrorResponse answers every tool_use of the call as an error with err's
// message, for a request refused before anything ran.
func (c *AnthropicCall) ErrorResponse(err error) AnthropicResponse {
	results := make([]AnthropicResult, len(c.uses))
	index := -1
	if re, ok := err.(*RequestError); ok {
		index = re.Index
	}
	for i, u := range c.uses {
		msg := "not executed: " + err.Error()
		if index >= 0 && i != index {
			msg = "not executed: another action of this turn is invalid"
		}
		results[i] = AnthropicResult{Type: "tool_result", ToolUseID: u.ID, ToolsetName: u.ToolsetName,
			Content: textContent(msg), IsError: true}
	}
	if c.single && len(results) == 1 {
		return AnthropicResponse{Result: &results[0]}
	}
	return AnthropicResponse{Results: results}
}

func textContent(s string) []AnthropicContent {
	return []AnthropicContent{{Type: "text", Text: s}}
}

func imageContent(im Image) []AnthropicContent {
	return []AnthropicContent{{Type: "image", Source: &AnthropicImageSource{
		Type: "base64", MediaType: im.MediaType(), Data: base64.StdEncoding.EncodeToString(im.Data),
	}}}
}
