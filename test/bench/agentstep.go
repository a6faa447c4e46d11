package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// agentStepSettleMS is the quiet period the one-round-trip step asks its
// screenshot to wait for: shorter than Chromium's caret blink (530 ms),
// longer than the gaps between the frames of one repaint.
const agentStepSettleMS = 200

// shotSize is one screenshot size and format a model is shown.
type shotSize struct {
	name    string
	width   int // 0: the screen's
	format  string
	bytes   int
	latency result
}

// runAgentStep measures an agent's step — act, then look — on one
// 1920×1080 sandbox of backend with the busy page open, three ways in the
// same run: the act and a settled screenshot in one call of the Anthropic
// endpoint; an actions call and then a screenshot call, at once; and the
// reference demo's way, the act, a fixed 2 s sleep, and a screenshot. The
// act scrolls the page, so every look has a new screen to encode. It also
// measures the bytes and time of a screenshot at the sizes models are
// shown, and rewrites the agent-step section of out.
func runAgentStep(imageDir, backend, out string, n int) error {
	defer harness.RemoveBuild()
	ctx := context.Background()
	dataDir, err := os.MkdirTemp("", "cubicle-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	d, err := harness.Start(ctx, harness.Options{DataDir: dataDir, ImageDir: imageDir, DefaultBackend: backend})
	if err != nil {
		return err
	}
	defer d.Stop()
	c := client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(5*time.Minute))
	sb, err := c.Create(ctx, client.CreateRequest{Resolution: &client.Resolution{Width: 1920, Height: 1080}})
	if err != nil {
		return err
	}
	defer c.Destroy(ctx, sb.ID)
	id := sb.ID
	if err := openBusyPage(ctx, c, id); err != nil {
		return err
	}
	settle := settler(d)
	if err := settle(id); err != nil {
		return err
	}

	i := 0
	dir := func() string { i++; return []string{"down", "up"}[i%2] }
	anthropicBytes := 0
	steps := []struct {
		name string
		step func() error
	}{
		{"act + settled screenshot, one call (Anthropic endpoint, 1365×768 picture)", func() error {
			raw, err := c.ComputerAnthropic(ctx, id, map[string]any{
				"input": map[string]any{"action": "scroll", "coordinate": []int{600, 400}, "scroll_direction": dir(), "scroll_amount": 3},
				"image": map[string]any{"settle_ms": agentStepSettleMS},
			})
			if err != nil {
				return err
			}
			var r struct {
				Content []struct {
					Source struct{ Data string } `json:"source"`
				} `json:"content"`
			}
			if err := json.Unmarshal(raw, &r); err != nil || len(r.Content) != 1 {
				return fmt.Errorf("tool_result %.200s: %v", raw, err)
			}
			anthropicBytes = base64.StdEncoding.DecodedLen(len(r.Content[0].Source.Data))
			return nil
		}},
		{"act + settled screenshot, one call (native actions, full screen)", func() error {
			_, err := c.Actions(ctx, id, client.Action{Type: "scroll", X: ptr(1100), Y: ptr(700), Direction: dir(), Amount: 3},
				client.Action{Type: "screenshot", SettleMS: agentStepSettleMS})
			return err
		}},
		{"act, then screenshot: two calls, no wait", func() error {
			if err := c.Scroll(ctx, id, dir(), 3); err != nil {
				return err
			}
			_, err := c.Screenshot(ctx, id, client.ScreenshotOptions{})
			return err
		}},
		{"act, fixed 2 s sleep, screenshot (the reference demo's way)", func() error {
			if err := c.Scroll(ctx, id, dir(), 3); err != nil {
				return err
			}
			time.Sleep(2 * time.Second)
			_, err := c.Screenshot(ctx, id, client.ScreenshotOptions{})
			return err
		}},
	}
	var rs []result
	for _, s := range steps {
		r, err := measureTimed(s.name, n, func() (time.Duration, error) {
			// Each step starts from a still screen, as an agent's does
			// after the model has thought; the wait is not timed.
			if err := settle(id); err != nil {
				return 0, err
			}
			t0 := time.Now()
			err := s.step()
			return time.Since(t0), err
		})
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}

	sizes := []shotSize{
		{name: "XGA fit (1024×576)", width: 1024, format: "png"},
		{name: "XGA fit (1024×576)", width: 1024, format: "jpeg"},
		{name: "WXGA fit (1280×720)", width: 1280, format: "png"},
		{name: "FWXGA (1365×768)", width: 1365, format: "png"},
		{name: "FWXGA (1365×768)", width: 1365, format: "jpeg"},
		{name: "full screen (1920×1080)", format: "png"},
		{name: "full screen (1920×1080)", format: "jpeg"},
	}
	for k := range sizes {
		s := &sizes[k]
		s.latency, err = measureTimed(s.name+" "+s.format, n/2, func() (time.Duration, error) {
			// A changed screen, so that the shot is encoded anew.
			if err := c.Scroll(ctx, id, dir(), 3); err != nil {
				return 0, err
			}
			if err := settle(id); err != nil {
				return 0, err
			}
			t0 := time.Now()
			b, err := c.Screenshot(ctx, id, client.ScreenshotOptions{Format: s.format, Width: s.width})
			s.bytes = len(b)
			return time.Since(t0), err
		})
		if err != nil {
			return err
		}
	}
	return harness.ReplaceSection(out, "agent-step", agentStepReport(backend, rs, anthropicBytes, sizes, n))
}

func ptr(v int) *int { return &v }

// agentStepReport is the agent-step section of BENCHMARKS.md.
func agentStepReport(backend string, rs []result, anthropicBytes int, sizes []shotSize, n int) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## Agent step: act, then look (`go run ./test/bench -only-agent-step`, or with the screenshots above in one run `-only-computer`, %s)\n\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "Machine: %s. Backend: `%s`, one sandbox at 1920×1080 with the busy page open in Chromium, through the REST API on loopback, all rows in the same run, %d steps each. The act scrolls the page 3 clicks (down and up in turns), so every look encodes a new screen; each step starts from a still screen (the wait for it is not timed). \"Settled\": the screenshot waits until the screen has had no X damage for %d ms.\n\n",
		machine(), backend, n, agentStepSettleMS)
	fmt.Fprintf(&b, "| step | p50 | p95 | fixed-sleep p50 / this p50 |\n|---|---|---|---|\n")
	var fixed time.Duration
	for _, r := range rs {
		if r.name == "act, fixed 2 s sleep, screenshot (the reference demo's way)" {
			fixed = r.pct(.5)
		}
	}
	for _, r := range rs {
		p50, p95 := r.pct(.5), r.pct(.95)
		ratio := ""
		if fixed > 0 && p50 > 0 {
			ratio = fmt.Sprintf("%.1f×", float64(fixed)/float64(p50))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.name, ms(p50), ms(p95), ratio)
	}
	fmt.Fprintf(&b, "\nThe two calls with no wait are fast but may look before the page has repainted: the settled screenshot is the one that shows the act's result. The Anthropic endpoint's picture was %d KiB.\n\n", anthropicBytes>>10)
	fmt.Fprintf(&b, "Screenshots at the sizes models are shown (the same busy page, after a change; %d each):\n\n| size | format | bytes | p50 | p95 |\n|---|---|---|---|---|\n", n/2)
	for _, s := range sizes {
		fmt.Fprintf(&b, "| %s | %s | %d KiB | %s | %s |\n", s.name, s.format, s.bytes>>10, ms(s.latency.pct(.5)), ms(s.latency.pct(.95)))
	}
	return b.String()
}
