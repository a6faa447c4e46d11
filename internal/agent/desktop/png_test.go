package desktop

import (
	"bytes"
	"hash/adler32"
	"image"
	"image/png"
	"testing"
)

func TestAdler32Combine(t *testing.T) {
	data := make([]byte, 200000)
	for i := range data {
		data[i] = byte(i*7 + i/251)
	}
	for _, cut := range []int{0, 1, 5551, 65521, 100000, 199999, 200000} {
		a, b := adler32.Checksum(data[:cut]), adler32.Checksum(data[cut:])
		if got, want := adler32Combine(a, b, int64(len(data)-cut)), adler32.Checksum(data); got != want {
			t.Errorf("cut %d: combine = %#x, want %#x", cut, got, want)
		}
	}
}

// TestEncodePNGStrips checks that images split into concurrently compressed
// strips decode to exactly the pixels encoded, for odd sizes too.
func TestEncodePNGStrips(t *testing.T) {
	for _, size := range [][2]int{{1024, 768}, {333, 777}, {1, 300000}, {257, 257}, {7, 3}} {
		w, h := size[0], size[1]
		img := image.NewRGBA(image.Rect(0, 0, w, h))
		for i := range img.Pix {
			img.Pix[i] = byte(i*31 + i/(w*4)*17)
			if i%4 == 3 {
				img.Pix[i] = 0xff
			}
		}
		var buf bytes.Buffer
		if err := encodePNG(&buf, img); err != nil {
			t.Fatal(err)
		}
		got, err := png.Decode(&buf)
		if err != nil {
			t.Fatalf("%dx%d: decode: %v", w, h, err)
		}
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				r, g, b, _ := got.At(x, y).RGBA()
				o := img.PixOffset(x, y)
				if uint8(r>>8) != img.Pix[o] || uint8(g>>8) != img.Pix[o+1] || uint8(b>>8) != img.Pix[o+2] {
					t.Fatalf("%dx%d: pixel %d,%d differs", w, h, x, y)
				}
			}
		}
	}
}
