package desktop

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// Where the test window sits on the screen.
const winX, winY, winW, winH = 100, 80, 400, 300

func ip(n int) *int { return &n }

func do(t *testing.T, d *Desktop, a action.Action) {
	t.Helper()
	if _, err := d.Do(context.Background(), a); err != nil {
		t.Fatalf("Do(%+v): %v", a, err)
	}
}

func pointer(t *testing.T, c *client) (int, int) {
	t.Helper()
	p, err := xproto.QueryPointer(c.conn, xproto.Setup(c.conn).DefaultScreen(c.conn).Root).Reply()
	if err != nil {
		t.Fatal(err)
	}
	return int(p.RootX), int(p.RootY)
}

func isButton(press bool, button byte) func(xgb.Event) bool {
	return func(ev xgb.Event) bool {
		switch e := ev.(type) {
		case xproto.ButtonPressEvent:
			return press && e.Detail == xproto.Button(button)
		case xproto.ButtonReleaseEvent:
			return !press && e.Detail == xproto.Button(button)
		}
		return false
	}
}

func TestPointer(t *testing.T) {
	d, display := openDesktop(t)
	c := newClient(t, display, winX, winY, winW, winH, "pointer")
	ctx := context.Background()

	t.Run("move", func(t *testing.T) {
		do(t, d, action.Action{Type: "move", X: ip(321), Y: ip(234)})
		if x, y := pointer(t, c); x != 321 || y != 234 {
			t.Errorf("pointer at (%d, %d), want (321, 234)", x, y)
		}
		res, err := d.Do(ctx, action.Action{Type: "cursor_position"})
		if err != nil || res.X != 321 || res.Y != 234 {
			t.Errorf("cursor_position = %v, %v; want 321, 234", res, err)
		}
	})

	buttons := map[string]byte{"left": 1, "middle": 2, "right": 3, "back": 8, "forward": 9}
	for name, b := range buttons {
		t.Run("click "+name, func(t *testing.T) {
			c.drain()
			do(t, d, action.Action{Type: "click", X: ip(winX + 50), Y: ip(winY + 60), Button: name})
			ev := c.waitFor(isButton(true, b)).(xproto.ButtonPressEvent)
			if ev.EventX != 50 || ev.EventY != 60 || ev.Event != c.win {
				t.Errorf("press at (%d, %d) in %d, want (50, 60) in %d", ev.EventX, ev.EventY, ev.Event, c.win)
			}
			c.waitFor(isButton(false, b))
		})
	}

	t.Run("triple click", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "triple_click", X: ip(winX + 10), Y: ip(winY + 10)})
		for i := 0; i < 3; i++ {
			c.waitFor(isButton(true, 1))
			c.waitFor(isButton(false, 1))
		}
	})

	t.Run("mouse down up", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "mouse_down", X: ip(winX + 5), Y: ip(winY + 6), Button: "right"})
		c.waitFor(isButton(true, 3))
		p, _ := xproto.QueryPointer(c.conn, c.win).Reply()
		if p.Mask&xproto.KeyButMaskButton3 == 0 {
			t.Errorf("button 3 not down after mouse_down: mask %#x", p.Mask)
		}
		do(t, d, action.Action{Type: "mouse_up", Button: "right"})
		c.waitFor(isButton(false, 3))
	})

	t.Run("mouse down up forward", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "mouse_down", X: ip(winX + 7), Y: ip(winY + 8), Button: "forward"})
		ev := c.waitFor(isButton(true, 9)).(xproto.ButtonPressEvent)
		if ev.EventX != 7 || ev.EventY != 8 {
			t.Errorf("forward pressed at (%d, %d), want (7, 8)", ev.EventX, ev.EventY)
		}
		do(t, d, action.Action{Type: "mouse_up", Button: "forward"})
		c.waitFor(isButton(false, 9))
	})

	t.Run("drag back", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "drag", Button: "back", Path: [][2]int{{winX + 10, winY + 10}, {winX + 30, winY + 20}}})
		c.waitFor(isButton(true, 8))
		c.waitFor(isButton(false, 8))
	})

	t.Run("scroll", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "scroll", X: ip(winX + 20), Y: ip(winY + 20), Direction: "down", Amount: 3})
		for i := 0; i < 3; i++ {
			c.waitFor(isButton(true, 5))
		}
		do(t, d, action.Action{Type: "scroll", Direction: "left"})
		c.waitFor(isButton(true, 6))
	})

	t.Run("drag", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "drag", Path: [][2]int{{winX + 10, winY + 10}, {winX + 100, winY + 40}, {winX + 200, winY + 200}}})
		press := c.waitFor(isButton(true, 1)).(xproto.ButtonPressEvent)
		if press.EventX != 10 || press.EventY != 10 {
			t.Errorf("drag pressed at (%d, %d), want (10, 10)", press.EventX, press.EventY)
		}
		motion := c.waitFor(func(ev xgb.Event) bool {
			m, ok := ev.(xproto.MotionNotifyEvent)
			return ok && m.State&xproto.KeyButMaskButton1 != 0
		}).(xproto.MotionNotifyEvent)
		if motion.EventX <= 10 {
			t.Errorf("first drag motion at x=%d, want beyond 10", motion.EventX)
		}
		rel := c.waitFor(isButton(false, 1)).(xproto.ButtonReleaseEvent)
		if rel.EventX != 200 || rel.EventY != 200 {
			t.Errorf("drag released at (%d, %d), want (200, 200)", rel.EventX, rel.EventY)
		}
	})

	t.Run("out of screen", func(t *testing.T) {
		_, err := d.Do(ctx, action.Action{Type: "click", X: ip(1024), Y: ip(10)})
		var ae *action.Error
		if !errors.As(err, &ae) {
			t.Errorf("click off screen: %v, want *action.Error", err)
		}
	})

	t.Run("screen size", func(t *testing.T) {
		res, err := d.Do(ctx, action.Action{Type: "screen_size"})
		if err != nil || res.Width != 1024 || res.Height != 768 {
			t.Errorf("screen_size = %v, %v", res, err)
		}
	})
}

func isKey(press bool, c *client, ks action.Keysym) func(xgb.Event) bool {
	return func(ev xgb.Event) bool {
		switch e := ev.(type) {
		case xproto.KeyPressEvent:
			return press && c.keys.keysym(e.Detail, 0) == ks
		case xproto.KeyReleaseEvent:
			return !press && c.keys.keysym(e.Detail, 0) == ks
		}
		return false
	}
}

func TestKeyboard(t *testing.T) {
	d, display := openDesktop(t)
	c := newClient(t, display, winX, winY, winW, winH, "keys")
	ctx := context.Background()

	t.Run("combo", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "key", Keys: action.Keys{"ctrl", "shift", "t"}})
		c.waitFor(isKey(true, c, action.KeysymControlL))
		c.waitFor(isKey(true, c, action.KeysymShiftL))
		ev := c.waitFor(isKey(true, c, 't')).(xproto.KeyPressEvent)
		if ev.State&(xproto.ModMaskControl|xproto.ModMaskShift) != xproto.ModMaskControl|xproto.ModMaskShift {
			t.Errorf("t pressed with state %#x, want ctrl+shift", ev.State)
		}
		// Released in reverse order.
		c.waitFor(isKey(false, c, 't'))
		c.waitFor(isKey(false, c, action.KeysymShiftL))
		c.waitFor(isKey(false, c, action.KeysymControlL))
	})

	t.Run("aliases", func(t *testing.T) {
		for _, k := range []struct {
			name string
			ks   action.Keysym
		}{{"enter", action.KeysymReturn}, {"esc", action.KeysymEscape}, {"pageup", 0xff55}, {"F5", 0xffc2}, {"BackSpace", action.KeysymBackSpace}} {
			c.drain()
			do(t, d, action.Action{Type: "key", Keys: action.Keys{k.name}})
			c.waitFor(isKey(true, c, k.ks))
		}
	})

	t.Run("down up", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "key_down", Keys: action.Keys{"shift"}})
		c.waitFor(isKey(true, c, action.KeysymShiftL))
		km, _ := xproto.QueryKeymap(c.conn).Reply()
		code := 0
		for i := range c.keys.syms {
			if c.keys.syms[i] == xproto.Keysym(action.KeysymShiftL) {
				code = int(c.keys.min) + i/c.keys.per
				break
			}
		}
		if km.Keys[code/8]&(1<<(code%8)) == 0 {
			t.Errorf("Shift_L (keycode %d) not down after key_down", code)
		}
		do(t, d, action.Action{Type: "key_up", Keys: action.Keys{"shift"}})
		c.waitFor(isKey(false, c, action.KeysymShiftL))
	})

	t.Run("hold", func(t *testing.T) {
		c.drain()
		do(t, d, action.Action{Type: "hold_key", Keys: action.Keys{"a"}, DurationMS: 150})
		p := c.waitFor(isKey(true, c, 'a')).(xproto.KeyPressEvent)
		r := c.waitFor(isKey(false, c, 'a')).(xproto.KeyReleaseEvent)
		if held := time.Duration(r.Time-p.Time) * time.Millisecond; held < 140*time.Millisecond {
			t.Errorf("key held %v, want about 150ms", held)
		}
	})

	t.Run("unknown key", func(t *testing.T) {
		_, err := d.Do(ctx, action.Action{Type: "key", Keys: action.Keys{"nosuchkey"}})
		var ae *action.Error
		if !errors.As(err, &ae) || !strings.Contains(ae.Msg, "nosuchkey") {
			t.Errorf("unknown key error = %v", err)
		}
	})

	// Shift stays down across a run of shifted characters: each press of
	// a modifier is a state change every client of the display is sent.
	t.Run("one shift per run", func(t *testing.T) {
		c.drain()
		text := "ABC:D efG"
		do(t, d, action.Action{Type: "type", Text: text})
		c.waitTyped(text, 3*time.Second)
		c.mu.Lock()
		shifts := 0
		for _, ev := range c.events {
			if isKey(true, c, action.KeysymShiftL)(ev) {
				shifts++
			}
		}
		c.mu.Unlock()
		if shifts != 2 {
			t.Errorf("typing %q pressed Shift %d times, want 2 (once per run of shifted characters)", text, shifts)
		}
	})

	for _, text := range []string{
		"Hello, World! 123 ~`!@#$%^&*()_+-=[]{}|;':\",./<>?",
		"héllo ж 東 ✓",
		"ÀÉÎÕÜ ß € 😀 ¿ñ?",
	} {
		t.Run("type "+text, func(t *testing.T) {
			c.drain()
			do(t, d, action.Action{Type: "type", Text: text})
			c.waitTyped(text, 3*time.Second)
		})
	}

	t.Run("type delay", func(t *testing.T) {
		c.drain()
		start := time.Now()
		do(t, d, action.Action{Type: "type", Text: "abc\r\nd", DelayMS: 30})
		if el := time.Since(start); el < 90*time.Millisecond {
			t.Errorf("typing 4 keys with 30ms delay took %v", el)
		}
		deadline := time.Now().Add(3 * time.Second)
		for c.typedText() != "abc\nd" && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := c.typedText(); got != "abc\nd" {
			t.Errorf("window got %q, want %q", got, "abc\nd")
		}
	})

	// The keycodes for characters the keyboard lacks are all bound before
	// the first of them is typed, so no client reads a key event of a
	// freshly bound keycode with a stale map (Chromium dropped such
	// characters).
	t.Run("bindings before keys", func(t *testing.T) {
		const text = "жѣ東✓€ß日本ü"
		c.drain()
		do(t, d, action.Action{Type: "type", Text: text, DelayMS: 5})
		c.waitTyped(text, 3*time.Second)
		c.mu.Lock()
		defer c.mu.Unlock()
		keys, late := 0, 0
		for _, ev := range c.events {
			switch ev.(type) {
			case xproto.KeyPressEvent:
				keys++
			case xproto.MappingNotifyEvent:
				if keys > 0 {
					late++
				}
			}
		}
		if keys == 0 || late > 0 {
			t.Errorf("%d keyboard mapping changes after the first of %d key presses, want none", late, keys)
		}
	})

	// More distinct missing characters than spare keycodes: typed in
	// batches, each bound before its first key, still all arrive.
	t.Run("more characters than spare keycodes", func(t *testing.T) {
		var b strings.Builder
		for r := rune(0x4e00); b.Len() < 3*120; r += 7 { // 120 distinct CJK ideographs
			b.WriteRune(r)
		}
		text := b.String()
		c.drain()
		do(t, d, action.Action{Type: "type", Text: text})
		c.waitTyped(text, 5*time.Second)
	})

	t.Run("mapping restored", func(t *testing.T) {
		do(t, d, action.Action{Type: "type", Text: "ж"})
		has := func() bool {
			var k keymapCopy
			if err := k.load(c.conn); err != nil {
				t.Fatal(err)
			}
			for _, ks := range k.syms {
				if ks == 0x1000436 {
					return true
				}
			}
			return false
		}
		if !has() {
			t.Fatal("ж not in the keyboard mapping right after typing it")
		}
		d.Close()
		if has() {
			t.Error("ж still in the keyboard mapping after Close")
		}
	})
}

func TestRestoreTimer(t *testing.T) {
	old := restoreAfter
	restoreAfter = 50 * time.Millisecond
	defer func() { restoreAfter = old }()
	d, display := openDesktop(t)
	c := newClient(t, display, winX, winY, winW, winH, "restore")
	do(t, d, action.Action{Type: "type", Text: "東"})
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		var k keymapCopy
		if err := k.load(c.conn); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, ks := range k.syms {
			found = found || ks == 0x1006771
		}
		if !found {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Error("keycode bound to 東 not restored")
}

// TestRestoreAfterLongTyping: when the restore timer fires while typing
// holds the input lock, the characters just typed still stay bound for
// restoreAfter after the typing ends, not unbound the moment it does.
func TestRestoreAfterLongTyping(t *testing.T) {
	old := restoreAfter
	restoreAfter = 100 * time.Millisecond
	defer func() { restoreAfter = old }()
	d, display := openDesktop(t)
	c := newClient(t, display, winX, winY, winW, winH, "restore late")
	bound := func(ks xproto.Keysym) bool {
		var k keymapCopy
		if err := k.load(c.conn); err != nil {
			t.Fatal(err)
		}
		return slices.Contains(k.syms, ks)
	}
	do(t, d, action.Action{Type: "type", Text: "東"})
	// A long type action: it holds inputMu past the timer's expiry, then
	// types 本 last.
	d.inputMu.Lock()
	time.Sleep(2 * restoreAfter)
	if err := d.typeText(context.Background(), "本", 0); err != nil {
		d.inputMu.Unlock()
		t.Fatal(err)
	}
	d.inputMu.Unlock()
	time.Sleep(restoreAfter / 4)
	if !bound(0x100672c) {
		t.Fatalf("本 unbound %v after it was typed, want bound for %v", restoreAfter/4, restoreAfter)
	}
	deadline := time.Now().Add(3 * time.Second)
	for bound(0x100672c) {
		if time.Now().After(deadline) {
			t.Fatal("本 never unbound")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func shot(t *testing.T, d *Desktop, a action.Action) (*shotInfo, image.Image) {
	t.Helper()
	a.Type = action.TypeScreenshot
	res, err := d.Do(context.Background(), a)
	if err != nil {
		t.Fatalf("screenshot %+v: %v", a, err)
	}
	s := res.Screenshot
	var img image.Image
	if s.Format == "png" {
		img, err = png.Decode(bytes.NewReader(s.Data))
	} else {
		img, err = jpeg.Decode(bytes.NewReader(s.Data))
	}
	if err != nil {
		t.Fatalf("decode %s: %v", s.Format, err)
	}
	if b := img.Bounds(); b.Dx() != int(s.Width) || b.Dy() != int(s.Height) {
		t.Errorf("image is %v, response says %dx%d", b, s.Width, s.Height)
	}
	return &shotInfo{s.Format, int(s.Width), int(s.Height)}, img
}

// shotInfo is what a test checks of a screenshot besides its pixels.
type shotInfo struct {
	Format        string
	Width, Height int
}

func near(a, b uint8, tol int) bool {
	d := int(a) - int(b)
	return d >= -tol && d <= tol
}

func TestScreenshot(t *testing.T) {
	d, display := openDesktop(t)
	c := newClient(t, display, winX, winY, winW, winH, "shot")
	want := color.RGBA{0x12, 0x9a, 0xcd, 0xff}
	c.fill(50, 40, 120, 90, uint32(want.R)<<16|uint32(want.G)<<8|uint32(want.B))
	t.Logf("capabilities: %v", d.Capabilities())

	t.Run("png", func(t *testing.T) {
		info, img := shot(t, d, action.Action{})
		if info.Format != "png" || info.Width != 1024 || info.Height != 768 {
			t.Errorf("screenshot = %+v", info)
		}
		for _, p := range []image.Point{{winX + 50, winY + 40}, {winX + 169, winY + 129}, {winX + 100, winY + 100}} {
			if got := color.RGBAModel.Convert(img.At(p.X, p.Y)); got != want {
				t.Errorf("pixel %v = %v, want %v", p, got, want)
			}
		}
		if got := color.RGBAModel.Convert(img.At(winX+10, winY+10)); got != (color.RGBA{0xff, 0xff, 0xff, 0xff}) {
			t.Errorf("window background pixel = %v, want white", got)
		}
		if got := color.RGBAModel.Convert(img.At(5, 5)); got != (color.RGBA{0, 0, 0, 0xff}) {
			t.Errorf("root pixel = %v, want black", got)
		}
		if !d.Ready() {
			t.Error("not ready after a screenshot")
		}
	})

	t.Run("jpeg", func(t *testing.T) {
		info, img := shot(t, d, action.Action{Format: "jpeg", Quality: 90})
		if info.Format != "jpeg" {
			t.Errorf("format = %q", info.Format)
		}
		r, g, b, _ := img.At(winX+100, winY+80).RGBA()
		if !near(uint8(r>>8), want.R, 12) || !near(uint8(g>>8), want.G, 12) || !near(uint8(b>>8), want.B, 12) {
			t.Errorf("jpeg pixel = %d,%d,%d, want about %v", r>>8, g>>8, b>>8, want)
		}
	})

	t.Run("region", func(t *testing.T) {
		info, img := shot(t, d, action.Action{X: ip(winX + 40), Y: ip(winY + 30), W: 100, H: 50})
		if info.Width != 100 || info.Height != 50 {
			t.Errorf("region size %dx%d, want 100x50", info.Width, info.Height)
		}
		if got := color.RGBAModel.Convert(img.At(10, 10)); got != want {
			t.Errorf("region pixel (10,10) = %v, want %v", got, want)
		}
		if got := color.RGBAModel.Convert(img.At(5, 5)); got == want {
			t.Errorf("region pixel (5,5) = %v, want background", got)
		}
	})

	t.Run("scale", func(t *testing.T) {
		for _, tt := range []struct {
			a    action.Action
			w, h int
		}{
			{action.Action{Scale: 0.5}, 512, 384},
			{action.Action{Width: 300}, 300, 225},
			{action.Action{Width: 5000}, 1024, 768},
			{action.Action{X: ip(0), Y: ip(0), W: 200, H: 100, Scale: 0.1}, 20, 10},
		} {
			info, img := shot(t, d, tt.a)
			if info.Width != tt.w || info.Height != tt.h {
				t.Errorf("%+v: size %dx%d, want %dx%d", tt.a, info.Width, info.Height, tt.w, tt.h)
			}
			if tt.a.Scale == 0.5 {
				if got := color.RGBAModel.Convert(img.At((winX+100)/2, (winY+80)/2)); got != want {
					t.Errorf("scaled pixel = %v, want %v", got, want)
				}
			}
		}
	})

	t.Run("cursor", func(t *testing.T) {
		do(t, d, action.Action{Type: "move", X: ip(600), Y: ip(600)})
		_, plain := shot(t, d, action.Action{X: ip(560), Y: ip(560), W: 80, H: 80})
		_, with := shot(t, d, action.Action{X: ip(560), Y: ip(560), W: 80, H: 80, Cursor: true})
		diff := 0
		for y := 0; y < 80; y++ {
			for x := 0; x < 80; x++ {
				if plain.At(x, y) != with.At(x, y) {
					diff++
				}
			}
		}
		if diff == 0 {
			t.Error("cursor=true drew nothing near the pointer")
		}
	})

	t.Run("without shm", func(t *testing.T) {
		d.shotMu.Lock()
		if d.seg != nil {
			d.seg.close(d.conn)
			d.seg = nil
		}
		d.shotMu.Unlock()
		if slices.Contains(d.Capabilities(), CapSHM) {
			t.Error("capabilities still list shm")
		}
		_, img := shot(t, d, action.Action{X: ip(winX + 40), Y: ip(winY + 30), W: 100, H: 50})
		if got := color.RGBAModel.Convert(img.At(10, 10)); got != want {
			t.Errorf("pixel through plain GetImage = %v, want %v", got, want)
		}
	})

	t.Run("bad region", func(t *testing.T) {
		_, err := d.Do(context.Background(), action.Action{Type: "screenshot", X: ip(1000), Y: ip(0), W: 100, H: 10})
		var ae *action.Error
		if !errors.As(err, &ae) {
			t.Errorf("region off screen: %v, want *action.Error", err)
		}
	})
}

func TestWindows(t *testing.T) {
	d, display := openDesktop(t)
	c := newClient(t, display, winX, winY, winW, winH, "cubicle test ✓")
	newClient(t, display, 600, 500, 100, 100, "other")
	res, err := d.Do(context.Background(), action.Action{Type: "windows"})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, w := range res.Windows {
		if w.Id != uint32(c.win) {
			continue
		}
		found = true
		if w.Title != "cubicle test ✓" || w.Class != "CubicleTest" {
			t.Errorf("title, class = %q, %q", w.Title, w.Class)
		}
		if w.X != winX || w.Y != winY || w.Width != winW || w.Height != winH {
			t.Errorf("geometry = %d,%d %dx%d, want %d,%d %dx%d", w.X, w.Y, w.Width, w.Height, winX, winY, winW, winH)
		}
	}
	if !found {
		t.Fatalf("windows %v lack the test window %d", res.Windows, c.win)
	}
	if len(res.Windows) != 2 {
		t.Errorf("got %d windows, want 2: %v", len(res.Windows), res.Windows)
	}
	// The last client mapped took the focus.
	for _, w := range res.Windows {
		if w.Focused != (w.Title == "other") {
			t.Errorf("window %q focused = %v", w.Title, w.Focused)
		}
	}
}

func TestConcurrent(t *testing.T) {
	d, display := openDesktop(t)
	newClient(t, display, winX, winY, winW, winH, "concurrent")
	ctx := context.Background()
	errs := make(chan error, 40)
	for i := 0; i < 10; i++ {
		go func() {
			_, err := d.Do(ctx, action.Action{Type: "screenshot", Scale: 0.5})
			errs <- err
		}()
		go func() {
			_, err := d.Do(ctx, action.Action{Type: "click", X: ip(winX + i), Y: ip(winY + i)})
			errs <- err
		}()
		go func() {
			_, err := d.Do(ctx, action.Action{Type: "type", Text: "ж" + string(rune('a'+i))})
			errs <- err
		}()
		go func() {
			_, err := d.Do(ctx, action.Action{Type: "windows"})
			errs <- err
		}()
	}
	for i := 0; i < 40; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
