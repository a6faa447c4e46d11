package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"image/png"
	"log"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// templateResult is, for one backend, what an agent that types at once
// sees of a create: cold (boot templates off) and from a boot template,
// on daemons of their own in the same run.
type templateResult struct {
	backend string
	// answer is POST /v1/sandboxes until it answers; typed is until
	// the page typed into Chromium's address bar right after shows.
	coldAnswer, coldTyped result
	tplAnswer, tplTyped   result
	first                 time.Duration // the template daemon's first create, which builds it
	err                   error
}

// typedPage is what the bench types into the address bar: a page whose
// colour is seen in a screenshot once Chromium has loaded it.
const typedPage = "data:text/html,<body style='background:%23c0392b'></body>"

// createAndType creates an XFCE desktop on backend and, the moment the
// create answers, types typedPage into Chromium's address bar, then waits
// until a screenshot shows it; it returns both times, from the create's
// start, and destroys the sandbox.
func createAndType(ctx context.Context, c *client.Client, backend string) (answer, typed time.Duration, err error) {
	res := client.Resolution{Width: 1024, Height: 768}
	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{Template: "desktop", Backend: backend, Resolution: &res})
	if err != nil {
		return 0, 0, err
	}
	defer c.Destroy(ctx, sb.ID)
	answer = time.Since(t0)
	for _, step := range []func() error{
		func() error { return c.Key(ctx, sb.ID, "ctrl+l") },
		func() error { return c.Type(ctx, sb.ID, typedPage) },
		func() error { return c.Key(ctx, sb.ID, "Return") },
	} {
		if err := step(); err != nil {
			return 0, 0, err
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		b, err := c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{Format: "png"})
		if err != nil {
			return 0, 0, err
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			return 0, 0, err
		}
		r, g, bl, _ := img.At(512, 500).RGBA()
		if r>>8 > 0xb0 && g>>8 < 0x50 && bl>>8 < 0x50 {
			return answer, time.Since(t0), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, 0, fmt.Errorf("sandbox %s: the page typed into the address bar was not shown in 2 minutes (keys lost?)", sb.ID)
}

// measureTemplate measures n creates each way on backend.
func measureTemplate(ctx context.Context, imageDir, backend string, n int) templateResult {
	tr := templateResult{backend: backend,
		coldAnswer: result{name: "cold create answers " + backend}, coldTyped: result{name: "cold create → typed page " + backend},
		tplAnswer: result{name: "template create answers " + backend}, tplTyped: result{name: "template create → typed page " + backend}}
	each := func(c *client.Client, answer, typed *result) error {
		for i := 0; i < n; i++ {
			a, ty, err := createAndType(ctx, c, backend)
			if err != nil {
				return fmt.Errorf("create %d: %w", i, err)
			}
			answer.samples = append(answer.samples, a)
			typed.samples = append(typed.samples, ty)
			// The next create starts on a machine at rest, as a
			// single agent's would.
			time.Sleep(2 * time.Second)
		}
		return nil
	}
	tr.err = withDaemon(ctx, imageDir, backend, []string{"--boot-templates=false"}, func(_ *harness.Daemon, c *client.Client) error {
		return each(c, &tr.coldAnswer, &tr.coldTyped)
	})
	if tr.err != nil {
		return tr
	}
	tr.err = withDaemon(ctx, imageDir, backend, []string{"--boot-templates=true"}, func(_ *harness.Daemon, c *client.Client) error {
		_, first, err := createAndType(ctx, c, backend)
		if err != nil {
			return fmt.Errorf("first create: %w", err)
		}
		tr.first = first
		time.Sleep(2 * time.Second)
		return each(c, &tr.tplAnswer, &tr.tplTyped)
	})
	if tr.err == nil {
		for _, r := range []result{tr.coldAnswer, tr.coldTyped, tr.tplAnswer, tr.tplTyped} {
			log.Printf("%-40s p50 %8s  p95 %8s", r.name, ms(r.pct(.5)), ms(r.pct(.95)))
		}
	}
	return tr
}

// runTemplate is `bench -only-template`: creates typed into at once, cold
// and from a boot template, written to the template section of out.
func runTemplate(imageDir, out string, backends []string, n int) error {
	defer harness.RemoveBuild()
	var trs []templateResult
	for _, b := range backends {
		trs = append(trs, measureTemplate(context.Background(), imageDir, b, n))
	}
	return harness.ReplaceSection(out, "template", templateReport(trs, n))
}

// templateReport is the boot-template section of BENCHMARKS.md.
func templateReport(trs []templateResult, n int) string {
	var b strings.Builder
	b.WriteString("## Boot templates: create → a page typed at once shown (`go run ./test/bench -only-template`, " + time.Now().UTC().Format("2006-01-02") + ")\n\n")
	fmt.Fprintf(&b, "An agent's first step: POST /v1/sandboxes of a 1024×768 XFCE desktop (`desktop`), and the moment it answers, ctrl+L, the URL of a red page typed into Chromium's address bar, Enter; then screenshots until the page shows. %d creates each way, one at a time with the machine at rest between them, each destroyed after: cold on a daemon with `--boot-templates=false` (a create answers once the desktop is usable: XFCE's panel and desktop up and Chromium focused), then on a daemon of its own with boot templates, after its first create (which boots the template and snapshots it, and is shown apart). Target on gvisor (issue 26): from a template, p50 ≤ 1.5 s.\n\n", n)
	b.WriteString("| backend | cold: answers p50 | cold: typed page shown p50 | p95 | template: answers p50 | template: typed page shown p50 | p95 | cold ÷ template (typed, p50) | target | first create (builds the template) |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, tr := range trs {
		if tr.err != nil {
			fmt.Fprintf(&b, "| %s | failed: %v |||||||||\n", tr.backend, tr.err)
			continue
		}
		target := "—"
		if tr.backend == "gvisor" {
			verdict := "met"
			if tr.tplTyped.pct(.5) > 1500*time.Millisecond {
				verdict = "not met"
			}
			target = "1.5 s (" + verdict + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %.1f× | %s | %s |\n", tr.backend,
			ms(tr.coldAnswer.pct(.5)), ms(tr.coldTyped.pct(.5)), ms(tr.coldTyped.pct(.95)),
			ms(tr.tplAnswer.pct(.5)), ms(tr.tplTyped.pct(.5)), ms(tr.tplTyped.pct(.95)),
			float64(tr.coldTyped.pct(.5))/float64(tr.tplTyped.pct(.5)), target, ms(tr.first))
	}
	b.WriteString("\nA template is a snapshot of a desktop booted with nobody's session and saved once its screen was quiet; a create from it is a restore, the re-key a fork gets, and the create's session (its environment, its start URL navigated to). Cold, the typed keys are not lost either (the create waits for the usable desktop), but the desktop takes seconds to get there.\n")
	return b.String()
}

// isFlagSet reports whether the command line set flag name.
func isFlagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
