package desktop

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// TestLatency prints latency percentiles of common actions against a
// painted 1024x768 window, or on the display CUBICLE_LATENCY_DISPLAY. It
// runs only with CUBICLE_LATENCY=N (samples).
func TestLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CUBICLE_LATENCY"))
	if n <= 0 {
		t.Skip("set CUBICLE_LATENCY=samples to run")
	}
	var d *Desktop
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
		c := newClient(t, display, 0, 0, 1024, 768, "lat")
		paintDesktop(t, c, 1024, 768)
	}
	ctx := context.Background()
	run := func(name string, f func(i int) error) {
		s := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			t0 := time.Now()
			if err := f(i); err != nil {
				t.Fatal(err)
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
	run("png", func(i int) error {
		_, err := d.Screenshot(ctx, action.ScreenshotOptions{Format: action.FormatPNG})
		return err
	})
	run("png-half", func(i int) error {
		_, err := d.Screenshot(ctx, action.ScreenshotOptions{Format: action.FormatPNG, Scale: 0.5})
		return err
	})
}
