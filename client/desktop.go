package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// Region is a rectangle of the screen in pixels, origin top-left.
type Region struct {
	X, Y, W, H int
}

// ScreenshotOptions selects the image Screenshot returns. Zero fields take
// the daemon's defaults: a full-size PNG without the pointer.
type ScreenshotOptions struct {
	// Format is "png" (default) or "jpeg".
	Format string
	// Quality is the JPEG quality, 1..100.
	Quality int
	// Scale downscales by this factor, 0.1..1; alternatively Width.
	Scale float64
	// Width downscales to this width, keeping the aspect ratio.
	Width int
	// Region crops to this rectangle.
	Region *Region
	// Cursor draws the mouse pointer.
	Cursor bool
	// SettleMS waits, before the capture, until the screen has had no
	// change for this long (the page has painted), but at most
	// SettleMaxMS (default 2000; both at most 10000).
	SettleMS, SettleMaxMS int
}

func (o ScreenshotOptions) query() url.Values {
	q := url.Values{}
	if o.Format != "" {
		q.Set("format", o.Format)
	}
	if o.Quality != 0 {
		q.Set("quality", strconv.Itoa(o.Quality))
	}
	if o.Scale != 0 {
		q.Set("scale", strconv.FormatFloat(o.Scale, 'f', -1, 64))
	}
	if o.Width != 0 {
		q.Set("width", strconv.Itoa(o.Width))
	}
	if r := o.Region; r != nil {
		q.Set("x", strconv.Itoa(r.X))
		q.Set("y", strconv.Itoa(r.Y))
		q.Set("w", strconv.Itoa(r.W))
		q.Set("h", strconv.Itoa(r.H))
	}
	if o.Cursor {
		q.Set("cursor", "true")
	}
	if o.SettleMS != 0 {
		q.Set("settle_ms", strconv.Itoa(o.SettleMS))
	}
	if o.SettleMaxMS != 0 {
		q.Set("settle_max_ms", strconv.Itoa(o.SettleMaxMS))
	}
	return q
}

// Screenshot returns the sandbox's screen as encoded image bytes (PNG or
// JPEG per opts.Format).
func (c *Client) Screenshot(ctx context.Context, id string, opts ScreenshotOptions) ([]byte, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	r := &request{method: http.MethodGet, path: sandboxPath(id, "screenshot"), query: opts.query(), accept: "image/*", retry: true}
	ctx, cancel := c.withTimeout(ctx, r)
	defer cancel()
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("screenshot %s: %w", id, err)
	}
	return b, nil
}

// Action types (Action.Type).
const (
	ActionMove           = "move"
	ActionClick          = "click"
	ActionDoubleClick    = "double_click"
	ActionTripleClick    = "triple_click"
	ActionMouseDown      = "mouse_down"
	ActionMouseUp        = "mouse_up"
	ActionDrag           = "drag"
	ActionScroll         = "scroll"
	ActionType           = "type"
	ActionKey            = "key"
	ActionKeyDown        = "key_down"
	ActionKeyUp          = "key_up"
	ActionHoldKey        = "hold_key"
	ActionWait           = "wait"
	ActionCursorPosition = "cursor_position"
	ActionScreenSize     = "screen_size"
	ActionScreenshot     = "screenshot"
	ActionWindows        = "windows"
	// ActionClipboardGet and ActionClipboardSet read and write the text
	// of the desktop's clipboard (the CLIPBOARD selection, what ctrl+c
	// copies and ctrl+v pastes).
	ActionClipboardGet = "clipboard_get"
	ActionClipboardSet = "clipboard_set"
)

// Point is a screen position; on the wire it is [x, y].
type Point struct{ X, Y int }

// MarshalJSON encodes p as [x, y].
func (p Point) MarshalJSON() ([]byte, error) { return json.Marshal([2]int{p.X, p.Y}) }

// UnmarshalJSON decodes [x, y] or {"x": x, "y": y}.
func (p *Point) UnmarshalJSON(b []byte) error {
	var a [2]int
	if err := json.Unmarshal(b, &a); err == nil {
		p.X, p.Y = a[0], a[1]
		return nil
	}
	var o struct{ X, Y int }
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	p.X, p.Y = o.X, o.Y
	return nil
}

// Action is one step of an Actions call. Set Type and the fields that type
// uses (see API.md's table); the constructors below (MoveTo, ClickAt, …)
// fill them in. Coordinates are screen pixels, origin top-left.
type Action struct {
	Type string `json:"type"`
	// X and Y are the pointer position for pointer actions (nil: where the
	// pointer is) and the region origin for a screenshot action.
	X *int `json:"x,omitempty"`
	Y *int `json:"y,omitempty"`
	// Button is left (default), right or middle.
	Button string `json:"button,omitempty"`
	// Count is 1, 2 or 3 clicks.
	Count int `json:"count,omitempty"`
	// Path is a drag's points, at least two.
	Path []Point `json:"path,omitempty"`
	// Direction is a scroll's up, down, left or right; Amount its steps.
	Direction string `json:"direction,omitempty"`
	Amount    int    `json:"amount,omitempty"`
	// Text is what a type action types (any Unicode), or what a
	// clipboard_set puts on the clipboard (at most 64 KiB, no NUL).
	Text    string `json:"text,omitempty"`
	DelayMS int    `json:"delay_ms,omitempty"`
	// Keys is a key combination such as "ctrl+shift+t" in xdotool keysym
	// names or common aliases (enter, esc, cmd, pageup, …).
	Keys string `json:"keys,omitempty"`
	// DurationMS is how long hold_key holds and wait waits (≤ 60000).
	DurationMS int `json:"duration_ms,omitempty"`
	// Screenshot action options (X and Y above are the region origin).
	Format  string  `json:"format,omitempty"`
	Quality int     `json:"quality,omitempty"`
	Scale   float64 `json:"scale,omitempty"`
	Width   int     `json:"width,omitempty"`
	W       int     `json:"w,omitempty"`
	H       int     `json:"h,omitempty"`
	Cursor  bool    `json:"cursor,omitempty"`
	// SettleMS and SettleMaxMS make a screenshot wait for a still screen
	// (see ScreenshotOptions).
	SettleMS    int `json:"settle_ms,omitempty"`
	SettleMaxMS int `json:"settle_max_ms,omitempty"`
}

func at(x, y int) (*int, *int) { return &x, &y }

// MoveTo returns an action moving the pointer to (x, y).
func MoveTo(x, y int) Action {
	a := Action{Type: ActionMove}
	a.X, a.Y = at(x, y)
	return a
}

// ClickAt returns an action left-clicking once at (x, y). Set Button and
// Count on the result for other clicks.
func ClickAt(x, y int) Action {
	a := Action{Type: ActionClick}
	a.X, a.Y = at(x, y)
	return a
}

// DragPath returns an action dragging with the left button along path
// (at least two points).
func DragPath(path ...Point) Action { return Action{Type: ActionDrag, Path: path} }

// ScrollBy returns an action scrolling amount steps in direction (up, down,
// left, right) where the pointer is. Set X and Y on the result to scroll
// elsewhere.
func ScrollBy(direction string, amount int) Action {
	return Action{Type: ActionScroll, Direction: direction, Amount: amount}
}

// TypeText returns an action typing text.
func TypeText(text string) Action { return Action{Type: ActionType, Text: text} }

// PressKey returns an action pressing and releasing the combination keys,
// e.g. "ctrl+l" or "enter".
func PressKey(keys string) Action { return Action{Type: ActionKey, Keys: keys} }

// WaitMS returns an action pausing the list for ms milliseconds (≤ 60000).
func WaitMS(ms int) Action { return Action{Type: ActionWait, DurationMS: ms} }

// SetClipboard returns an action putting text on the desktop's clipboard,
// for a later ctrl+v to paste.
func SetClipboard(text string) Action { return Action{Type: ActionClipboardSet, Text: text} }

// Window is one top-level window of the desktop.
type Window struct {
	ID      string `json:"id"`
	Title   string `json:"title"`
	Class   string `json:"class"`
	X       int    `json:"x"`
	Y       int    `json:"y"`
	Width   int    `json:"width"`
	Height  int    `json:"height"`
	Focused bool   `json:"focused"`
}

// UnmarshalJSON decodes a Window, accepting a numeric or string id.
func (w *Window) UnmarshalJSON(b []byte) error {
	type plain Window
	var v struct {
		*plain
		ID json.RawMessage `json:"id"`
	}
	v.plain = (*plain)(w)
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	w.ID = ""
	if len(v.ID) > 0 && string(v.ID) != "null" {
		var s string
		if json.Unmarshal(v.ID, &s) == nil {
			w.ID = s
		} else {
			w.ID = string(v.ID)
		}
	}
	return nil
}

// ActionResult is the result of one action. Which fields are set depends
// on Type: X and Y for cursor_position; Width and Height for screen_size
// and screenshot; Format and Data (decoded image bytes) for screenshot;
// Windows for windows; Text for clipboard_get ("" for an empty
// clipboard).
type ActionResult struct {
	Type    string   `json:"type"`
	X       int      `json:"x,omitempty"`
	Y       int      `json:"y,omitempty"`
	Width   int      `json:"width,omitempty"`
	Height  int      `json:"height,omitempty"`
	Format  string   `json:"format,omitempty"`
	Data    []byte   `json:"data,omitempty"`
	Windows []Window `json:"windows,omitempty"`
	Text    string   `json:"text,omitempty"`
	// Settled and SettleWaitMS report, for a screenshot that asked to
	// settle, whether the screen went still in time and how long it took.
	Settled      *bool `json:"settled,omitempty"`
	SettleWaitMS int   `json:"settle_wait_ms,omitempty"`
}

// ActionsResponse is the answer to Actions: one result per action, in
// order.
type ActionsResponse struct {
	Results    []ActionResult `json:"results"`
	DurationMS int64          `json:"duration_ms"`
}

// Actions runs actions in order in one round trip. The first failing action
// stops the list: the error is an *APIError whose Index says which one (the
// ones before it ran). Actions is never retried.
func (c *Client) Actions(ctx context.Context, id string, actions ...Action) (ActionsResponse, error) {
	if err := checkID(id); err != nil {
		return ActionsResponse{}, err
	}
	if actions == nil {
		actions = []Action{}
	}
	body, n, err := jsonBody(struct {
		Actions []Action `json:"actions"`
	}{actions})
	if err != nil {
		return ActionsResponse{}, err
	}
	var out ActionsResponse
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "actions"), body: body, contentLen: n, contentType: "application/json"}, &out)
	return out, err
}

// action runs a single action and returns its result.
func (c *Client) action(ctx context.Context, id string, a Action) (ActionResult, error) {
	resp, err := c.Actions(ctx, id, a)
	if err != nil {
		return ActionResult{}, err
	}
	if len(resp.Results) == 0 {
		return ActionResult{Type: a.Type}, nil
	}
	return resp.Results[0], nil
}

// Click left-clicks once at (x, y).
func (c *Client) Click(ctx context.Context, id string, x, y int) error {
	_, err := c.action(ctx, id, ClickAt(x, y))
	return err
}

// Move moves the pointer to (x, y).
func (c *Client) Move(ctx context.Context, id string, x, y int) error {
	_, err := c.action(ctx, id, MoveTo(x, y))
	return err
}

// Drag drags with the left button along path (at least two points).
func (c *Client) Drag(ctx context.Context, id string, path ...Point) error {
	_, err := c.action(ctx, id, DragPath(path...))
	return err
}

// Scroll scrolls amount steps in direction (up, down, left, right) where
// the pointer is.
func (c *Client) Scroll(ctx context.Context, id, direction string, amount int) error {
	_, err := c.action(ctx, id, ScrollBy(direction, amount))
	return err
}

// Type types text into the focused window.
func (c *Client) Type(ctx context.Context, id, text string) error {
	_, err := c.action(ctx, id, TypeText(text))
	return err
}

// Key presses and releases a key combination such as "ctrl+shift+t".
func (c *Client) Key(ctx context.Context, id, keys string) error {
	_, err := c.action(ctx, id, PressKey(keys))
	return err
}

// CursorPosition returns where the pointer is.
func (c *Client) CursorPosition(ctx context.Context, id string) (Point, error) {
	r, err := c.action(ctx, id, Action{Type: ActionCursorPosition})
	return Point{r.X, r.Y}, err
}

// ScreenSize returns the size of the sandbox's screen.
func (c *Client) ScreenSize(ctx context.Context, id string) (Resolution, error) {
	r, err := c.action(ctx, id, Action{Type: ActionScreenSize})
	return Resolution{r.Width, r.Height}, err
}

// Windows lists the desktop's top-level windows.
func (c *Client) Windows(ctx context.Context, id string) ([]Window, error) {
	r, err := c.action(ctx, id, Action{Type: ActionWindows})
	return r.Windows, err
}

// ClipboardGet returns the text on the desktop's clipboard: what an
// application last copied, or the last ClipboardSet. It is "" when the
// clipboard is empty or holds no text (an image).
func (c *Client) ClipboardGet(ctx context.Context, id string) (string, error) {
	r, err := c.action(ctx, id, Action{Type: ActionClipboardGet})
	return r.Text, err
}

// ClipboardSet puts text (any Unicode, at most 64 KiB) on the desktop's
// clipboard, where it stays until an application copies something else.
func (c *Client) ClipboardSet(ctx context.Context, id, text string) error {
	_, err := c.action(ctx, id, SetClipboard(text))
	return err
}
