package computer

import (
	"context"
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// FuzzVendorRequests feeds both vendor parsers (Anthropic's when openai is
// false) bodies from outside and runs what they accept on a test double:
// nothing may panic, an error must be a *RequestError, and every action
// that reaches the agent must be one the action language accepts, inside
// the screen.
func FuzzVendorRequests(f *testing.F) {
	for _, s := range []string{
		`{"input": {"action": "left_click", "coordinate": [512, 288], "text": "ctrl"}, "tool": ` + xga + `}`,
		`{"input": {"action": "zoom", "region": [0, 0, 100, 50]}}`,
		`{"input": {"action": "key", "text": "ctrl+a Delete", "repeat": 2}}`,
		`{"input": {"action": "hold_key", "text": "shift", "duration": 61}}`,
		`{"tool_uses": [{"id": "a", "name": "left_click_drag", "toolset_name": "computer", "input": {"start_coordinate": [1, 1], "coordinate": [9, 9]}}]}`,
	} {
		f.Add([]byte(s), false)
	}
	for _, s := range []string{
		`{"computer_call": {"call_id": "c", "action": {"type": "click", "x": 5, "y": 5, "button": "back"}}}`,
		`{"tool": ` + preview + `, "computer_call": {"call_id": "c", "actions": [{"type": "scroll", "x": 1, "y": 2, "scroll_x": 5, "scroll_y": -700, "keys": ["SHIFT"]}]}}`,
		`{"computer_call": {"call_id": "c", "action": {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 3, "y": 4}]}}, "image": {"format": "jpeg", "quality": 50}}`,
	} {
		f.Add([]byte(s), true)
	}
	screen := Size{1920, 1080}
	f.Fuzz(func(t *testing.T, body []byte, openai bool) {
		d := newRecordingDesktop(screen.Width, screen.Height)
		var err error
		if openai {
			var c *OpenAICall
			if c, err = ParseOpenAI(body); err == nil {
				_, err = c.Run(context.Background(), d, screen)
			}
		} else {
			var c *AnthropicCall
			if c, err = ParseAnthropic(body); err == nil {
				_, err = c.Run(context.Background(), d, screen)
			}
		}
		var re *RequestError
		if err != nil && !errors.As(err, &re) {
			t.Fatalf("error of type %T: %v", err, err)
		}
		for _, call := range d.got {
			for _, a := range call {
				if _, nerr := action.Normalize(a); nerr != nil {
					t.Fatalf("sent an action the language refuses: %+v: %v", a, nerr)
				}
				if a.X != nil && a.Type != action.TypeScreenshot && (*a.X >= screen.Width || *a.Y >= screen.Height) {
					t.Fatalf("sent a point outside the screen: %+v", a)
				}
			}
		}
	})
}
