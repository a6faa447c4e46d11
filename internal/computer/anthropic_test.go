package computer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// describe writes an action the way the golden tables spell them.
func describe(a action.Action) string {
	var b strings.Builder
	b.WriteString(a.Type)
	if a.X != nil {
		fmt.Fprintf(&b, " %d,%d", *a.X, *a.Y)
	}
	if a.Button != "" && a.Button != action.ButtonLeft {
		b.WriteString(" " + a.Button)
	}
	if len(a.Keys) > 0 {
		b.WriteString(" " + a.Keys.String())
	}
	if a.Text != "" {
		fmt.Fprintf(&b, " %q", a.Text)
	}
	if a.Direction != "" {
		fmt.Fprintf(&b, " %s×%d", a.Direction, a.Amount)
	}
	for _, p := range a.Path {
		fmt.Fprintf(&b, " %d,%d", p[0], p[1])
	}
	if a.DurationMS != 0 {
		fmt.Fprintf(&b, " %dms", a.DurationMS)
	}
	if a.W != 0 {
		fmt.Fprintf(&b, " %dx%d", a.W, a.H)
	}
	if a.Width != 0 {
		fmt.Fprintf(&b, " w=%d", a.Width)
	}
	if a.Format != "" && a.Format != action.FormatPNG {
		b.WriteString(" " + a.Format)
	}
	return b.String()
}

func describeAll(as []action.Action) string {
	var out []string
	for _, a := range as {
		out = append(out, describe(a))
	}
	return strings.Join(out, "; ")
}

const (
	xga       = `{"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768}`
	v2024     = `{"type": "computer_20241022", "name": "computer", "display_width_px": 1024, "display_height_px": 768}`
	v2025zoom = `{"type": "computer_20251124", "name": "computer", "display_width_px": 1024, "display_height_px": 768, "enable_zoom": true}`
)

// TestAnthropicGolden runs the inputs of Anthropic's documented actions on
// a 1920×1080 screen the model sees at 1024×768 (XGA, so 1024×576 without
// stretching) and checks the native actions they become and what the
// tool_result holds.
func TestAnthropicGolden(t *testing.T) {
	tests := []struct {
		name, tool, input string
		want              string // the native actions
		answer            string // "image WxH", "text ..." or ""
	}{
		{"screenshot", xga, `{"action": "screenshot"}`, "screenshot w=1024", "image 1024x576"},
		{"click centre", xga, `{"action": "left_click", "coordinate": [512, 288]}`,
			"click 960,540; screenshot w=1024", "image 1024x576"},
		{"click corner", xga, `{"action": "left_click", "coordinate": [1023, 575]}`,
			"click 1919,1079; screenshot w=1024", "image 1024x576"},
		{"click with modifiers", xga, `{"action": "left_click", "coordinate": [0, 0], "text": "ctrl+shift"}`,
			"key_down ctrl+shift; click 0,0; key_up ctrl+shift; screenshot w=1024", "image 1024x576"},
		{"click where the pointer is", xga, `{"action": "right_click"}`, "click right; screenshot w=1024", "image 1024x576"},
		{"middle", xga, `{"action": "middle_click", "coordinate": [10, 10]}`, "click 19,19 middle; screenshot w=1024", "image 1024x576"},
		{"double", xga, `{"action": "double_click", "coordinate": [100, 100]}`, "double_click 188,188; screenshot w=1024", "image 1024x576"},
		{"triple", xga, `{"action": "triple_click", "coordinate": [100, 100]}`, "triple_click 188,188; screenshot w=1024", "image 1024x576"},
		{"move", xga, `{"action": "mouse_move", "coordinate": [256, 144]}`, "move 480,270; screenshot w=1024", "image 1024x576"},
		{"drag 2025", xga, `{"action": "left_click_drag", "start_coordinate": [0, 0], "coordinate": [512, 288]}`,
			"drag 0,0 960,540; screenshot w=1024", "image 1024x576"},
		{"drag 2024 from the pointer", v2024, `{"action": "left_click_drag", "coordinate": [512, 288]}`,
			"mouse_down; move 960,540; mouse_up; screenshot w=1024", "image 1024x576"},
		{"mouse down", xga, `{"action": "left_mouse_down"}`, "mouse_down; screenshot w=1024", "image 1024x576"},
		{"mouse up", xga, `{"action": "left_mouse_up"}`, "mouse_up; screenshot w=1024", "image 1024x576"},
		{"key", xga, `{"action": "key", "text": "ctrl+s"}`, "key ctrl+s; screenshot w=1024", "image 1024x576"},
		{"key xdotool names", xga, `{"action": "key", "text": "alt+Tab KP_0 Return"}`,
			"key alt+Tab; key KP_0; key Return; screenshot w=1024", "image 1024x576"},
		{"key repeat", "", `{"action": "key", "text": "Down", "repeat": 3}`,
			"key Down; key Down; key Down; screenshot w=1365", "image 1365x768"},
		{"type", xga, `{"action": "type", "text": "héllo wörld\n"}`, `type "héllo wörld\n"; screenshot w=1024`, "image 1024x576"},
		{"scroll", xga, `{"action": "scroll", "coordinate": [512, 288], "scroll_direction": "down", "scroll_amount": 5}`,
			"scroll 960,540 down×5; screenshot w=1024", "image 1024x576"},
		{"scroll with shift", xga, `{"action": "scroll", "scroll_direction": "left", "scroll_amount": 2, "text": "shift"}`,
			"key_down shift; scroll left×2; key_up shift; screenshot w=1024", "image 1024x576"},
		{"hold key", xga, `{"action": "hold_key", "text": "shift", "duration": 1.5}`, "hold_key shift 1500ms; screenshot w=1024", "image 1024x576"},
		{"hold key long", xga, `{"action": "hold_key", "text": "a", "duration": 90}`,
			"key_down a; wait 60000ms; wait 30000ms; key_up a; screenshot w=1024", "image 1024x576"},
		{"wait", xga, `{"action": "wait", "duration": 0.25}`, "wait 250ms; screenshot w=1024", "image 1024x576"},
		{"cursor position", xga, `{"action": "cursor_position"}`, "cursor_position", "text X=0,Y=0"},
		{"zoom", v2025zoom, `{"action": "zoom", "region": [0, 0, 256, 144]}`, "screenshot 0,0 480x270", "image 480x270"},
		{"zoom large region", v2025zoom, `{"action": "zoom", "region": [0, 0, 1024, 576]}`, "screenshot 0,0 1920x1080 w=1024", "image 1024x576"},
		{"toolset zoom by default", "", `{"action": "zoom", "region": [682, 384, 1365, 768]}`, "screenshot 959,540 961x540", "image 961x540"},
		{"jpeg", xga, `{"action": "screenshot"}`, "screenshot w=1024", "image 1024x576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"input": ` + tt.input
			if tt.tool != "" {
				body += `, "tool": ` + tt.tool
			}
			body += "}"
			d := newRecordingDesktop(1920, 1080)
			resp := runAnthropic(t, d, body)
			if got := describeAll(d.last()); got != tt.want {
				t.Errorf("actions:\n got %s\nwant %s", got, tt.want)
			}
			r := resp.Result
			if r == nil || r.Type != "tool_result" || r.IsError {
				t.Fatalf("result = %+v", r)
			}
			if got := describeContent(t, r.Content); got != tt.answer {
				t.Errorf("content = %s, want %s", got, tt.answer)
			}
		})
	}
}

func runAnthropic(t *testing.T, d *recordingDesktop, body string) AnthropicResponse {
	t.Helper()
	call, err := ParseAnthropic([]byte(body))
	if err != nil {
		t.Fatalf("parse %s: %v", body, err)
	}
	resp, err := call.Run(context.Background(), d, d.screen)
	if err != nil {
		t.Fatalf("run %s: %v", body, err)
	}
	// The answer is what goes back to the API verbatim: it must be JSON
	// of the tool_result shape.
	if _, err := json.Marshal(resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

// describeContent summarizes a tool_result's content, checking the image
// block's shape (Anthropic's base64 source) on the way.
func describeContent(t *testing.T, content []AnthropicContent) string {
	t.Helper()
	if len(content) == 0 {
		return ""
	}
	if len(content) != 1 {
		t.Fatalf("%d content blocks", len(content))
	}
	c := content[0]
	switch c.Type {
	case "text":
		return "text " + c.Text
	case "image":
		s := c.Source
		if s == nil || s.Type != "base64" || (s.MediaType != "image/png" && s.MediaType != "image/jpeg") {
			t.Fatalf("image source = %+v", s)
		}
		data, err := base64.StdEncoding.DecodeString(s.Data)
		if err != nil {
			t.Fatal(err)
		}
		// The test double's image data is the screenshot request; the
		// size is in the result, which the double computed.
		var a action.Action
		if err := json.Unmarshal(data, &a); err != nil {
			t.Fatalf("image data %q: %v", data, err)
		}
		return "image " + imageSize(a)
	}
	t.Fatalf("content type %q", c.Type)
	return ""
}

// imageSize is the size the test double made for screenshot request a on
// its 1920×1080 screen.
func imageSize(a action.Action) string {
	w, h := 1920, 1080
	if a.W > 0 {
		w, h = a.W, a.H
	}
	if a.Width > 0 && a.Width < w {
		h = heightFor(Size{w, h}, a.Width)
		w = a.Width
	}
	return fmt.Sprintf("%dx%d", w, h)
}

// TestAnthropicToolUses runs the tool_use blocks of one turn in one batch:
// every block is answered with its id, the screenshot goes with the last.
func TestAnthropicToolUses(t *testing.T) {
	body := `{"tool": ` + xga + `, "tool_uses": [
		{"type": "tool_use", "id": "toolu_1", "name": "computer", "input": {"action": "left_click", "coordinate": [512, 288]}},
		{"type": "tool_use", "id": "toolu_2", "name": "computer", "input": {"action": "type", "text": "hi"}},
		{"type": "tool_use", "id": "toolu_3", "name": "computer", "input": {"action": "key", "text": "Return"}}]}`
	d := newRecordingDesktop(1920, 1080)
	resp := runAnthropic(t, d, body)
	if got, want := describeAll(d.last()), `click 960,540; type "hi"; key Return; screenshot w=1024`; got != want {
		t.Errorf("actions %s, want %s", got, want)
	}
	if len(resp.Results) != 3 || resp.Result != nil {
		t.Fatalf("results = %+v", resp)
	}
	for i, r := range resp.Results {
		if r.ToolUseID != fmt.Sprintf("toolu_%d", i+1) || r.IsError {
			t.Errorf("result %d = %+v", i, r)
		}
	}
	if resp.Results[0].Content != nil || describeContent(t, resp.Results[2].Content) != "image 1024x576" {
		t.Errorf("content: %+v", resp.Results)
	}
	raw, _ := json.Marshal(resp)
	if !strings.HasPrefix(string(raw), `{"tool_results":[{"type":"tool_result","tool_use_id":"toolu_1"`) {
		t.Errorf("JSON = %.120s", raw)
	}

	// The toolset's blocks name the action and carry toolset_name, which
	// the results echo.
	body = `{"tool": {"type": "computer_toolset_20260801"}, "tool_uses": [
		{"type": "tool_use", "id": "toolu_a", "name": "left_click", "toolset_name": "computer", "input": {"coordinate": [683, 384], "text": "ctrl"}},
		{"type": "tool_use", "id": "toolu_b", "name": "cursor_position", "toolset_name": "computer", "input": {}}]}`
	d = newRecordingDesktop(1920, 1080)
	resp = runAnthropic(t, d, body)
	if got, want := describeAll(d.last()), "key_down ctrl; click 961,540; key_up ctrl; cursor_position"; got != want {
		t.Errorf("actions %s, want %s", got, want)
	}
	if r := resp.Results[1]; r.ToolsetName != "computer" || describeContent(t, r.Content) != "text X=683,Y=384" {
		t.Errorf("cursor result = %+v", r)
	}
}

// TestAnthropicFailure: the agent stops at an action; its tool_use is an
// error with the agent's words, the later ones were not executed, the
// earlier ones ran.
func TestAnthropicFailure(t *testing.T) {
	body := `{"tool": ` + xga + `, "tool_uses": [
		{"id": "t1", "name": "computer", "input": {"action": "mouse_move", "coordinate": [1, 1]}},
		{"id": "t2", "name": "computer", "input": {"action": "key", "text": "ctrl+a Delete"}},
		{"id": "t3", "name": "computer", "input": {"action": "type", "text": "x"}}]}`
	d := newRecordingDesktop(1920, 1080)
	d.failAt, d.failCode = 2, CodeInvalid // the second key of t2
	call, err := ParseAnthropic([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := call.Run(context.Background(), d, d.screen)
	var f *Failure
	if !errors.As(err, &f) || f.Index != 2 || f.Code != CodeInvalid || f.Message != "refused by the test double" {
		t.Fatalf("err = %#v", err)
	}
	r := resp.Results
	if len(r) != 3 || r[0].IsError || !r[1].IsError || !r[2].IsError {
		t.Fatalf("results = %+v", r)
	}
	if !strings.Contains(r[1].Content[0].Text, "key failed: refused by the test double") ||
		!strings.Contains(r[2].Content[0].Text, "not executed") {
		t.Errorf("messages: %q, %q", r[1].Content[0].Text, r[2].Content[0].Text)
	}
}

// TestAnthropicBadInput: what a model can get wrong is refused before
// anything runs, with words it can act on.
func TestAnthropicBadInput(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"unknown action", `{"input": {"action": "click"}}`, `unknown action "click": use one of key, type`},
		{"no action", `{"input": {"coordinate": [1, 2]}}`, `input needs "action"`},
		{"missing coordinate", `{"input": {"action": "mouse_move"}}`, "mouse_move needs coordinate"},
		{"outside the screen", `{"tool": ` + xga + `, "input": {"action": "left_click", "coordinate": [1024, 10]}}`,
			"coordinate (1024, 10) is outside the screen: x must be 0..1023 and y 0..575"},
		{"below the picture", `{"tool": ` + xga + `, "input": {"action": "left_click", "coordinate": [10, 600]}}`,
			"y 0..575"},
		{"bad coordinate shape", `{"input": {"action": "mouse_move", "coordinate": [1]}}`, "coordinate must be [x, y]"},
		{"float coordinate", `{"input": {"action": "mouse_move", "coordinate": [1.5, 2]}}`, "invalid input"},
		{"param not taken", `{"input": {"action": "screenshot", "text": "x"}}`, "screenshot does not take text"},
		{"version: no scroll in 2024", `{"tool": ` + v2024 + `, "input": {"action": "scroll", "scroll_direction": "up", "scroll_amount": 1}}`,
			"action scroll is not part of computer_20241022"},
		{"version: no click modifiers in 2024", `{"tool": ` + v2024 + `, "input": {"action": "left_click", "text": "ctrl"}}`,
			"left_click does not take text"},
		{"zoom not enabled", `{"tool": ` + xga + `, "input": {"action": "zoom", "region": [0, 0, 5, 5]}}`, "action zoom is not part of computer_20250124"},
		{"zoom switched off", `{"tool": {"type": "computer_20251124", "display_width_px": 1024, "display_height_px": 768}, "input": {"action": "zoom", "region": [0, 0, 5, 5]}}`,
			"zoom is not enabled"},
		{"zoom empty region", `{"input": {"action": "zoom", "region": [5, 5, 5, 9]}}`, "is empty"},
		{"toolset member off", `{"tool": {"type": "computer_toolset_20260801", "configs": {"type": {"enabled": false}}}, "input": {"action": "type", "text": "x"}}`,
			"disabled"},
		{"repeat outside the toolset", `{"tool": ` + xga + `, "input": {"action": "key", "text": "a", "repeat": 2}}`, "repeat is taken only by key"},
		{"repeat too many", `{"input": {"action": "key", "text": "a", "repeat": 101}}`, "repeat must be 1..100"},
		{"unknown key", `{"input": {"action": "key", "text": "ctrl+nosuchkey"}}`, `unknown key "nosuchkey"`},
		{"unknown modifier", `{"input": {"action": "left_click", "text": "hyperctrl"}}`, `unknown key "hyperctrl"`},
		{"long wait", `{"input": {"action": "wait", "duration": 101}}`, "at most 100 seconds"},
		{"zero wait", `{"input": {"action": "wait", "duration": 0}}`, "more than 0"},
		{"bad direction", `{"input": {"action": "scroll", "scroll_direction": "sideways", "scroll_amount": 1}}`, "scroll_direction must be"},
		{"no display", `{"tool": {"type": "computer_20250124"}, "input": {"action": "screenshot"}}`, "needs display_width_px"},
		{"display too big", `{"tool": {"type": "computer_20250124", "display_width_px": 1920, "display_height_px": 1080}, "input": {"action": "screenshot"}}`,
			"larger than Anthropic accepts"},
		{"unknown tool", `{"tool": {"type": "bash_20250124"}, "input": {"action": "screenshot"}}`, "not a computer tool"},
		{"both forms", `{"input": {"action": "screenshot"}, "tool_uses": []}`, "not both"},
		{"neither", `{}`, `needs "input"`},
		{"unknown field", `{"input": {"action": "screenshot"}, "colour": 1}`, "invalid request"},
		{"name differs", `{"tool_uses": [{"id": "x", "name": "left_click", "toolset_name": "computer", "input": {"action": "type"}}]}`, "differs"},
		{"bad image", `{"input": {"action": "screenshot"}, "image": {"format": "gif"}}`, "image.format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newRecordingDesktop(1920, 1080)
			call, err := ParseAnthropic([]byte(tt.body))
			if err == nil {
				_, err = call.Run(context.Background(), d, d.screen)
			}
			var re *RequestError
			if !errors.As(err, &re) || !strings.Contains(re.Msg, tt.want) {
				t.Fatalf("err = %v, want a RequestError with %q", err, tt.want)
			}
			if len(d.got) != 0 {
				t.Errorf("ran %v", d.got)
			}
			if call != nil {
				// The error answer is a tool_result the model can read.
				resp := call.ErrorResponse(err)
				r := resp.Result
				if r == nil && len(resp.Results) > 0 {
					r = &resp.Results[0]
				}
				if r == nil || !r.IsError || !strings.Contains(r.Content[0].Text, "not executed") {
					t.Errorf("error response = %+v", resp)
				}
			}
		})
	}
}

// TestAnthropicFrame: without a display size the picture is the target
// Anthropic recommends for the screen's aspect ratio, never larger than
// the screen, and always within Anthropic's image limits.
func TestAnthropicFrame(t *testing.T) {
	c := &AnthropicCall{}
	for _, tt := range []struct{ screen, want Size }{
		{Size{1920, 1080}, Size{1365, 768}}, // FWXGA is not quite 16:9
		{Size{2560, 1600}, Size{1280, 800}},
		{Size{2048, 1536}, Size{1024, 768}},
		{Size{1024, 768}, Size{1024, 768}},
		{Size{800, 600}, Size{800, 600}},
		{Size{1280, 800}, Size{1280, 800}},
	} {
		if got := c.AnthropicFrame(tt.screen).Image; got != tt.want {
			t.Errorf("%v: %v, want %v", tt.screen, got, tt.want)
		}
	}
	for _, screen := range []Size{{3000, 3000}, {4000, 1000}, {1600, 1600}, {1700, 500}} {
		got := c.AnthropicFrame(screen).Image
		if max(got.Width, got.Height) > anthropicMaxEdge || got.Width*got.Height > anthropicMaxPixels {
			t.Errorf("%v: %v is over the limits", screen, got)
		}
	}
}
