package desktop

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// drawer keeps filling a square of a client's window, as fast as the
// server takes it, until its time is up or it is stopped.
type drawer struct {
	stop chan struct{}
	done chan struct{}
	last time.Time // just before the last fill was sent
}

const (
	drawRed   = 0xff0000
	drawBlue  = 0x0000ff
	drawGreen = 0x00ff00
)

// startDrawing draws red and blue in turns at (10, 10) of c's window, 20
// pixels square, for d (0: until stopDrawing), then green once.
func startDrawing(c *client, d time.Duration) *drawer {
	dr := &drawer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(dr.done)
		end := time.Now().Add(d)
		for i := 0; ; i++ {
			select {
			case <-dr.stop:
				return
			default:
			}
			if d > 0 && time.Now().After(end) {
				break
			}
			c.fill(10, 10, 20, 20, []uint32{drawRed, drawBlue}[i%2])
			time.Sleep(5 * time.Millisecond)
		}
		dr.last = time.Now()
		c.fill(10, 10, 20, 20, drawGreen)
	}()
	return dr
}

func (dr *drawer) stopDrawing() {
	close(dr.stop)
	<-dr.done
}

// clear forgets every screenshot kept.
func (c *shotCache) clear() {
	c.mu.Lock()
	c.entries = [4]cacheEntry{}
	c.mu.Unlock()
}

// pixelAt decodes a PNG screenshot and returns its pixel at (x, y) as
// 0xRRGGBB.
func pixelAt(t *testing.T, s *Shot, x, y int) uint32 {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(s.Data))
	if err != nil {
		t.Fatalf("decode screenshot: %v", err)
	}
	r, g, b, _ := img.At(x, y).RGBA()
	return r>>8<<16 | g>>8<<8 | b>>8
}

func TestScreenshotSettle(t *testing.T) {
	d, display := openDesktop(t)
	if !slices.Contains(d.Capabilities(), CapDamage) {
		t.Fatalf("capabilities %v lack %s: Xvfb has DAMAGE", d.Capabilities(), CapDamage)
	}
	c := newClient(t, display, winX, winY, winW, winH, "settle")
	ctx := context.Background()

	t.Run("quiet screen", func(t *testing.T) {
		s, err := d.Screenshot(ctx, action.ScreenshotOptions{Format: "png", Settle: 100 * time.Millisecond, SettleMax: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		// The quiet period counts from the request: a screen changed
		// by what the caller did just before must get the time to show it.
		if !s.Settled || s.SettleWait < 100*time.Millisecond {
			t.Errorf("settled %v after %v; want true after at least 100ms", s.Settled, s.SettleWait)
		}
	})

	t.Run("waits while drawing", func(t *testing.T) {
		dr := startDrawing(c, 700*time.Millisecond)
		defer dr.stopDrawing()
		time.Sleep(50 * time.Millisecond) // the drawing has begun
		const quiet = 300 * time.Millisecond
		res, err := d.Do(ctx, action.Action{Type: "screenshot", SettleMS: int(quiet / time.Millisecond), SettleMaxMS: 8000})
		if err != nil {
			t.Fatal(err)
		}
		done := time.Now()
		<-dr.done
		p := res.GetScreenshot()
		if p.Settled == nil || !p.GetSettled() {
			t.Fatalf("settled = %v after %d ms, want true", p.Settled, p.GetSettleWaitMs())
		}
		if since := done.Sub(dr.last); since < quiet {
			t.Errorf("screenshot returned %v after the drawing stopped, want at least %v", since, quiet)
		}
		s := &Shot{Data: p.GetData()}
		if got := pixelAt(t, s, winX+15, winY+15); got != drawGreen {
			t.Errorf("settled screenshot shows %06x, want the last color %06x", got, drawGreen)
		}
	})

	t.Run("never quiet", func(t *testing.T) {
		dr := startDrawing(c, 0)
		defer dr.stopDrawing()
		time.Sleep(50 * time.Millisecond)
		s, err := d.Screenshot(ctx, action.ScreenshotOptions{Format: "png", Settle: 200 * time.Millisecond, SettleMax: 600 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if s.Settled || s.SettleWait < 600*time.Millisecond {
			t.Errorf("settled %v after %v; want false after at least 600ms", s.Settled, s.SettleWait)
		}
	})

	t.Run("no settle", func(t *testing.T) {
		res, err := d.Do(ctx, action.Action{Type: "screenshot"})
		if err != nil {
			t.Fatal(err)
		}
		if p := res.GetScreenshot(); p.Settled != nil || p.GetSettleWaitMs() != 0 {
			t.Errorf("screenshot without settle reports settled %v, %d ms", p.Settled, p.GetSettleWaitMs())
		}
	})

	t.Run("cancel", func(t *testing.T) {
		dr := startDrawing(c, 0)
		defer dr.stopDrawing()
		ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := d.Screenshot(ctx, action.ScreenshotOptions{Format: "png", Settle: time.Second, SettleMax: 10 * time.Second})
		if err != context.DeadlineExceeded {
			t.Errorf("err = %v, want %v", err, context.DeadlineExceeded)
		}
	})
}

// TestScreenshotCache checks that a screenshot reuses the encoding of the
// last one only while nothing changed: every change drawn before a
// screenshot is requested is in it.
func TestScreenshotCache(t *testing.T) {
	d, display := openDesktop(t)
	c := newClient(t, display, winX, winY, winW, winH, "cache")
	ctx := context.Background()
	shot := func(opts action.ScreenshotOptions) *Shot {
		t.Helper()
		s, err := d.Screenshot(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	full := action.ScreenshotOptions{Format: "png", Quality: action.DefaultJPEGQuality}
	region := full
	region.Region = image.Rect(winX, winY, winX+50, winY+50)

	t.Run("unchanged screen is reused", func(t *testing.T) {
		a, b := shot(full), shot(full)
		if &a.Data[0] != &b.Data[0] {
			t.Error("two screenshots of an unchanged screen were both encoded")
		}
		if r := shot(region); &r.Data[0] == &a.Data[0] || r.Width != 50 {
			t.Errorf("a region got the full screen's encoding (%dx%d)", r.Width, r.Height)
		}
		if j := shot(action.ScreenshotOptions{Format: "jpeg", Quality: 80}); j.Format != "jpeg" {
			t.Errorf("jpeg screenshot is %s", j.Format)
		}
		// Each set of options keeps its own entry.
		if c := shot(full); &c.Data[0] != &a.Data[0] {
			t.Error("full screen encoded again after a region and a jpeg")
		}
	})

	t.Run("change is seen", func(t *testing.T) {
		colors := []uint32{0x102030, 0xa0b0c0, 0x00ff00, 0xff00ff}
		for i := 0; i < 40; i++ {
			want := colors[i%len(colors)]
			c.fill(0, 0, 50, 50, want) // returns once the server drew it
			for _, opts := range []action.ScreenshotOptions{full, region} {
				s := shot(opts)
				x, y := winX+25, winY+25
				if opts.Region != (image.Rectangle{}) {
					x, y = 25, 25
				}
				if got := pixelAt(t, s, x, y); got != want {
					t.Fatalf("round %d: screenshot %v shows %06x, want %06x drawn before it", i, opts.Region, got, want)
				}
			}
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					if _, err := d.Screenshot(ctx, full); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		c.fill(0, 0, 50, 50, 0x123456)
		wg.Wait()
		if got := pixelAt(t, shot(full), winX+25, winY+25); got != 0x123456 {
			t.Errorf("after concurrent screenshots: %06x, want 123456", got)
		}
	})
}
