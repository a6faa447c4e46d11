package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// TestClipboard drives the desktop's clipboard through the REST API (the
// Go SDK) and through MCP (the go-sdk client over /mcp) against Chromium
// on a real desktop (gvisor, or the backends CUBICLE_E2E_BACKEND names):
// what clipboard_set puts there, ctrl+v pastes into the page's field,
// which shows it in the window title; what the page's field holds, ctrl+a
// ctrl+c copies, and clipboard_get reads it back exactly. Unicode beyond
// Latin-1 and beyond the Basic Multilingual Plane goes both ways.
func TestClipboard(t *testing.T) {
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testClipboard(t, backend)
		})
	}
}

func testClipboard(t *testing.T, backend string) {
	d, c := startDaemon(t, backend)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 1024, Height: 768}})
	if err != nil {
		t.Fatal(err)
	}
	if text, err := c.ClipboardGet(ctx, sb.ID); err != nil || text != "" {
		t.Errorf("clipboard of a fresh desktop: %q, %v; want empty", text, err)
	}
	// The test page: a click on the pad focuses its field, whose value
	// the title shows as "typed: …".
	openTestPage(t, c, sb.ID)
	if err := c.Click(ctx, sb.ID, 512, 450); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "page turns green", func() bool { return near(pixel(t, c, sb.ID, 512, 450), green) })

	// clipboard_set, then ctrl+v in Chromium.
	const pasted = "Grüße ✓ 東京 😀 жёлтый"
	if err := c.ClipboardSet(ctx, sb.ID, pasted); err != nil {
		t.Fatal(err)
	}
	if err := c.Key(ctx, sb.ID, "ctrl+v"); err != nil {
		t.Fatal(err)
	}
	if !eventually(20*time.Second, func() bool { return hasWindowTitle(t, c, sb.ID, "typed: "+pasted) }) {
		ws, _ := c.Windows(ctx, sb.ID)
		t.Fatalf("after clipboard_set and ctrl+v the window titles are %+v, want one with %q", ws, "typed: "+pasted)
	}

	// Typed text, selected and copied in Chromium, is what clipboard_get
	// reads.
	const typed = "copied from Chromium: ü ж ✓"
	if _, err := c.Actions(ctx, sb.ID, client.PressKey("ctrl+a"), client.TypeText(typed)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "title shows the typed text", func() bool { return hasWindowTitle(t, c, sb.ID, "typed: "+typed) })
	if _, err := c.Actions(ctx, sb.ID, client.PressKey("ctrl+a"), client.PressKey("ctrl+c")); err != nil {
		t.Fatal(err)
	}
	var got string
	// Chromium takes the clipboard as it handles the key, a moment after
	// the key action returns.
	if !eventually(10*time.Second, func() bool {
		got, err = c.ClipboardGet(ctx, sb.ID)
		if err != nil {
			t.Fatalf("clipboard_get: %v", err)
		}
		return got != pasted
	}) || got != typed {
		t.Fatalf("clipboard_get after ctrl+c in Chromium: %q, want %q", got, typed)
	}

	// What each takes, when the other end is Chromium: medians of 5.
	var gets, sets []time.Duration
	for range 5 {
		start := time.Now()
		if text, err := c.ClipboardGet(ctx, sb.ID); err != nil || text != typed {
			t.Fatalf("clipboard_get: %q, %v", text, err)
		}
		gets = append(gets, time.Since(start))
	}
	for range 5 {
		start := time.Now()
		if err := c.ClipboardSet(ctx, sb.ID, pasted); err != nil {
			t.Fatal(err)
		}
		sets = append(sets, time.Since(start))
	}
	slices.Sort(gets)
	slices.Sort(sets)
	t.Logf("over REST, median of 5: clipboard_get from Chromium %v, clipboard_set %v", gets[2].Round(100*time.Microsecond), sets[2].Round(100*time.Microsecond))

	// The same through MCP: clipboard_set, paste over the field's text,
	// add to it, copy, clipboard_get.
	cs := mcpHTTP(t, d)
	const viaMCP = "through MCP ✓ Ελληνικά 🙂"
	mcpCall(t, cs, "clipboard_set", map[string]any{"sandbox_id": sb.ID, "text": viaMCP})
	if _, err := c.Actions(ctx, sb.ID, client.PressKey("ctrl+a"), client.PressKey("ctrl+v")); err != nil {
		t.Fatal(err)
	}
	if !eventually(20*time.Second, func() bool { return hasWindowTitle(t, c, sb.ID, "typed: "+viaMCP) }) {
		ws, _ := c.Windows(ctx, sb.ID)
		t.Fatalf("after MCP clipboard_set and ctrl+v the window titles are %+v, want one with %q", ws, "typed: "+viaMCP)
	}
	if sc, _ := mcpCall(t, cs, "clipboard_get", map[string]any{"sandbox_id": sb.ID}).StructuredContent.(map[string]any); sc["text"] != viaMCP {
		t.Errorf("MCP clipboard_get before the copy: %#v, want the text set", sc)
	}
	const more = " + typed"
	if _, err := c.Actions(ctx, sb.ID, client.TypeText(more), client.PressKey("ctrl+a"), client.PressKey("ctrl+c")); err != nil {
		t.Fatal(err)
	}
	var sc map[string]any
	if !eventually(10*time.Second, func() bool {
		sc, _ = mcpCall(t, cs, "clipboard_get", map[string]any{"sandbox_id": sb.ID}).StructuredContent.(map[string]any)
		return sc["text"] != viaMCP
	}) || sc["text"] != viaMCP+more {
		t.Fatalf("MCP clipboard_get after ctrl+c in Chromium: %#v, want %q", sc, viaMCP+more)
	}

	var viaMCPGets []time.Duration
	for range 5 {
		start := time.Now()
		mcpCall(t, cs, "clipboard_get", map[string]any{"sandbox_id": sb.ID})
		viaMCPGets = append(viaMCPGets, time.Since(start))
	}
	slices.Sort(viaMCPGets)
	t.Logf("over /mcp, median of 5: clipboard_get from Chromium %v", viaMCPGets[2].Round(100*time.Microsecond))

	// Bad input changes nothing.
	if err := c.ClipboardSet(ctx, sb.ID, "a\x00b"); !client.IsInvalidArgument(err) {
		t.Errorf("clipboard_set with NUL: %v, want invalid_argument", err)
	}
	if text, err := c.ClipboardGet(ctx, sb.ID); err != nil || text != viaMCP+more {
		t.Errorf("after a refused clipboard_set the clipboard holds %q (%v), want %q", text, err, viaMCP+more)
	}
}
