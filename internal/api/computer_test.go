package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/computer"
)

// TestComputerAnthropic checks the wire format of POST
// …/computer/anthropic against the fake agent (a 1024×768 screen): the
// answer is the tool_result itself, bad input is a 400 that carries the
// tool_result as an error and reaches no action, and an agent failure
// keeps the API's status codes.
func TestComputerAnthropic(t *testing.T) {
	e := newTestEnv(t, Config{})
	p := "/v1/sandboxes/" + runningID + "/computer/anthropic"

	got := decode[computer.AnthropicResult](t, e.do("POST", p, strings.NewReader(`{"input": {"action": "left_click", "coordinate": [10, 20]}}`)), 200)
	if got.Type != "tool_result" || got.IsError || len(got.Content) != 1 || got.Content[0].Type != "image" ||
		got.Content[0].Source.MediaType != "image/png" || got.Content[0].Source.Data == "" {
		t.Errorf("tool_result = %+v", got)
	}
	acts := e.agent.lastAct.GetActions()
	if len(acts) != 2 || acts[0].GetType() != "click" || acts[0].GetX() != 10 || acts[0].GetY() != 20 || acts[1].GetType() != "screenshot" {
		t.Errorf("agent got %v", acts)
	}

	// A batch: one tool_result per tool_use, under "tool_results".
	body := `{"tool_uses": [{"type": "tool_use", "id": "toolu_1", "name": "computer", "input": {"action": "cursor_position"}},
		{"type": "tool_use", "id": "toolu_2", "name": "computer", "input": {"action": "screenshot"}}]}`
	batch := decode[struct {
		Results []computer.AnthropicResult `json:"tool_results"`
	}](t, e.do("POST", p, strings.NewReader(body)), 200)
	if len(batch.Results) != 2 || batch.Results[0].ToolUseID != "toolu_1" || batch.Results[0].Content[0].Text != "X=5,Y=0" ||
		batch.Results[1].Content[0].Type != "image" {
		t.Errorf("batch = %+v", batch)
	}

	// Bad input: 400 with a message a model can act on, the tool_result
	// as an error, and nothing run.
	for _, c := range []struct{ body, want string }{
		{`{"input": {"action": "fly"}}`, `unknown action "fly"`},
		{`{"input": {"action": "left_click", "coordinate": [1024, 0]}}`, "outside the screen: x must be 0..1023"},
		{`{"input": {"action": "mouse_move"}}`, "mouse_move needs coordinate"},
	} {
		e.agent.lastAct = nil
		w := e.do("POST", p, strings.NewReader(c.body))
		we := wantError(t, w, http.StatusBadRequest, codeInvalid)
		if !strings.Contains(we.Message, c.want) || we.Index == nil || *we.Index != 0 {
			t.Errorf("%s: %+v", c.body, we)
		}
		eb := decode[errorBody](t, w, http.StatusBadRequest)
		if eb.ToolResult == nil || !eb.ToolResult.IsError || !strings.Contains(eb.ToolResult.Content[0].Text, c.want) {
			t.Errorf("%s: tool_result %+v", c.body, eb.ToolResult)
		}
		if a := e.agent.lastAct.GetActions(); len(a) > 1 || (len(a) == 1 && a[0].GetType() != "screen_size") {
			t.Errorf("%s ran %v", c.body, a)
		}
	}

	// The desktop restarting under the action: 503 and the tool_result.
	w := e.do("POST", p, strings.NewReader(`{"input": {"action": "wait", "duration": 59.998}}`))
	wantError(t, w, http.StatusServiceUnavailable, codeUnavailable)
	if eb := decode[errorBody](t, w, http.StatusServiceUnavailable); eb.ToolResult == nil || !eb.ToolResult.IsError {
		t.Errorf("unavailable: %s", w.Body.String())
	}

	wantError(t, e.do("POST", "/v1/sandboxes/"+headlessID+"/computer/anthropic", strings.NewReader(`{"input": {"action": "screenshot"}}`)),
		http.StatusConflict, codeNoDesktop)
	wantError(t, e.do("POST", "/v1/sandboxes/nosuch/computer/anthropic", strings.NewReader(`{"input": {"action": "screenshot"}}`)),
		http.StatusNotFound, codeNotFound)
}

// TestComputerOpenAI checks POST …/computer/openai: the answer is the
// computer_call_output item, and a call with pending safety checks runs
// only when the request acknowledges them.
func TestComputerOpenAI(t *testing.T) {
	e := newTestEnv(t, Config{})
	p := "/v1/sandboxes/" + runningID + "/computer/openai"

	call := `{"type": "computer_call", "id": "cu_1", "call_id": "call_1", "action": {"type": "click", "x": 3, "y": 4, "button": "right"}`
	got := decode[computer.OpenAIOutput](t, e.do("POST", p, strings.NewReader(`{"computer_call": `+call+`}}`)), 200)
	if got.Type != "computer_call_output" || got.CallID != "call_1" || got.Output.Type != "computer_screenshot" ||
		!strings.HasPrefix(got.Output.ImageURL, "data:image/png;base64,") || got.AcknowledgedSafetyChecks != nil {
		t.Errorf("output = %+v", got)
	}
	if a := e.agent.lastAct.GetActions(); len(a) != 2 || a[0].GetButton() != "right" || a[0].GetX() != 3 {
		t.Errorf("agent got %v", a)
	}

	checked := `{"computer_call": {"call_id": "call_2", "action": {"type": "type", "text": "pay"},
		"pending_safety_checks": [{"id": "sc_1", "code": "sensitive_domain", "message": "a bank"}]}`
	e.agent.lastAct = nil
	we := wantError(t, e.do("POST", p, strings.NewReader(checked+`}`)), http.StatusConflict, codeConflict)
	if !strings.Contains(we.Message, "sensitive_domain: a bank") || !strings.Contains(we.Message, "acknowledge_safety_checks") {
		t.Errorf("safety check message: %s", we.Message)
	}
	if e.agent.lastAct != nil {
		t.Errorf("ran %v with the checks pending", e.agent.lastAct)
	}
	got = decode[computer.OpenAIOutput](t, e.do("POST", p, strings.NewReader(checked+`, "acknowledge_safety_checks": true}`)), 200)
	if len(got.AcknowledgedSafetyChecks) != 1 || got.AcknowledgedSafetyChecks[0].ID != "sc_1" {
		t.Errorf("acknowledged = %+v", got.AcknowledgedSafetyChecks)
	}

	// A bad action: 400, nothing of the call ran, and the body carries a
	// computer_call_output of the screen as it is, for the loop to send
	// back with the reason (the Responses API wants one for every call).
	for _, c := range []struct{ body, want string }{
		{`{"computer_call": {"call_id": "c", "actions": [{"type": "wait"}, {"type": "click", "x": 1}]}}`, "click needs y"},
		{`{"computer_call": {"call_id": "c", "actions": [{"type": "wait"}, {"type": "click", "x": 1, "y": 5000}]}}`, "outside the screen"},
	} {
		e.agent.lastAct = nil
		w := e.do("POST", p, strings.NewReader(c.body))
		we = wantError(t, w, http.StatusBadRequest, codeInvalid)
		if we.Index == nil || *we.Index != 1 || !strings.Contains(we.Message, c.want) {
			t.Errorf("bad action: %+v", we)
		}
		if a := e.agent.lastAct.GetActions(); len(a) != 1 || a[0].GetType() != "screenshot" {
			t.Errorf("bad input ran %v, want only the observing screenshot", a)
		}
		eb := decode[errorBody](t, w, http.StatusBadRequest)
		if o := eb.ComputerCallOutput; o == nil || o.CallID != "c" || !strings.HasPrefix(o.Output.ImageURL, "data:image/png;base64,") {
			t.Errorf("error body's computer_call_output = %+v", o)
		}
	}
}
