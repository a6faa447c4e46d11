// Package action is the computer-use action language of the API: the Action
// type that REST clients send to POST /v1/sandboxes/{id}/actions, its strict
// JSON parser, its structural and screen-bounds validation, the X11 keysym
// names it accepts and its conversion to and from the agent's protobuf
// messages.
//
// It is pure Go with no X11 and no cgo, so both the host daemon (which parses
// and rejects bad requests before they reach a sandbox) and the in-sandbox
// agent (which validates coordinates against the real screen and runs the
// actions) may import it. It must not import anything else from internal/
// but internal/strictjson (the standard library only), the one home of
// strict JSON decoding.
package action

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/strictjson"
)

// Action types.
const (
	TypeMove           = "move"
	TypeClick          = "click"
	TypeDoubleClick    = "double_click"
	TypeTripleClick    = "triple_click"
	TypeMouseDown      = "mouse_down"
	TypeMouseUp        = "mouse_up"
	TypeDrag           = "drag"
	TypeScroll         = "scroll"
	TypeType           = "type"
	TypeKey            = "key"
	TypeKeyDown        = "key_down"
	TypeKeyUp          = "key_up"
	TypeHoldKey        = "hold_key"
	TypeWait           = "wait"
	TypeCursorPosition = "cursor_position"
	TypeScreenSize     = "screen_size"
	TypeScreenshot     = "screenshot"
	TypeWindows        = "windows"
	// TypeClipboardGet and TypeClipboardSet read and write the text of
	// the desktop's CLIPBOARD selection (what ctrl+c copies and ctrl+v
	// pastes). PRIMARY, the selection of the mouse, is left alone.
	TypeClipboardGet = "clipboard_get"
	TypeClipboardSet = "clipboard_set"
)

// Mouse buttons, scroll directions and screenshot formats.
const (
	ButtonLeft   = "left"
	ButtonRight  = "right"
	ButtonMiddle = "middle"
	// ButtonBack and ButtonForward are the side buttons of a mouse (X
	// buttons 8 and 9), which browsers take as history back and forward.
	ButtonBack    = "back"
	ButtonForward = "forward"

	DirectionUp    = "up"
	DirectionDown  = "down"
	DirectionLeft  = "left"
	DirectionRight = "right"

	FormatPNG  = "png"
	FormatJPEG = "jpeg"
)

// Limits on one request. They keep a single request from tying up a desktop
// for long or from making the agent allocate without bound.
const (
	MaxActions         = 1000     // actions in one request
	MaxTextBytes       = 64 << 10 // bytes of text in one type action
	MaxKeys            = 8        // keys in one combo
	MaxPathPoints      = 1000     // points in one drag path
	MaxScrollAmount    = 100      // scroll steps in one scroll action
	MaxDelayMS         = 1000     // delay between typed characters
	MaxDurationMS      = 60000    // wait and hold_key duration
	MaxCoord           = 32767    // X11 coordinates are int16
	DefaultJPEGQuality = 80
	MaxSettleMS        = 10000 // settle_ms and settle_max_ms of a screenshot
	DefaultSettleMaxMS = 2000  // settle_max_ms when settle_ms is given alone

	// MaxClipboardBytes bounds the text of clipboard_set. The agent
	// serves it in one X request (ChangeProperty), which X limits to
	// 256 KiB without BIG-REQUESTS, so it needs no INCR transfer.
	MaxClipboardBytes = 64 << 10
	// MaxClipboardReadBytes bounds what clipboard_get reads: an
	// application may hold far more on its clipboard than anyone would
	// type, and the text travels in a JSON answer.
	MaxClipboardReadBytes = 1 << 20
)

// Action is one step of computer use. Which fields apply depends on Type (see
// the table in API.md); Parse rejects fields that the type does not use.
//
// For a screenshot action X, Y, W and H are the optional capture region (X and
// Y default to 0; W and H must be given together), and Format, Quality, Scale,
// Width and Cursor are the options of GET /screenshot. SettleMS asks the
// screenshot to wait until the screen has been quiet (no X damage) for that
// many milliseconds, counted from the later of the action's start and the
// last change on the screen, but no longer than SettleMaxMS in all. For
// every other type X and Y are the pointer position.
type Action struct {
	Type       string   `json:"type"`
	X          *int     `json:"x,omitempty"`
	Y          *int     `json:"y,omitempty"`
	Button     string   `json:"button,omitempty"`
	Count      int      `json:"count,omitempty"`
	Path       [][2]int `json:"path,omitempty"`
	Direction  string   `json:"direction,omitempty"`
	Amount     int      `json:"amount,omitempty"`
	Text       string   `json:"text,omitempty"`
	DelayMS    int      `json:"delay_ms,omitempty"`
	Keys       Keys     `json:"keys,omitempty"`
	DurationMS int      `json:"duration_ms,omitempty"`

	// Screenshot options.
	Format  string  `json:"format,omitempty"`
	Quality int     `json:"quality,omitempty"`
	Scale   float64 `json:"scale,omitempty"`
	Width   int     `json:"width,omitempty"`
	W       int     `json:"w,omitempty"`
	H       int     `json:"h,omitempty"`
	Cursor  bool    `json:"cursor,omitempty"`

	SettleMS    int `json:"settle_ms,omitempty"`
	SettleMaxMS int `json:"settle_max_ms,omitempty"`
}

// Error is a validation error: the request is wrong, not the desktop. Index
// is the position of the offending action in the request (0 for a single
// action object); Msg says what is wrong in words meant for the user.
type Error struct {
	Index int
	Msg   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("action %d: %s", e.Index, e.Msg)
}

func errorf(format string, args ...any) *Error {
	return &Error{Msg: fmt.Sprintf(format, args...)}
}

// Parse decodes a request body: one Action object, or {"actions": [...]}.
// It is strict: unknown fields, unknown types, fields the type does not use,
// missing required fields and out-of-range values are errors of type *Error.
// Defaults are filled in (button "left", count 1/2/3 for click, double_click
// and triple_click, scroll amount 1, screenshot format "png", and for a
// screenshot with settle_ms, settle_max_ms 2000 or settle_ms if more).
// Coordinates are checked only against X11's limits; Validate checks them
// against a screen.
func Parse(body []byte) ([]Action, error) {
	if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		return nil, &Error{Msg: "request body must be a JSON object, not null"}
	}
	var top map[string]json.RawMessage
	if err := strictjson.Decode(body, &top); err != nil {
		return nil, &Error{Msg: "request body must be a JSON object: " + err.Error()}
	}
	raw, isList := top["actions"]
	if !isList {
		a, err := parseOne(body)
		if err != nil {
			return nil, err
		}
		return []Action{a}, nil
	}
	if len(top) != 1 {
		return nil, &Error{Msg: `a request with "actions" must have no other fields`}
	}
	var items []json.RawMessage
	if err := strictjson.Decode(raw, &items); err != nil {
		return nil, &Error{Msg: `"actions" must be an array of action objects: ` + err.Error()}
	}
	if len(items) == 0 {
		return nil, &Error{Msg: `"actions" is empty`}
	}
	if len(items) > MaxActions {
		return nil, &Error{Msg: fmt.Sprintf("too many actions: %d (at most %d)", len(items), MaxActions)}
	}
	out := make([]Action, len(items))
	for i, item := range items {
		a, err := parseOne(item)
		if err != nil {
			err.Index = i
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

func parseOne(data []byte) (Action, *Error) {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return Action{}, &Error{Msg: "action must be a JSON object, not null"}
	}
	var a Action
	if err := strictjson.Decode(data, &a); err != nil {
		return Action{}, &Error{Msg: "invalid action: " + err.Error()}
	}
	n, err := Normalize(a)
	if err != nil {
		return Action{}, err.(*Error)
	}
	return n, nil
}

// field bits say which fields an action sets.
type fieldSet uint32

const (
	fX fieldSet = 1 << iota
	fY
	fButton
	fCount
	fPath
	fDirection
	fAmount
	fText
	fDelay
	fKeys
	fDuration
	fFormat
	fQuality
	fScale
	fWidth
	fW
	fH
	fCursor
	fSettle
	fSettleMax
)

var fieldNames = []string{"x", "y", "button", "count", "path", "direction", "amount", "text",
	"delay_ms", "keys", "duration_ms", "format", "quality", "scale", "width", "w", "h", "cursor",
	"settle_ms", "settle_max_ms"}

func (a *Action) fields() fieldSet {
	var s fieldSet
	set := func(b bool, f fieldSet) {
		if b {
			s |= f
		}
	}
	set(a.X != nil, fX)
	set(a.Y != nil, fY)
	set(a.Button != "", fButton)
	set(a.Count != 0, fCount)
	set(a.Path != nil, fPath)
	set(a.Direction != "", fDirection)
	set(a.Amount != 0, fAmount)
	set(a.Text != "", fText)
	set(a.DelayMS != 0, fDelay)
	set(a.Keys != nil, fKeys)
	set(a.DurationMS != 0, fDuration)
	set(a.Format != "", fFormat)
	set(a.Quality != 0, fQuality)
	set(a.Scale != 0, fScale)
	set(a.Width != 0, fWidth)
	set(a.W != 0, fW)
	set(a.H != 0, fH)
	set(a.Cursor, fCursor)
	set(a.SettleMS != 0, fSettle)
	set(a.SettleMaxMS != 0, fSettleMax)
	return s
}

const fScreenshot = fX | fY | fW | fH | fFormat | fQuality | fScale | fWidth | fCursor | fSettle | fSettleMax

// allowed lists the fields each type may set.
var allowed = map[string]fieldSet{
	TypeMove:           fX | fY,
	TypeClick:          fX | fY | fButton | fCount,
	TypeDoubleClick:    fX | fY | fButton,
	TypeTripleClick:    fX | fY | fButton,
	TypeMouseDown:      fX | fY | fButton,
	TypeMouseUp:        fX | fY | fButton,
	TypeDrag:           fPath | fButton,
	TypeScroll:         fX | fY | fDirection | fAmount,
	TypeType:           fText | fDelay,
	TypeKey:            fKeys,
	TypeKeyDown:        fKeys,
	TypeKeyUp:          fKeys,
	TypeHoldKey:        fKeys | fDuration,
	TypeWait:           fDuration,
	TypeCursorPosition: 0,
	TypeScreenSize:     0,
	TypeScreenshot:     fScreenshot,
	TypeWindows:        0,
	TypeClipboardGet:   0,
	TypeClipboardSet:   fText,
}

// Types returns the known action types.
func Types() []string {
	return []string{TypeMove, TypeClick, TypeDoubleClick, TypeTripleClick, TypeMouseDown,
		TypeMouseUp, TypeDrag, TypeScroll, TypeType, TypeKey, TypeKeyDown, TypeKeyUp,
		TypeHoldKey, TypeWait, TypeCursorPosition, TypeScreenSize, TypeScreenshot, TypeWindows,
		TypeClipboardGet, TypeClipboardSet}
}

// Normalize checks one action's structure (everything that does not need the
// screen size) and returns it with defaults filled in. Errors are *Error with
// Index 0. Normalizing an action twice gives the same action.
func Normalize(a Action) (Action, error) {
	if a.Type == "" {
		return a, errorf(`"type" is required`)
	}
	ok, known := allowed[a.Type]
	if !known {
		return a, errorf("unknown action type %q", a.Type)
	}
	if extra := a.fields() &^ ok; extra != 0 {
		for i, name := range fieldNames {
			if extra&(1<<i) != 0 {
				return a, errorf("field %q is not used by %s", name, a.Type)
			}
		}
	}
	if (a.X == nil) != (a.Y == nil) && a.Type != TypeScreenshot {
		return a, errorf("x and y must be given together")
	}
	for _, p := range []*int{a.X, a.Y} {
		if p != nil && (*p < 0 || *p > MaxCoord) {
			return a, errorf("coordinate %d is out of range 0..%d", *p, MaxCoord)
		}
	}
	switch a.Type {
	case TypeMove:
		if a.X == nil {
			return a, errorf("move needs x and y")
		}
	case TypeClick, TypeDoubleClick, TypeTripleClick, TypeMouseDown, TypeMouseUp, TypeDrag:
		if err := normalizeButton(&a); err != nil {
			return a, err
		}
		switch a.Type {
		case TypeClick:
			if a.Count == 0 {
				a.Count = 1
			}
			if a.Count < 1 || a.Count > 3 {
				return a, errorf("count must be 1, 2 or 3, not %d", a.Count)
			}
		case TypeDrag:
			if len(a.Path) < 2 {
				return a, errorf("drag needs a path of at least 2 points")
			}
			if len(a.Path) > MaxPathPoints {
				return a, errorf("drag path has %d points (at most %d)", len(a.Path), MaxPathPoints)
			}
			for _, p := range a.Path {
				for _, c := range p {
					if c < 0 || c > MaxCoord {
						return a, errorf("path coordinate %d is out of range 0..%d", c, MaxCoord)
					}
				}
			}
		}
	case TypeScroll:
		switch a.Direction {
		case DirectionUp, DirectionDown, DirectionLeft, DirectionRight:
		case "":
			return a, errorf("scroll needs direction: up, down, left or right")
		default:
			return a, errorf("direction must be up, down, left or right, not %q", a.Direction)
		}
		if a.Amount == 0 {
			a.Amount = 1
		}
		if a.Amount < 1 || a.Amount > MaxScrollAmount {
			return a, errorf("amount must be 1..%d, not %d", MaxScrollAmount, a.Amount)
		}
	case TypeType:
		if err := checkText(a.Text); err != nil {
			return a, err
		}
		if a.DelayMS < 0 || a.DelayMS > MaxDelayMS {
			return a, errorf("delay_ms must be 0..%d, not %d", MaxDelayMS, a.DelayMS)
		}
	case TypeKey, TypeKeyDown, TypeKeyUp, TypeHoldKey:
		if len(a.Keys) == 0 {
			return a, errorf("%s needs keys", a.Type)
		}
		if _, err := ParseCombo(a.Keys); err != nil {
			return a, errorf("%v", err)
		}
		if a.Type == TypeHoldKey {
			if err := checkDuration(a.DurationMS); err != nil {
				return a, err
			}
		}
	case TypeWait:
		if err := checkDuration(a.DurationMS); err != nil {
			return a, err
		}
	case TypeClipboardSet:
		if err := checkClipboardText(a.Text); err != nil {
			return a, err
		}
	case TypeScreenshot:
		if err := normalizeScreenshot(&a); err != nil {
			return a, err
		}
	}
	return a, nil
}

func normalizeButton(a *Action) *Error {
	switch a.Button {
	case "":
		a.Button = ButtonLeft
	case ButtonLeft, ButtonRight, ButtonMiddle, ButtonBack, ButtonForward:
	default:
		return errorf("button must be left, right, middle, back or forward, not %q", a.Button)
	}
	return nil
}

func checkDuration(ms int) *Error {
	if ms < 1 || ms > MaxDurationMS {
		return errorf("duration_ms must be 1..%d, not %d", MaxDurationMS, ms)
	}
	return nil
}

func checkText(text string) *Error {
	if text == "" {
		return errorf("type needs text")
	}
	if len(text) > MaxTextBytes {
		return errorf("text is %d bytes (at most %d)", len(text), MaxTextBytes)
	}
	if !utf8.ValidString(text) {
		return errorf("text is not valid UTF-8")
	}
	for _, r := range text {
		if _, ok := RuneKeysym(r); !ok {
			return errorf("text contains the character U+%04X, which cannot be typed", r)
		}
	}
	return nil
}

// checkClipboardText checks the text of clipboard_set. Unlike typed text
// it may hold any character, since nothing has to be on the keyboard, but
// not NUL: applications read the clipboard as C strings and would cut the
// text there.
func checkClipboardText(text string) *Error {
	if text == "" {
		return errorf("clipboard_set needs text")
	}
	if len(text) > MaxClipboardBytes {
		return errorf("text is %d bytes (at most %d)", len(text), MaxClipboardBytes)
	}
	if !utf8.ValidString(text) {
		return errorf("text is not valid UTF-8")
	}
	if strings.IndexByte(text, 0) >= 0 {
		return errorf("text contains the character U+0000 (NUL), which applications cannot paste")
	}
	return nil
}

func normalizeScreenshot(a *Action) *Error {
	switch a.Format {
	case "":
		a.Format = FormatPNG
	case FormatPNG, FormatJPEG:
	case "jpg":
		a.Format = FormatJPEG
	default:
		return errorf("format must be png or jpeg, not %q", a.Format)
	}
	if a.Quality < 0 || a.Quality > 100 {
		return errorf("quality must be 1..100, not %d", a.Quality)
	}
	if math.IsNaN(a.Scale) || a.Scale != 0 && (a.Scale < 0.1 || a.Scale > 1) {
		return errorf("scale must be between 0.1 and 1, not %v", a.Scale)
	}
	if a.Width < 0 || a.Width > MaxCoord {
		return errorf("width must be 1..%d, not %d", MaxCoord, a.Width)
	}
	if a.Scale != 0 && a.Width != 0 {
		return errorf("give scale or width, not both")
	}
	if (a.W == 0) != (a.H == 0) {
		return errorf("region needs both w and h")
	}
	if (a.X != nil || a.Y != nil) && a.W == 0 {
		return errorf("region x and y need w and h")
	}
	if a.W < 0 || a.H < 0 || a.W > MaxCoord || a.H > MaxCoord {
		return errorf("region size %dx%d is out of range", a.W, a.H)
	}
	if a.SettleMS < 0 || a.SettleMS > MaxSettleMS {
		return errorf("settle_ms must be 0..%d, not %d", MaxSettleMS, a.SettleMS)
	}
	if a.SettleMaxMS != 0 && a.SettleMS == 0 {
		return errorf("settle_max_ms needs settle_ms")
	}
	if a.SettleMS != 0 && a.SettleMaxMS == 0 {
		a.SettleMaxMS = max(DefaultSettleMaxMS, a.SettleMS)
	}
	if a.SettleMaxMS != 0 && (a.SettleMaxMS < a.SettleMS || a.SettleMaxMS > MaxSettleMS) {
		return errorf("settle_max_ms must be %d..%d (at least settle_ms), not %d", a.SettleMS, MaxSettleMS, a.SettleMaxMS)
	}
	if a.W != 0 {
		// The region's corner defaults to the screen's origin; spell it
		// out so that every region has one form.
		if a.X == nil {
			a.X = new(int)
		}
		if a.Y == nil {
			a.Y = new(int)
		}
	}
	return nil
}

// Validate checks an action's coordinates against a screen of width x height
// pixels: every point must lie on the screen and a screenshot region inside
// it. It assumes a has been through Normalize (Parse does that). Errors are
// *Error with Index 0.
func Validate(a Action, width, height int) error {
	in := func(x, y int) bool { return x >= 0 && y >= 0 && x < width && y < height }
	if a.Type == TypeScreenshot {
		if a.W == 0 {
			return nil
		}
		x, y := deref(a.X), deref(a.Y)
		if x+a.W > width || y+a.H > height {
			return errorf("region %dx%d+%d+%d is not inside the %dx%d screen", a.W, a.H, x, y, width, height)
		}
		return nil
	}
	if a.X != nil && a.Y != nil && !in(*a.X, *a.Y) {
		return errorf("point (%d, %d) is outside the %dx%d screen", *a.X, *a.Y, width, height)
	}
	for _, p := range a.Path {
		if !in(p[0], p[1]) {
			return errorf("path point (%d, %d) is outside the %dx%d screen", p[0], p[1], width, height)
		}
	}
	return nil
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
