package desktop

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// latencySamples is how many times TestLatency runs each action when
// CUBICLE_LATENCY does not say: enough to check every one of them works
// over and over, few enough for every go test run.
const latencySamples = 20

// TestLatency logs latency percentiles of common actions against a painted
// 1024x768 window (on a fresh Xvfb), or on the display
// CUBICLE_LATENCY_DISPLAY. CUBICLE_LATENCY=N takes N samples of each
// (default 20). Timings are only logged; what is checked is that every
// action worked: on its own window the test counts the clicks, pointer
// moves and keys that arrived and decodes the screenshots.
func TestLatency(t *testing.T) {
	n := latencySamples
	if v := os.Getenv("CUBICLE_LATENCY"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			t.Fatalf("CUBICLE_LATENCY=%q: want a positive number of samples", v)
		}
	}
	var (
		d *Desktop
		c *client // the test's own window, nil on a display of the caller's
	)
	if display := os.Getenv("CUBICLE_LATENCY_DISPLAY"); display != "" {
		// A running desktop (in a sandbox: ":0").
		var err error
		if d, err = Open(display); err != nil {
			t.Fatal(err)
		}
		defer d.Close()
	} else {
		var display string
		d, display = openDesktop(t)
		c = newClient(t, display, 0, 0, 1024, 768, "lat")
		paintDesktop(t, c, 1024, 768)
		c.drain()
	}
	ctx := context.Background()
	run := func(name string, f func(i int) error) {
		s := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			t0 := time.Now()
			if err := f(i); err != nil {
				t.Fatalf("%s #%d: %v", name, i, err)
			}
			s = append(s, time.Since(t0))
		}
		slices.Sort(s)
		t.Logf("%-10s p50 %7.3fms p90 %7.3fms", name, float64(s[n/2])/1e6, float64(s[n*9/10])/1e6)
	}
	act := func(a action.Action) error { _, err := d.Do(ctx, a); return err }
	run("move", func(i int) error {
		return act(action.Action{Type: action.TypeMove, X: ip(100 + i%2*50), Y: ip(100)})
	})
	run("click", func(i int) error { return act(action.Action{Type: action.TypeClick, X: ip(100), Y: ip(700)}) })
	run("key", func(i int) error { return act(action.Action{Type: action.TypeKey, Keys: []string{"a"}}) })
	var full, half *Shot
	run("png", func(i int) (err error) {
		full, err = d.Screenshot(ctx, action.ScreenshotOptions{Format: action.FormatPNG})
		return err
	})
	run("png-half", func(i int) (err error) {
		half, err = d.Screenshot(ctx, action.ScreenshotOptions{Format: action.FormatPNG, Scale: 0.5})
		return err
	})

	w, h := d.Size()
	for _, s := range []struct {
		name         string
		shot         *Shot
		wantW, wantH int
	}{{"png", full, w, h}, {"png-half", half, w / 2, h / 2}} {
		img, err := png.Decode(bytes.NewReader(s.shot.Data))
		if err != nil {
			t.Errorf("%s: the last screenshot is not a PNG: %v", s.name, err)
			continue
		}
		if b := img.Bounds(); b.Dx() != s.wantW || b.Dy() != s.wantH {
			t.Errorf("%s: the last screenshot is %dx%d, want %dx%d", s.name, b.Dx(), b.Dy(), s.wantW, s.wantH)
		}
	}
	if c == nil {
		return
	}
	// Every action reached the application's window.
	c.sync()
	want := map[string]int{"moves": n, "clicks": n, "keys": n}
	deadline := time.Now().Add(5 * time.Second)
	var got map[string]int
	for {
		got = c.countInput()
		if got["moves"] >= want["moves"] && got["clicks"] >= want["clicks"] && got["keys"] >= want["keys"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A click moves the pointer first (to 100,700): that motion counts too.
	if got["clicks"] != want["clicks"] || got["keys"] != want["keys"] || got["moves"] < want["moves"] {
		t.Errorf("the window received %v, want %d clicks, %d presses of a and at least %d pointer moves", got, n, n, n)
	}
	if typed := c.typedText(); typed != string(bytes.Repeat([]byte("a"), n)) {
		t.Errorf("the window got the keys as %q, want %d times a", typed, n)
	}
}

// countInput counts the pointer motions, left-button presses at 100,700
// and key presses the window has received.
func (c *client) countInput() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, ev := range c.events {
		switch e := ev.(type) {
		case xproto.MotionNotifyEvent:
			out["moves"]++
		case xproto.ButtonPressEvent:
			if e.Detail == xproto.ButtonIndex1 && e.EventX == 100 && e.EventY == 700 {
				out["clicks"]++
			}
		case xproto.KeyPressEvent:
			out["keys"]++
		}
	}
	return out
}
