package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// TestComputerUse drives a real 1920×1080 desktop on gVisor through the
// vendor endpoints the way a model's tool calls would, in the model's own
// coordinates (a 1024×768 display, so a 1024×576 picture), and checks
// each action of Anthropic's computer tool and of OpenAI's computer_call
// by what the page in Chromium saw (its title reports every input event
// with its screen position) and by the pixels of the pictures that come
// back. This is the test the README's action table names.
func TestComputerUse(t *testing.T) {
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testComputerUse(t, backend)
		})
	}
}

// cuPage is the computer-use test page open in a sandbox.
type cuPage struct {
	t  *testing.T
	c  *client.Client
	id string
}

var cuTitle = regexp.MustCompile(`^cu (\d+) (.*)$`)

// title returns the page's event counter and the rest of its title.
func (p cuPage) title() (int, string) {
	p.t.Helper()
	ws, err := p.c.Windows(context.Background(), p.id)
	if err != nil {
		p.t.Fatal(err)
	}
	for _, w := range ws {
		if m := cuTitle.FindStringSubmatch(strings.TrimSuffix(w.Title, " - Chromium")); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n, m[2]
		}
	}
	return -1, ""
}

// expect waits until the page has seen events after the count before and
// its title matches re; it returns the submatches.
func (p cuPage) expect(before int, what, re string) []string {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	var m []string
	var last string
	ok := eventually(15*time.Second, func() bool {
		n, s := p.title()
		last = s
		if n <= before {
			return false
		}
		m = rx.FindStringSubmatch(s)
		return m != nil
	})
	if !ok {
		p.t.Fatalf("%s: the page's title never matched %q; last: %q", what, re, last)
	}
	return m
}

func (p cuPage) count() int {
	p.t.Helper()
	n, _ := p.title()
	return n
}

func testComputerUse(t *testing.T, backend string) {
	_, c := startDaemon(t, backend)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 1920, Height: 1080}})
	if err != nil {
		t.Fatal(err)
	}
	p := cuPage{t: t, c: c, id: sb.ID}
	openComputerPage(t, c, sb.ID)

	// Where the page's blue target is on the real screen.
	full := screenshotImage(t, c, sb.ID)
	if b := full.Bounds(); b.Dx() != 1920 || b.Dy() != 1080 {
		t.Fatalf("screen is %v", b)
	}
	onScreen := findColour(full, isBlue)
	if onScreen.Empty() {
		t.Fatal("no blue target on the screen")
	}
	t.Logf("target on the screen at %v", onScreen)

	anthropic := map[string]any{"type": "computer_20251124", "name": "computer",
		"display_width_px": 1024, "display_height_px": 768, "enable_zoom": true}
	ant := func(input map[string]any) map[string]any {
		t.Helper()
		raw, err := c.ComputerAnthropic(ctx, sb.ID, map[string]any{"tool": anthropic, "input": input})
		if err != nil {
			t.Fatalf("%v: %v", input, err)
		}
		var r map[string]any
		if err := json.Unmarshal(raw, &r); err != nil || r["type"] != "tool_result" || r["is_error"] != false {
			t.Fatalf("%v: answer %.300s", input, raw)
		}
		return r
	}

	// screenshot: the picture is the screen at 1024×576, and the target
	// is where the screen has it, scaled.
	shot := resultImage(t, ant(map[string]any{"action": "screenshot"}))
	if b := shot.Bounds(); b.Dx() != 1024 || b.Dy() != 576 {
		t.Fatalf("Anthropic screenshot is %v, want 1024×576", b)
	}
	inPicture := findColour(shot, isBlue)
	mx, my := (inPicture.Min.X+inPicture.Max.X)/2, (inPicture.Min.Y+inPicture.Max.Y)/2
	t.Logf("target in the 1024×576 picture at %v; the model clicks (%d, %d)", inPicture, mx, my)
	// The point the model names lands on the screen pixel under the
	// centre of the picture's pixel (scale 1920/1024 = 1.875).
	wantX, wantY := int((float64(mx)+0.5)*1.875), int((float64(my)+0.5)*1.875)
	if !(image.Point{wantX, wantY}).In(onScreen) {
		t.Fatalf("the picture's target centre maps to (%d, %d), outside the screen's target %v", wantX, wantY, onScreen)
	}
	at := func(x, y int) []int { return []int{x, y} }

	// zoom: the region at the screen's resolution.
	zoom := resultImage(t, ant(map[string]any{"action": "zoom", "region": []int{mx - 20, my - 20, mx + 20, my + 20}}))
	if b := zoom.Bounds(); b.Dx() < 74 || b.Dx() > 77 || findColour(zoom, isBlue).Dx() < 14 {
		t.Errorf("zoom of 40×40 picture pixels is %v with the target %v, want about 75×75 at full size", b, findColour(zoom, isBlue))
	}

	// mouse_move, then cursor_position in the picture's coordinates.
	n := p.count()
	ant(map[string]any{"action": "mouse_move", "coordinate": at(mx, my)})
	m := p.expect(n, "mouse_move", `^move (\d+),(\d+)`)
	if x, y := atoi(m[1]), atoi(m[2]); x != wantX || y != wantY {
		t.Errorf("mouse_move to (%d, %d) reached the screen at (%d, %d), want (%d, %d)", mx, my, x, y, wantX, wantY)
	}
	r := ant(map[string]any{"action": "cursor_position"})
	if got := contentText(r); got != fmt.Sprintf("X=%d,Y=%d", mx, my) {
		t.Errorf("cursor_position = %q, want X=%d,Y=%d", got, mx, my)
	}

	// left_click on the target: the page saw it on the right pixel, and
	// the picture that comes back with the answer shows the target hit.
	n = p.count()
	after := resultImage(t, ant(map[string]any{"action": "left_click", "coordinate": at(mx, my)}))
	m = p.expect(n, "left_click", `^click d1 (\d+),(\d+) ;`)
	if x, y := atoi(m[1]), atoi(m[2]); x != wantX || y != wantY {
		t.Errorf("left_click landed at (%d, %d), want (%d, %d)", x, y, wantX, wantY)
	}
	if !eventually(5*time.Second, func() bool {
		return isGreen(after.At(mx, my)) || isGreen(resultImage(t, ant(map[string]any{"action": "screenshot"})).At(mx, my))
	}) {
		t.Errorf("the target did not turn green in the picture: %v", after.At(mx, my))
	}

	steps := []struct {
		name  string
		input map[string]any
		want  string // a regexp the title must match after the action
	}{
		{"left_click with shift held", map[string]any{"action": "left_click", "coordinate": at(100, 300), "text": "shift"}, `^(keyup Shift.* ; )?click d1 188,563 S ;`},
		{"right_click", map[string]any{"action": "right_click", "coordinate": at(100, 300)}, `^auxclick b2 188,563`},
		{"middle_click", map[string]any{"action": "middle_click", "coordinate": at(101, 300)}, `^auxclick b1 190,563`},
		{"double_click", map[string]any{"action": "double_click", "coordinate": at(100, 300)}, `^dblclick 188,563 ; click d2 188,563`},
		{"triple_click", map[string]any{"action": "triple_click", "coordinate": at(140, 300)}, `^click d3 263,563`},
		{"left_mouse_down", map[string]any{"action": "left_mouse_down", "coordinate": at(180, 300)}, `^down b0 338,563`},
		{"left_mouse_up", map[string]any{"action": "left_mouse_up"}, `^click d1 338,563 ; up b0 338,563`},
		{"left_click_drag", map[string]any{"action": "left_click_drag", "start_coordinate": at(100, 300), "coordinate": at(300, 310)}, `up b0 563,582`},
		{"scroll down", map[string]any{"action": "scroll", "coordinate": at(500, 300), "scroll_direction": "down", "scroll_amount": 2}, `^wheel 0,1 938,563 `},
		{"scroll left with ctrl", map[string]any{"action": "scroll", "coordinate": at(500, 300), "scroll_direction": "left", "scroll_amount": 1, "text": "ctrl"}, `wheel -1,0 938,563 C`},
		{"key", map[string]any{"action": "key", "text": "ctrl+a"}, `keydown a C`},
		{"key names", map[string]any{"action": "key", "text": "Escape F2"}, `^keyup F2 .*keydown F2 .*keydown Escape`},
		{"hold_key", map[string]any{"action": "hold_key", "text": "shift", "duration": 1.2}, `^keyup Shift held (1[1-9]\d\d|[2-9]\d\d\d)`},
		{"type", map[string]any{"action": "type", "text": "héllo wörld"}, `\| [^|]*héllo wörld$`},
	}
	for _, s := range steps {
		n := p.count()
		ant(s.input)
		p.expect(n, s.name, s.want)
	}

	// wait waits.
	start := time.Now()
	ant(map[string]any{"action": "wait", "duration": 0.6})
	if d := time.Since(start); d < 600*time.Millisecond {
		t.Errorf("wait of 0.6 s returned after %v", d)
	}

	// The current toolset: the block's name is the action; repeat.
	raw, err := c.ComputerAnthropic(ctx, sb.ID, map[string]any{
		"tool": map[string]any{"type": "computer_toolset_20260801"},
		"tool_uses": []map[string]any{{"type": "tool_use", "id": "toolu_1", "name": "key", "toolset_name": "computer",
			"input": map[string]any{"text": "x", "repeat": 3}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"tool_use_id":"toolu_1","toolset_name":"computer"`) {
		t.Errorf("toolset answer %.200s", raw)
	}
	p.expect(0, "key repeat", `\| [^|]*héllo wörldxxx$`)

	// Bad input: 400, the tool_result says why, nothing ran.
	n = p.count()
	_, err = c.ComputerAnthropic(ctx, sb.ID, map[string]any{"tool": anthropic, "input": map[string]any{"action": "left_click", "coordinate": at(1024, 10)}})
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, "outside the screen: x must be 0..1023 and y 0..575") ||
		!strings.Contains(string(ae.Body), `"is_error":true`) {
		t.Errorf("out-of-screen click: %v %s", err, bodyOf(ae))
	}
	time.Sleep(300 * time.Millisecond)
	if got := p.count(); got != n {
		t.Errorf("a refused click reached the page (%d events, had %d)", got, n)
	}

	testOpenAI(t, p, mx, my, wantX, wantY)
}

func testOpenAI(t *testing.T, p cuPage, mx, my, wantX, wantY int) {
	ctx := context.Background()
	tool := map[string]any{"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "linux"}
	call := func(actions ...map[string]any) image.Image {
		t.Helper()
		cc := map[string]any{"type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed", "pending_safety_checks": []any{}}
		if len(actions) == 1 {
			cc["action"] = actions[0]
		} else {
			cc["actions"] = actions
		}
		raw, err := p.c.ComputerOpenAI(ctx, p.id, map[string]any{"tool": tool, "computer_call": cc})
		if err != nil {
			t.Fatalf("%v: %v", actions, err)
		}
		var o struct {
			Type   string `json:"type"`
			CallID string `json:"call_id"`
			Output struct {
				Type     string `json:"type"`
				ImageURL string `json:"image_url"`
			} `json:"output"`
		}
		if err := json.Unmarshal(raw, &o); err != nil || o.Type != "computer_call_output" || o.CallID != "call_1" || o.Output.Type != "computer_screenshot" {
			t.Fatalf("%v: answer %.200s", actions, raw)
		}
		data, ok := strings.CutPrefix(o.Output.ImageURL, "data:image/png;base64,")
		if !ok {
			t.Fatalf("image_url %.40s", o.Output.ImageURL)
		}
		b, err := base64.StdEncoding.DecodeString(data)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if bb := img.Bounds(); bb.Dx() != 1024 || bb.Dy() != 576 {
			t.Fatalf("OpenAI screenshot %v, want 1024×576", bb)
		}
		return img
	}
	at := func(typ string, x, y int, more ...any) map[string]any {
		m := map[string]any{"type": typ, "x": x, "y": y}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i].(string)] = more[i+1]
		}
		return m
	}
	n := p.count()
	call(at("click", mx, my, "button", "left"))
	m := p.expect(n, "openai click", `^click d1 (\d+),(\d+)`)
	if x, y := atoi(m[1]), atoi(m[2]); x != wantX || y != wantY {
		t.Errorf("OpenAI click landed at (%d, %d), want (%d, %d)", x, y, wantX, wantY)
	}
	steps := []struct {
		name    string
		actions []map[string]any
		want    string
	}{
		{"click right", []map[string]any{at("click", 100, 300, "button", "right")}, `^auxclick b2 188,563`},
		{"click wheel", []map[string]any{at("click", 100, 300, "button", "wheel")}, `^auxclick b1 188,563`},
		{"click with keys", []map[string]any{at("click", 140, 300, "keys", []string{"SHIFT"})}, `click d1 263,563 S`},
		{"double_click", []map[string]any{at("double_click", 180, 300)}, `^dblclick 338,563`},
		{"move", []map[string]any{at("move", 200, 100)}, `^move 375,188`},
		{"drag", []map[string]any{{"type": "drag", "path": []map[string]int{{"x": 100, "y": 300}, {"x": 200, "y": 300}, {"x": 300, "y": 310}}}}, `up b0 563,582`},
		{"scroll down", []map[string]any{at("scroll", 500, 300, "scroll_x", 0, "scroll_y", 300)}, `^wheel 0,1 938,563`},
		{"scroll left", []map[string]any{at("scroll", 500, 300, "scroll_x", -200, "scroll_y", 0)}, `^wheel -1,0 938,563`},
		{"keypress", []map[string]any{{"type": "keypress", "keys": []string{"CTRL", "A"}}}, `keydown a C`},
		{"keypress ENTER", []map[string]any{{"type": "keypress", "keys": []string{"ENTER"}}}, `keydown Enter`},
		{"type", []map[string]any{{"type": "type", "text": "abc"}}, `\| [^|]*abc$`},
		{"GA batch", []map[string]any{at("click", 100, 300), {"type": "type", "text": "Z"}, {"type": "wait"}}, `\| [^|]*Z$`},
	}
	for _, s := range steps {
		n := p.count()
		call(s.actions...)
		p.expect(n, "openai "+s.name, s.want)
	}
	// screenshot and wait change nothing on the page.
	n = p.count()
	call(map[string]any{"type": "screenshot"})
	if got := p.count(); got != n {
		t.Errorf("an OpenAI screenshot made %d events", got-n)
	}

	// Pending safety checks run only once acknowledged.
	n = p.count()
	cc := map[string]any{"call_id": "call_2", "action": map[string]any{"type": "type", "text": "Q"},
		"pending_safety_checks": []map[string]string{{"id": "sc_1", "code": "sensitive_domain", "message": "a bank"}}}
	_, err := p.c.ComputerOpenAI(ctx, p.id, map[string]any{"tool": tool, "computer_call": cc})
	if client.ErrorCode(err) != client.CodeConflict {
		t.Errorf("unacknowledged safety check: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	if got := p.count(); got != n {
		t.Errorf("an unacknowledged call reached the page")
	}
	raw, err := p.c.ComputerOpenAI(ctx, p.id, map[string]any{"tool": tool, "computer_call": cc, "acknowledge_safety_checks": true})
	if err != nil || !strings.Contains(string(raw), `"acknowledged_safety_checks":[{"id":"sc_1"`) {
		t.Errorf("acknowledged: %v %.200s", err, raw)
	}
	p.expect(n, "acknowledged call", `\| [^|]*Q$`)

	// Last, as they could take the page away were the page's
	// preventDefault not honoured: the back and forward buttons.
	for _, b := range []struct{ name, want string }{{"back", `^(auxclick|up) b3 188,563`}, {"forward", `^(auxclick|up) b4 188,563`}} {
		n := p.count()
		call(at("click", 100, 300, "button", b.name))
		p.expect(n, "openai click "+b.name, b.want)
	}
}

// openComputerPage opens the computer-use test page in the sandbox's
// Chromium and waits until its target is painted.
func openComputerPage(t *testing.T, c *client.Client, id string) {
	t.Helper()
	openPage(t, c, id, "computer.html", "cu 0 ready")
	waitFor(t, "target painted", func() bool { return !findColour(screenshotImage(t, c, id), isBlue).Empty() })
}

func screenshotImage(t *testing.T, c *client.Client, id string) image.Image {
	t.Helper()
	b, err := c.Screenshot(context.Background(), id, client.ScreenshotOptions{Format: "png"})
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// resultImage decodes the image of a tool_result.
func resultImage(t *testing.T, r map[string]any) image.Image {
	t.Helper()
	content, _ := r["content"].([]any)
	if len(content) != 1 {
		t.Fatalf("tool_result content %v", r["content"])
	}
	block, _ := content[0].(map[string]any)
	src, _ := block["source"].(map[string]any)
	if block["type"] != "image" || src["type"] != "base64" || src["media_type"] != "image/png" {
		t.Fatalf("not an image block: %v", block)
	}
	b, err := base64.StdEncoding.DecodeString(src["data"].(string))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func contentText(r map[string]any) string {
	content, _ := r["content"].([]any)
	if len(content) != 1 {
		return ""
	}
	block, _ := content[0].(map[string]any)
	s, _ := block["text"].(string)
	return s
}

func isBlue(c color.Color) bool {
	r, g, b, _ := c.RGBA()
	return r>>8 < 60 && g>>8 < 60 && b>>8 > 200
}

func isGreen(c color.Color) bool {
	r, g, b, _ := c.RGBA()
	return r>>8 < 60 && g>>8 > 200 && b>>8 < 60
}

// findColour returns the bounding box of the pixels of img that match.
func findColour(img image.Image, match func(color.Color) bool) image.Rectangle {
	var box image.Rectangle
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if match(img.At(x, y)) {
				box = box.Union(image.Rect(x, y, x+1, y+1))
			}
		}
	}
	return box
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func bodyOf(e *client.APIError) string {
	if e == nil {
		return ""
	}
	return string(e.Body)
}
