package desktop

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"math/rand"
	"testing"

	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// desktopPixels returns w*h BGRX pixels that look like a desktop: flat
// panels, a gradient title bar and blocks of "text" (noise), so that
// encoding costs what it costs on a real screen rather than on a black one.
func desktopPixels(w, h int) []byte {
	rng := rand.New(rand.NewSource(1))
	pix := make([]byte, w*h*4)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			i := (y*w + x) * 4
			var r, g, b byte = 0xee, 0xee, 0xf0 // window background
			switch {
			case y < 30: // title bar gradient
				r, g, b = byte(40+x*60/w), byte(60+x*80/w), 0x90
			case x < 200: // side panel
				r, g, b = 0x30, 0x34, 0x3c
			case (y/18)%3 != 2 && x > 240 && x < w-100 && (x/9)%7 != 0: // text lines
				if rng.Intn(3) == 0 {
					r, g, b = 0x20, 0x20, 0x20
				}
			}
			pix[i], pix[i+1], pix[i+2] = b, g, r
		}
	}
	return pix
}

// desktopImage is desktopPixels as an RGBA image.
func desktopImage(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	bgrx.toRGBA(img.Pix, desktopPixels(w, h))
	return img
}

// paintDesktop draws desktopPixels into the client's window.
func paintDesktop(tb testing.TB, c *client, w, h int) {
	tb.Helper()
	pix := desktopPixels(w, h)
	rows := 60 // keeps each PutImage under the core request size limit
	for y := 0; y < h; y += rows {
		n := min(rows, h-y)
		err := xproto.PutImageChecked(c.conn, xproto.ImageFormatZPixmap, xproto.Drawable(c.win), c.gc,
			uint16(w), uint16(n), 0, int16(y), 0, 24, pix[y*w*4:(y+n)*w*4]).Check()
		if err != nil {
			tb.Fatal(err)
		}
	}
}

func benchDesktop(b *testing.B) *Desktop {
	d, display := openDesktop(b)
	c := newClient(b, display, 0, 0, 1024, 768, "bench")
	paintDesktop(b, c, 1024, 768)
	b.Logf("capabilities %v", d.Capabilities())
	return d
}

// benchShot measures screenshots with opts of an unchanging screen:
// captured and encoded every time, or, with cached, answered from the
// encoding of the first.
func benchShot(b *testing.B, opts action.ScreenshotOptions, cached bool) {
	d := benchDesktop(b)
	ctx := context.Background()
	var size int
	b.ResetTimer()
	for b.Loop() {
		if !cached {
			d.shots.clear()
		}
		s, err := d.Screenshot(ctx, opts)
		if err != nil {
			b.Fatal(err)
		}
		size = len(s.Data)
	}
	b.ReportMetric(float64(size), "bytes/shot")
}

func BenchmarkScreenshotPNG(b *testing.B) {
	benchShot(b, action.ScreenshotOptions{Format: action.FormatPNG}, false)
}

// BenchmarkScreenshotPNGUnchanged is a screenshot of a screen that has not
// changed since the last one with the same options.
func BenchmarkScreenshotPNGUnchanged(b *testing.B) {
	benchShot(b, action.ScreenshotOptions{Format: action.FormatPNG}, true)
}

func BenchmarkScreenshotJPEG(b *testing.B) {
	benchShot(b, action.ScreenshotOptions{Format: action.FormatJPEG, Quality: action.DefaultJPEGQuality}, false)
}

func BenchmarkScreenshotPNGHalf(b *testing.B) {
	benchShot(b, action.ScreenshotOptions{Format: action.FormatPNG, Scale: 0.5}, false)
}

// BenchmarkCapture measures the X transfer and pixel conversion alone.
func BenchmarkCapture(b *testing.B) {
	d := benchDesktop(b)
	r := d.screenRect()
	for b.Loop() {
		_, release, err := d.capture(r)
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}

func BenchmarkClick(b *testing.B) {
	d, display := openDesktop(b)
	newClient(b, display, 0, 0, 400, 300, "bench")
	ctx := context.Background()
	a := action.Action{Type: action.TypeClick, X: ip(100), Y: ip(100)}
	for b.Loop() {
		if _, err := d.Do(ctx, a); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTypeUnicode(b *testing.B) {
	d, display := openDesktop(b)
	newClient(b, display, 0, 0, 400, 300, "bench")
	ctx := context.Background()
	a := action.Action{Type: action.TypeType, Text: "héllo ж 東 ✓"}
	for b.Loop() {
		if _, err := d.Do(ctx, a); err != nil {
			b.Fatal(err)
		}
	}
}

// The encoder benchmarks need no X server: they compare encodePNG with
// image/png and measure JPEG and scaling on the same synthetic screen.

func BenchmarkEncodePNG(b *testing.B) {
	img := desktopImage(1024, 768)
	for b.Loop() {
		var buf bytes.Buffer
		if err := encodePNG(&buf, img); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(buf.Len()), "bytes")
	}
}

func BenchmarkEncodePNGStdlib(b *testing.B) {
	img := desktopImage(1024, 768)
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	for b.Loop() {
		var buf bytes.Buffer
		if err := enc.Encode(&buf, img); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(buf.Len()), "bytes")
	}
}

func BenchmarkEncodeJPEG(b *testing.B) {
	img := desktopImage(1024, 768)
	for b.Loop() {
		if _, err := encode(img, action.FormatJPEG, action.DefaultJPEGQuality); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkScaleHalf(b *testing.B) {
	img := desktopImage(1024, 768)
	for b.Loop() {
		scaleDown(img, 0.5, 0)
	}
}

func BenchmarkToRGBA(b *testing.B) {
	src := desktopPixels(1024, 768)
	dst := make([]byte, len(src))
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		bgrx.toRGBA(dst, src)
	}
}
