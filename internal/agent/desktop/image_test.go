package desktop

import (
	"bytes"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math/rand"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// These tests need no X server.

func TestToRGBA(t *testing.T) {
	for _, l := range []pixelLayout{bgrx, {r: 0, g: 1, b: 2}, {r: 1, g: 2, b: 3}} {
		for _, n := range []int{1, 2, 3, 7} {
			src := make([]byte, n*4)
			rand.New(rand.NewSource(int64(n))).Read(src)
			dst := make([]byte, n*4)
			l.toRGBA(dst, src)
			for i := 0; i < n; i++ {
				p := src[i*4 : i*4+4]
				want := []byte{p[l.r], p[l.g], p[l.b], 0xff}
				if got := dst[i*4 : i*4+4]; !bytes.Equal(got, want) {
					t.Errorf("layout %+v, %d pixels: pixel %d = %v, want %v", l, n, i, got, want)
				}
			}
		}
	}
}

func randomImage(w, h int, seed int64) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	rng := rand.New(rand.NewSource(seed))
	for i := 0; i < len(img.Pix); i += 4 {
		if rng.Intn(4) == 0 { // mix noise with runs, so both filters win somewhere
			img.Pix[i], img.Pix[i+1], img.Pix[i+2] = byte(rng.Intn(256)), byte(rng.Intn(256)), byte(rng.Intn(256))
		} else if i >= 4 {
			copy(img.Pix[i:i+3], img.Pix[i-4:i-1])
		}
		img.Pix[i+3] = 0xff
	}
	return img
}

func TestEncodePNG(t *testing.T) {
	for _, size := range []image.Point{{1, 1}, {2, 3}, {17, 5}, {300, 200}} {
		img := randomImage(size.X, size.Y, int64(size.X))
		var buf bytes.Buffer
		if err := encodePNG(&buf, img); err != nil {
			t.Fatal(err)
		}
		got, err := png.Decode(&buf)
		if err != nil {
			t.Fatalf("%v: decode: %v", size, err)
		}
		if got.Bounds() != img.Rect {
			t.Fatalf("%v: bounds %v", size, got.Bounds())
		}
		for y := 0; y < size.Y; y++ {
			for x := 0; x < size.X; x++ {
				if c := color.RGBAModel.Convert(got.At(x, y)); c != img.RGBAAt(x, y) {
					t.Fatalf("%v: pixel (%d,%d) = %v, want %v", size, x, y, c, img.RGBAAt(x, y))
				}
			}
		}
	}
	// A sub-image (non-zero origin, stride larger than the width).
	sub := randomImage(40, 30, 9).SubImage(image.Rect(5, 6, 25, 16)).(*image.RGBA)
	var buf bytes.Buffer
	if err := encodePNG(&buf, sub); err != nil {
		t.Fatal(err)
	}
	got, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if c := color.RGBAModel.Convert(got.At(0, 0)); c != sub.RGBAAt(5, 6) {
		t.Errorf("sub-image pixel = %v, want %v", c, sub.RGBAAt(5, 6))
	}
}

func TestEncode(t *testing.T) {
	img := randomImage(64, 48, 1)
	s, err := encode(img, action.FormatJPEG, 0)
	if err != nil || s.Format != "jpeg" || s.Width != 64 || s.Height != 48 {
		t.Fatalf("encode jpeg = %+v, %v", s, err)
	}
	if _, err := jpeg.Decode(bytes.NewReader(s.Data)); err != nil {
		t.Errorf("decode jpeg: %v", err)
	}
	if s, err := encode(img, "", 0); err != nil || s.Format != "png" {
		t.Errorf("encode default = %+v, %v", s, err)
	}
	if _, err := encode(img, "gif", 0); err == nil {
		t.Error("encode gif succeeded")
	}
}

func TestScaleDown(t *testing.T) {
	img := randomImage(1024, 768, 2)
	for _, tt := range []struct {
		scale float64
		width int
		w, h  int
	}{
		{0, 0, 1024, 768}, {1, 0, 1024, 768}, {0.5, 0, 512, 384}, {0.1, 0, 102, 77},
		{0, 800, 800, 600}, {0, 1024, 1024, 768}, {0, 4000, 1024, 768}, {0, 1, 1, 1},
	} {
		got := scaleDown(img, tt.scale, tt.width)
		if got.Rect.Dx() != tt.w || got.Rect.Dy() != tt.h {
			t.Errorf("scaleDown(%v, %d) = %v, want %dx%d", tt.scale, tt.width, got.Rect, tt.w, tt.h)
		}
	}
}

func TestCursorDrawing(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 10, 10))
	// A 2x2 cursor: opaque red, transparent, half-transparent white
	// (premultiplied), opaque blue; partly off the image.
	blendARGB(img, image.Pt(-1, 8), 2, 2, []uint32{0xffff0000, 0, 0x80808080, 0xff0000ff})
	if got := img.RGBAAt(0, 8); got != (color.RGBA{}) {
		t.Errorf("transparent cursor pixel changed the image: %v", got)
	}
	if got := img.RGBAAt(0, 9); got != (color.RGBA{0, 0, 0xff, 0xff}) {
		t.Errorf("opaque blue pixel = %v", got)
	}
	img2 := image.NewRGBA(image.Rect(0, 0, 4, 4))
	blendARGB(img2, image.Pt(0, 0), 1, 1, []uint32{0x80808080})
	if got := img2.RGBAAt(0, 0); got.R != 0x80 || got.A != 0xff {
		t.Errorf("half-transparent white over black = %v, want gray", got)
	}

	arrowImg := image.NewRGBA(image.Rect(0, 0, 30, 30))
	drawArrow(arrowImg, image.Pt(28, 28)) // mostly clipped; must not panic
	drawArrow(arrowImg, image.Pt(5, 5))
	if got := arrowImg.RGBAAt(5, 5); got != (color.RGBA{0, 0, 0, 0xff}) {
		t.Errorf("arrow tip = %v, want black", got)
	}
	if got := arrowImg.RGBAAt(6, 8); got != (color.RGBA{0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("arrow fill = %v, want white", got)
	}
}
