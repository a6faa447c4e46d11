package drivertest

import (
	"image"
	"image/color"
	"testing"
)

func TestNear(t *testing.T) {
	tests := []struct {
		a, b color.RGBA
		want bool
	}{
		{red, red, true},
		{color.RGBA{250, 10, 3, 255}, red, true},
		{color.RGBA{0, 0, 0, 255}, red, false}, // 0-255 wraps to 1 in uint8
		{color.RGBA{255, 255, 255, 255}, red, false},
		{blue, green, false},
		{color.RGBA{231, 0, 0, 255}, red, false},
	}
	for _, tt := range tests {
		if got := near(tt.a, tt.b); got != tt.want {
			t.Errorf("near(%v, %v) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestBlankMeasures(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 40, 40))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	if c, share := dominant(img); c != (color.RGBA{255, 255, 255, 255}) || share != 1 {
		t.Errorf("dominant of a white image = %v, %v", c, share)
	}
	if n := distinctColours(img); n != 1 {
		t.Errorf("distinct colours of a white image = %d", n)
	}
	for x := 0; x < 40; x += 2 {
		for y := 0; y < 20; y += 2 {
			img.Set(x, y, color.RGBA{uint8(x), uint8(y), 9, 255})
		}
	}
	if _, share := dominant(img); share != 0.875 {
		t.Errorf("dominant share = %v, want 0.875", share)
	}
	if n := distinctColours(img); n != 201 {
		t.Errorf("distinct colours = %d, want 201", n)
	}
}
