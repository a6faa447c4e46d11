package api

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// TestActionsClipboard: clipboard_set reaches the agent with its text,
// clipboard_get answers "text" (present, "" for an empty clipboard), and
// a bad clipboard_set is refused before the agent sees anything.
func TestActionsClipboard(t *testing.T) {
	e := newTestEnv(t, Config{})
	p := "/v1/sandboxes/" + runningID + "/actions"

	got := decode[actionsResponse](t, e.do("POST", p, strings.NewReader(`{"type":"clipboard_get"}`)), 200)
	if d := cmp.Diff([]map[string]any{{"type": "clipboard_get", "text": ""}}, got.Results); d != "" {
		t.Errorf("empty clipboard (-want +got):\n%s", d)
	}

	const text = "héllo ✓ 東京\n😀"
	got = decode[actionsResponse](t, e.do("POST", p, strings.NewReader(
		`{"actions":[{"type":"clipboard_set","text":"`+strings.ReplaceAll(text, "\n", `\n`)+`"},{"type":"clipboard_get"}]}`)), 200)
	want := []map[string]any{{"type": "clipboard_set"}, {"type": "clipboard_get", "text": text}}
	if d := cmp.Diff(want, got.Results); d != "" {
		t.Errorf("set then get (-want +got):\n%s", d)
	}
	if a := e.agent.lastAct.GetActions()[0]; a.GetType() != "clipboard_set" || a.GetText() != text {
		t.Errorf("agent got %v", a)
	}

	for _, c := range []struct{ body, msg string }{
		{`{"type":"clipboard_set"}`, "needs text"},
		{`{"type":"clipboard_set","text":"a\u0000b"}`, "NUL"},
		{`{"type":"clipboard_set","text":"` + strings.Repeat("x", action.MaxClipboardBytes+1) + `"}`, "at most 65536"},
		{`{"type":"clipboard_get","text":"x"}`, `"text" is not used by clipboard_get`},
	} {
		e.agent.lastAct = nil
		we := wantError(t, e.do("POST", p, strings.NewReader(c.body)), 400, codeInvalid)
		if !strings.Contains(we.Message, c.msg) {
			t.Errorf("%.60s: %q, want it to say %q", c.body, we.Message, c.msg)
		}
		if e.agent.lastAct != nil {
			t.Errorf("%.60s reached the agent", c.body)
		}
	}
}
