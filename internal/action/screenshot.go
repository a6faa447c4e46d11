package action

import (
	"fmt"
	"image"
	"net/url"
	"strconv"
	"time"
)

// ScreenshotOptions are the options of a screenshot in the form the agent
// uses them.
type ScreenshotOptions struct {
	Format  string          // FormatPNG or FormatJPEG
	Quality int             // JPEG quality 1..100
	Scale   float64         // 0 = none, else 0.1..1
	Width   int             // target width keeping aspect, 0 = none
	Region  image.Rectangle // empty = the whole screen
	Cursor  bool            // draw the pointer

	// Settle, when not 0, makes the screenshot wait until the screen has
	// had no damage for this long, counted from the later of the start of
	// the screenshot and the last damage, but for no more than SettleMax
	// in all.
	Settle    time.Duration
	SettleMax time.Duration
}

// Screenshot returns the screenshot options of a normalized screenshot
// action, with the JPEG quality defaulted.
func (a Action) Screenshot() ScreenshotOptions {
	o := ScreenshotOptions{
		Format:  a.Format,
		Quality: a.Quality,
		Scale:   a.Scale,
		Width:   a.Width,
		Cursor:  a.Cursor,
	}
	if a.SettleMS > 0 {
		o.Settle = time.Duration(a.SettleMS) * time.Millisecond
		o.SettleMax = time.Duration(max(a.SettleMaxMS, a.SettleMS)) * time.Millisecond
	}
	if o.Format == "" {
		o.Format = FormatPNG
	}
	if o.Quality == 0 {
		o.Quality = DefaultJPEGQuality
	}
	if a.W > 0 && a.H > 0 {
		x, y := deref(a.X), deref(a.Y)
		o.Region = image.Rect(x, y, x+a.W, y+a.H)
	}
	return o
}

// ScreenshotFromQuery parses the query of GET /screenshot (format, quality,
// scale, width, x, y, w, h, cursor, settle_ms, settle_max_ms) into a
// normalized screenshot action. Unknown parameters are errors of type
// *Error.
func ScreenshotFromQuery(q url.Values) (Action, error) {
	a := Action{Type: TypeScreenshot}
	for key, vals := range q {
		if len(vals) != 1 {
			return a, errorf("query parameter %q given %d times", key, len(vals))
		}
		v := vals[0]
		var err error
		intp := func(dst *int) {
			var n int
			n, err = strconv.Atoi(v)
			*dst = n
		}
		switch key {
		case "format":
			a.Format = v
		case "quality":
			intp(&a.Quality)
		case "scale":
			a.Scale, err = strconv.ParseFloat(v, 64)
		case "width":
			intp(&a.Width)
		case "x":
			a.X = new(int)
			intp(a.X)
		case "y":
			a.Y = new(int)
			intp(a.Y)
		case "w":
			intp(&a.W)
		case "h":
			intp(&a.H)
		case "cursor":
			a.Cursor, err = strconv.ParseBool(v)
		case "settle_ms":
			intp(&a.SettleMS)
		case "settle_max_ms":
			intp(&a.SettleMaxMS)
		default:
			return a, errorf("unknown query parameter %q", key)
		}
		if err != nil {
			return a, errorf("query parameter %s=%q: %s", key, v, numError(err))
		}
	}
	return Normalize(a)
}

func numError(err error) string {
	if ne, ok := err.(*strconv.NumError); ok {
		return fmt.Sprintf("not a valid %s", map[bool]string{true: "number", false: "value"}[ne.Func != "ParseBool"])
	}
	return err.Error()
}
