package desktop

import (
	"image"

	"github.com/jezek/xgb/xfixes"
	"github.com/jezek/xgb/xproto"
)

// drawCursor draws the pointer into img, whose top-left corner is at origin
// on the screen: the real cursor image through XFIXES when the server has
// it, else a plain arrow at the pointer position. A failure to learn where
// the pointer is leaves img as it is: the cursor is decoration.
func (d *Desktop) drawCursor(img *image.RGBA, origin image.Point) {
	if d.xfixes {
		if c, err := xfixes.GetCursorImage(d.conn).Reply(); err == nil && len(c.CursorImage) >= int(c.Width)*int(c.Height) {
			at := image.Pt(int(c.X)-int(c.Xhot), int(c.Y)-int(c.Yhot)).Sub(origin)
			blendARGB(img, at, int(c.Width), int(c.Height), c.CursorImage)
			return
		}
	}
	p, err := xproto.QueryPointer(d.conn, d.root).Reply()
	if err != nil {
		return
	}
	drawArrow(img, image.Pt(int(p.RootX), int(p.RootY)).Sub(origin))
}

// blendARGB composites premultiplied 32-bit ARGB pixels (the XFIXES cursor
// format) over img with their top-left corner at at.
func blendARGB(img *image.RGBA, at image.Point, w, h int, argb []uint32) {
	b := img.Rect
	for y := 0; y < h; y++ {
		dy := at.Y + y
		if dy < b.Min.Y || dy >= b.Max.Y {
			continue
		}
		for x := 0; x < w; x++ {
			dx := at.X + x
			if dx < b.Min.X || dx >= b.Max.X {
				continue
			}
			v := argb[y*w+x]
			a := v >> 24
			if a == 0 {
				continue
			}
			i := img.PixOffset(dx, dy)
			p := img.Pix[i : i+4 : i+4]
			inv := 255 - a
			p[0] = uint8(min(255, (v>>16)&0xff+uint32(p[0])*inv/255))
			p[1] = uint8(min(255, (v>>8)&0xff+uint32(p[1])*inv/255))
			p[2] = uint8(min(255, v&0xff+uint32(p[2])*inv/255))
			p[3] = 0xff
		}
	}
}

// arrow is a left-pointer cursor: '#' black outline, '.' white fill.
var arrow = []string{
	"#",
	"##",
	"#.#",
	"#..#",
	"#...#",
	"#....#",
	"#.....#",
	"#......#",
	"#.......#",
	"#........#",
	"#.....#####",
	"#..#..#",
	"#.# #..#",
	"##  #..#",
	"#    #..#",
	"     #..#",
	"      ##",
}

func drawArrow(img *image.RGBA, tip image.Point) {
	for y, row := range arrow {
		for x, c := range row {
			pt := tip.Add(image.Pt(x, y))
			if !pt.In(img.Rect) || c == ' ' {
				continue
			}
			v := uint8(0)
			if c == '.' {
				v = 0xff
			}
			i := img.PixOffset(pt.X, pt.Y)
			img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = v, v, v, 0xff
		}
	}
}
