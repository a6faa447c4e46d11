package computer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/action"
)

const preview = `{"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "linux"}`

// TestOpenAIGolden runs OpenAI's documented computer_call shapes, preview
// (one "action") and GA (a batch of "actions"), on a 1920×1080 screen and
// checks the native actions they become.
func TestOpenAIGolden(t *testing.T) {
	tests := []struct{ name, tool, call, want string }{
		{"preview click", preview, `{"type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed",
			"action": {"type": "click", "x": 512, "y": 288, "button": "left"}, "pending_safety_checks": []}`,
			"click 960,540; screenshot w=1024"},
		{"right", preview, `{"call_id": "c", "action": {"type": "click", "x": 0, "y": 0, "button": "right"}}`, "click 0,0 right; screenshot w=1024"},
		{"wheel", "", `{"call_id": "c", "action": {"type": "click", "x": 5, "y": 6, "button": "wheel"}}`, "click 5,6 middle; screenshot"},
		{"double", "", `{"call_id": "c", "action": {"type": "double_click", "x": 5, "y": 6}}`, "double_click 5,6; screenshot"},
		{"move", "", `{"call_id": "c", "action": {"type": "move", "x": 100, "y": 200}}`, "move 100,200; screenshot"},
		{"drag", preview, `{"call_id": "c", "action": {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 256, "y": 144}, {"x": 512, "y": 288}]}}`,
			"drag 0,0 480,270 960,540; screenshot w=1024"},
		{"keypress combo", "", `{"call_id": "c", "action": {"type": "keypress", "keys": ["CTRL", "C"]}}`, "key CTRL+c; screenshot"},
		{"keypress names", "", `{"call_id": "c", "actions": [{"type": "keypress", "keys": ["ENTER"]}, {"type": "keypress", "keys": ["ESC"]},
			{"type": "keypress", "keys": ["ArrowLeft"]}, {"type": "keypress", "keys": ["F12"]}, {"type": "keypress", "keys": ["A"]}]}`,
			"key ENTER; key ESC; key ArrowLeft; key F12; key A; screenshot"},
		{"scroll pixels", "", `{"call_id": "c", "action": {"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": 300}}`,
			"scroll 10,20 down×3; screenshot"},
		{"scroll up and left", "", `{"call_id": "c", "action": {"type": "scroll", "x": 10, "y": 20, "scroll_x": -40, "scroll_y": -120}}`,
			"scroll 10,20 up×1; scroll 10,20 left×1; screenshot"},
		{"type", "", `{"call_id": "c", "action": {"type": "type", "text": "hello"}}`, `type "hello"; screenshot`},
		{"wait", "", `{"call_id": "c", "action": {"type": "wait"}}`, "wait 1000ms; screenshot"},
		{"screenshot", "", `{"call_id": "c", "action": {"type": "screenshot"}}`, "screenshot"},
		{"GA batch with held keys", `{"type": "computer"}`, `{"type": "computer_call", "call_id": "c", "actions": [
			{"type": "click", "x": 10, "y": 10, "button": "left", "keys": ["SHIFT"]},
			{"type": "move", "x": 20, "y": 20, "keys": ["ctrl", "alt"]},
			{"type": "type", "text": "x"}]}`,
			`key_down SHIFT; click 10,10; key_up SHIFT; key_down ctrl+alt; move 20,20; key_up ctrl+alt; type "x"; screenshot`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"computer_call": ` + tt.call
			if tt.tool != "" {
				body += `, "tool": ` + tt.tool
			}
			body += "}"
			call, err := ParseOpenAI([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			d := newRecordingDesktop(1920, 1080)
			out, err := call.Run(context.Background(), d, d.screen)
			if err != nil {
				t.Fatal(err)
			}
			if got := describeAll(d.last()); got != tt.want {
				t.Errorf("actions:\n got %s\nwant %s", got, tt.want)
			}
			if out.Type != "computer_call_output" || out.Output.Type != "computer_screenshot" ||
				!strings.HasPrefix(out.Output.ImageURL, "data:image/png;base64,") {
				t.Errorf("output = %.200v", out)
			}
			data, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(out.Output.ImageURL, "data:image/png;base64,"))
			if err != nil {
				t.Fatal(err)
			}
			var shot action.Action
			if err := json.Unmarshal(data, &shot); err != nil || shot.Type != action.TypeScreenshot {
				t.Errorf("image is not the call's screenshot: %s", data)
			}
		})
	}
}

// TestOpenAIOutput: the answer is the computer_call_output item OpenAI's
// API takes back, with the call's id, and acknowledged_safety_checks only
// when the caller acknowledged them.
func TestOpenAIOutput(t *testing.T) {
	call := `{"type": "computer_call", "call_id": "call_9", "action": {"type": "screenshot"},
		"pending_safety_checks": [{"id": "sc_1", "code": "malicious_instructions", "message": "check the page"}]}`
	for _, ack := range []bool{false, true} {
		body := `{"computer_call": ` + call + `, "acknowledge_safety_checks": ` + map[bool]string{false: "false", true: "true"}[ack] + `}`
		c, err := ParseOpenAI([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		checks, got := c.SafetyChecks()
		if len(checks) != 1 || checks[0].ID != "sc_1" || got != ack {
			t.Fatalf("safety checks = %v %v", checks, got)
		}
		d := newRecordingDesktop(800, 600)
		out, err := c.Run(context.Background(), d, d.screen)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(out)
		s := string(raw)
		if !strings.HasPrefix(s, `{"type":"computer_call_output","call_id":"call_9","output":{"type":"computer_screenshot","image_url":"data:image/png;base64,`) {
			t.Errorf("JSON = %.150s", s)
		}
		if has := strings.Contains(s, `"acknowledged_safety_checks":[{"id":"sc_1"`); has != ack {
			t.Errorf("acknowledged %v: JSON %s", ack, s[len(s)-120:])
		}
	}
}

// TestOpenAIFailure: the agent's refusal names the computer_call's own
// action, not the native one.
func TestOpenAIFailure(t *testing.T) {
	c, err := ParseOpenAI([]byte(`{"computer_call": {"call_id": "c", "actions": [
		{"type": "click", "x": 1, "y": 1, "keys": ["ctrl"]}, {"type": "type", "text": "x"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	d := newRecordingDesktop(800, 600)
	d.failAt, d.failCode = 3, CodeInvalid // type: after key_down, click, key_up
	_, err = c.Run(context.Background(), d, d.screen)
	var f *Failure
	if !errors.As(err, &f) || f.Index != 1 || f.Type != "type" {
		t.Fatalf("err = %#v", err)
	}
}

func TestOpenAIBadInput(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"no call", `{}`, `needs "computer_call"`},
		{"no call_id", `{"computer_call": {"action": {"type": "screenshot"}}}`, "needs call_id"},
		{"no action", `{"computer_call": {"call_id": "c"}}`, `no "action" or "actions"`},
		{"both", `{"computer_call": {"call_id": "c", "action": {"type": "wait"}, "actions": [{"type": "wait"}]}}`, "both"},
		{"unknown type", `{"computer_call": {"call_id": "c", "action": {"type": "tap", "x": 1, "y": 1}}}`, `unknown action type "tap"`},
		{"missing x", `{"computer_call": {"call_id": "c", "action": {"type": "click", "y": 1}}}`, "click needs x"},
		{"outside", `{"tool": ` + preview + `, "computer_call": {"call_id": "c", "action": {"type": "click", "x": 10, "y": 580}}}`,
			"coordinate (10, 580) is outside the screen: x must be 0..1023 and y 0..575"},
		{"drag outside", `{"computer_call": {"call_id": "c", "action": {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 5000, "y": 1}]}}}`, "path[1]"},
		{"bad button", `{"computer_call": {"call_id": "c", "action": {"type": "click", "x": 1, "y": 1, "button": "thumb"}}}`, "button must be"},
		{"bad key", `{"computer_call": {"call_id": "c", "action": {"type": "keypress", "keys": ["CTRL", "NOSUCH"]}}}`, `unknown key "NOSUCH"`},
		{"empty keys", `{"computer_call": {"call_id": "c", "action": {"type": "keypress", "keys": []}}}`, "at least one key"},
		{"field not taken", `{"computer_call": {"call_id": "c", "action": {"type": "type", "text": "a", "x": 1}}}`, "type does not take x"},
		{"zero scroll", `{"computer_call": {"call_id": "c", "action": {"type": "scroll", "x": 1, "y": 1}}}`, "non-zero"},
		{"short drag", `{"computer_call": {"call_id": "c", "action": {"type": "drag", "path": [{"x": 1, "y": 1}]}}}`, "at least 2 points"},
		{"preview without display", `{"tool": {"type": "computer_use_preview"}, "computer_call": {"call_id": "c", "action": {"type": "wait"}}}`, "needs display_width"},
		{"unknown tool", `{"tool": {"type": "browser"}, "computer_call": {"call_id": "c", "action": {"type": "wait"}}}`, "tool.type"},
		{"unknown field", `{"computer_call": {"call_id": "c", "action": {"type": "wait"}}, "extra": 1}`, "invalid request"},
		{"unknown action field", `{"computer_call": {"call_id": "c", "action": {"type": "wait", "ms": 5}}}`, "invalid action"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newRecordingDesktop(1920, 1080)
			c, err := ParseOpenAI([]byte(tt.body))
			if err == nil {
				_, err = c.Run(context.Background(), d, d.screen)
			}
			var re *RequestError
			if !errors.As(err, &re) || !strings.Contains(re.Msg, tt.want) {
				t.Fatalf("err = %v, want a RequestError with %q", err, tt.want)
			}
			if len(d.got) != 0 {
				t.Errorf("ran %v", d.got)
			}
		})
	}
}
