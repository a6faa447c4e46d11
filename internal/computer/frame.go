package computer

import (
	"fmt"
	"math"
)

// Frame maps between the screen and the picture of it a model is shown.
// The picture is the screen scaled down by one factor on both axes (never
// up), computed the way the agent scales a screenshot to a width, so that
// the picture the agent returns is exactly Image pixels and a point in it
// maps back to the screen pixel it shows.
type Frame struct {
	Screen Size // the real screen
	Image  Size // what the model sees; equal to Screen when not scaled
}

// Fit returns the frame that shows screen in the largest picture that fits
// in target without stretching: a 1920×1080 screen in a 1024×768 target is
// shown at 1024×576. A target as large as the screen or larger, or zero,
// shows it unscaled.
func Fit(screen, target Size) Frame {
	f := Frame{Screen: screen, Image: screen}
	if target.Width <= 0 || target.Height <= 0 || screen.Width <= 0 || screen.Height <= 0 {
		return f
	}
	s := math.Min(float64(target.Width)/float64(screen.Width), float64(target.Height)/float64(screen.Height))
	if s >= 1 {
		return f
	}
	w := int(float64(screen.Width)*s + 0.5)
	// Rounding may overshoot the target by one pixel on the narrow axis.
	for w > 1 {
		h := heightFor(screen, w)
		if w <= target.Width && h <= target.Height {
			break
		}
		w--
	}
	w = max(w, 1)
	f.Image = Size{Width: w, Height: heightFor(screen, w)}
	return f
}

// heightFor is the height the agent gives a screenshot of screen scaled to
// width w (internal/agent/desktop scaleDown).
func heightFor(screen Size, w int) int {
	return max(1, int(float64(screen.Height)*float64(w)/float64(screen.Width)+0.5))
}

// Scaled reports whether the picture is smaller than the screen.
func (f Frame) Scaled() bool { return f.Image != f.Screen }

// ToScreen maps a point of the picture to the screen pixel it shows. A
// point outside the picture is an error that says where the picture ends,
// in the picture's own coordinates (the ones the caller used).
func (f Frame) ToScreen(p Point) (Point, error) {
	if p.X < 0 || p.Y < 0 || p.X >= f.Image.Width || p.Y >= f.Image.Height {
		return Point{}, fmt.Errorf("coordinate (%d, %d) is outside the screen: x must be 0..%d and y 0..%d",
			p.X, p.Y, f.Image.Width-1, f.Image.Height-1)
	}
	if !f.Scaled() {
		return p, nil
	}
	return Point{X: f.axisToScreen(p.X, f.Image.Width, f.Screen.Width), Y: f.axisToScreen(p.Y, f.Image.Height, f.Screen.Height)}, nil
}

// axisToScreen maps picture pixel v (of n) to the screen pixel (of m) under
// its centre.
func (f Frame) axisToScreen(v, n, m int) int {
	return min(m-1, int((float64(v)+0.5)*float64(m)/float64(n)))
}

// ToImage maps a screen point to the picture's pixel that shows it.
func (f Frame) ToImage(p Point) Point {
	if !f.Scaled() {
		return p
	}
	conv := func(v, m, n int) int { return max(0, min(n-1, int(float64(v)*float64(n)/float64(m)))) }
	return Point{X: conv(p.X, f.Screen.Width, f.Image.Width), Y: conv(p.Y, f.Screen.Height, f.Image.Height)}
}

// RegionToScreen maps the picture's rectangle from (x0, y0) to (x1, y1)
// (corners included or excluded alike: x1 > x0, y1 > y0) to the screen
// rectangle it shows, as origin and size.
func (f Frame) RegionToScreen(x0, y0, x1, y1 int) (Point, Size, error) {
	if x1 <= x0 || y1 <= y0 {
		return Point{}, Size{}, fmt.Errorf("region [%d, %d, %d, %d] is empty: x1 must be greater than x0 and y1 greater than y0", x0, y0, x1, y1)
	}
	if x0 < 0 || y0 < 0 || x1 > f.Image.Width || y1 > f.Image.Height {
		return Point{}, Size{}, fmt.Errorf("region [%d, %d, %d, %d] is not inside the %d×%d screen", x0, y0, x1, y1, f.Image.Width, f.Image.Height)
	}
	sx := float64(f.Screen.Width) / float64(f.Image.Width)
	sy := float64(f.Screen.Height) / float64(f.Image.Height)
	ox, oy := int(float64(x0)*sx), int(float64(y0)*sy)
	ex := min(f.Screen.Width, int(math.Ceil(float64(x1)*sx)))
	ey := min(f.Screen.Height, int(math.Ceil(float64(y1)*sy)))
	return Point{X: ox, Y: oy}, Size{Width: max(1, ex-ox), Height: max(1, ey-oy)}, nil
}
