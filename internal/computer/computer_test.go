package computer

import (
	"context"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// TestRunClipboard: clipboard_get reports the text the agent read, as
// valid UTF-8, and "" (not nothing) for an empty clipboard; clipboard_set
// reports nothing.
func TestRunClipboard(t *testing.T) {
	for _, tt := range []struct {
		name string
		held string // what the agent reads from the clipboard
		want string
	}{
		{"empty", "", ""},
		{"unicode", "héllo ✓ 東京\n😀", "héllo ✓ 東京\n😀"},
		{"invalid UTF-8 from the agent", "a\xffb", "a\uFFFDb"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := newRecordingDesktop(1024, 768)
			d.clip = tt.held
			out, err := Run(context.Background(), d, []action.Action{{Type: action.TypeClipboardGet}})
			if err != nil || out.Failure != nil {
				t.Fatalf("Run: %v, %v", err, out.Failure)
			}
			if len(out.Results) != 1 || out.Results[0].Text == nil {
				t.Fatalf("results %+v, want one with Text", out.Results)
			}
			if got := *out.Results[0].Text; got != tt.want {
				t.Errorf("clipboard_get text %q, want %q", got, tt.want)
			}
		})
	}

	d := newRecordingDesktop(1024, 768)
	out, err := Run(context.Background(), d, []action.Action{
		{Type: action.TypeClipboardSet, Text: "copié ✓"}, {Type: action.TypeClipboardGet}})
	if err != nil || out.Failure != nil || len(out.Results) != 2 {
		t.Fatalf("Run: %+v, %v", out, err)
	}
	if out.Results[0].Text != nil {
		t.Errorf("clipboard_set reported text %q", *out.Results[0].Text)
	}
	if got := out.Results[1].Text; got == nil || *got != "copié ✓" {
		t.Errorf("clipboard_get after clipboard_set: %v, want %q", got, "copié ✓")
	}
	if got := d.last()[0]; got.Type != action.TypeClipboardSet || got.Text != "copié ✓" {
		t.Errorf("the agent was sent %+v", got)
	}
}
