package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// The old-against-new runsc figures (issue 26): the same operations on
// the gvisor backend, first as cubicle ran it before the pin — Debian 12's
// runsc (0.0~20221219), driven by the last commit before the pin, with
// that commit's images — then as it runs now, on the pinned runsc. The
// old daemon cannot be this commit's: it refuses a runsc older than
// oci.MinRunscDate, and passes flags the old runsc does not know. So the
// comparison is of the two products, runtime and all, which is what a user
// upgrading meets; both run cold creates (no boot template, no warm pool)
// so that a create is the same work on both.

// runscSide is one daemon's figures.
type runscSide struct {
	label, version     string
	create, usable     result
	click, shot        result
	pause, resume      result
	pausedBytes        []int64
	pss                int64
	err                error
	pauseErr, shotsErr error
}

// measureRunscSide starts a daemon (from bin, or this commit's when ""),
// and measures on its gvisor backend: n cold creates, then on one desktop
// with Chromium on the busy page nOps clicks and screenshots, its memory,
// and nPause pause/resume cycles.
func measureRunscSide(ctx context.Context, label, bin, imageDir string, args []string, n, nOps, nPause int) runscSide {
	s := runscSide{label: label, create: result{name: "create " + label}, usable: result{name: "usable " + label}}
	dataDir, err := os.MkdirTemp("", "cubicle-bench-runsc-")
	if err != nil {
		s.err = err
		return s
	}
	defer os.RemoveAll(dataDir)
	d, err := harness.Start(ctx, harness.Options{Bin: bin, DataDir: dataDir, ImageDir: imageDir, DefaultBackend: "gvisor",
		DefaultTemplate: "desktop", Args: args})
	if err != nil {
		s.err = err
		return s
	}
	defer d.Stop()
	c := client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(5*time.Minute))
	if info, err := c.Info(ctx); err == nil {
		for _, b := range info.Backends {
			if b.Name == "gvisor" && b.Runtime != nil {
				s.version = b.Runtime.Version
			}
		}
	}
	if s.version == "" { // a daemon from before /v1/info named it: the runsc it finds on PATH
		if out, err := exec.Command("runsc", "--version").Output(); err == nil { //depcheck:runs runsc
			first, _, _ := strings.Cut(string(out), "\n")
			s.version = strings.TrimPrefix(strings.TrimSpace(first), "runsc version ")
		}
	}
	res := client.Resolution{Width: 1024, Height: 768}
	for k := 0; k < n; k++ {
		t0 := time.Now()
		sb, err := c.Create(ctx, client.CreateRequest{Backend: "gvisor", Resolution: &res})
		if err != nil {
			s.err = fmt.Errorf("create %d: %w", k, err)
			return s
		}
		s.create.samples = append(s.create.samples, time.Since(t0))
		if err := waitUsable(ctx, c, sb.ID); err != nil {
			s.err = fmt.Errorf("create %d: %w", k, err)
			return s
		}
		s.usable.samples = append(s.usable.samples, time.Since(t0))
		if err := c.Destroy(ctx, sb.ID); err != nil {
			s.err = err
			return s
		}
	}
	log.Printf("%s: create answered p50 %s, usable p50 %s", label, ms(s.create.pct(.5)), ms(s.usable.pct(.5)))

	sb, err := c.Create(ctx, client.CreateRequest{Backend: "gvisor", Resolution: &res})
	if err != nil {
		s.err = err
		return s
	}
	defer c.Destroy(context.WithoutCancel(ctx), sb.ID)
	time.Sleep(20 * time.Second) // Chromium starts after ready (on the old runtime, XFCE too)
	if err := openBusyPage(ctx, c, sb.ID); err != nil {
		s.err = err
		return s
	}
	time.Sleep(10 * time.Second)
	for i := 0; i < 10; i++ { // warm the path
		c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{})
		c.Move(ctx, sb.ID, 10, 10)
	}
	i := 0
	if s.click, err = measure("click "+label, nOps, func() error {
		i++
		return c.Click(ctx, sb.ID, 200+i%50, 700)
	}); err != nil {
		s.shotsErr = err
	}
	if s.shot, err = measure("screenshot png "+label, nOps, func() error {
		_, err := c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{Format: "png"})
		return err
	}); err != nil {
		s.shotsErr = err
	}
	s.pss = sandboxPSS(sb.ID)
	s.pause, s.resume = result{name: "pause " + label}, result{name: "resume " + label}
	for k := 0; k < nPause; k++ {
		t0 := time.Now()
		p, err := c.Pause(ctx, sb.ID)
		if err != nil {
			s.pauseErr = fmt.Errorf("pause %d: %w", k, err)
			break
		}
		s.pause.samples = append(s.pause.samples, time.Since(t0))
		s.pausedBytes = append(s.pausedBytes, p.PausedBytes)
		t0 = time.Now()
		if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
			s.pauseErr = fmt.Errorf("resume %d: %w", k, err)
			break
		}
		s.resume.samples = append(s.resume.samples, time.Since(t0))
		if _, err := c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{}); err != nil {
			s.pauseErr = fmt.Errorf("screenshot after resume %d: %w", k, err)
			break
		}
	}
	log.Printf("%s: pause p50 %s resume p50 %s paused %d MiB; PSS %d MiB (%v)", label, ms(s.pause.pct(.5)), ms(s.resume.pct(.5)),
		medianBytes(s.pausedBytes)>>20, s.pss>>20, s.pauseErr)
	return s
}

// waitUsable polls the window list of sandbox id until the XFCE desktop
// is complete — its panel and desktop up and Chromium focused, as the
// desktop image's session.json defines usable — which the old daemon's
// create did not wait for (its "ready" was a screenshot answering).
func waitUsable(ctx context.Context, c *client.Client, id string) error {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ws, err := c.Windows(ctx, id)
		if err != nil {
			continue // the desktop may not answer yet
		}
		var panel, desk, browser bool
		for _, w := range ws {
			switch strings.ToLower(w.Class) {
			case "xfce4-panel":
				panel = true
			case "xfdesktop":
				desk = true
			case "chromium":
				browser = browser || w.Focused
			}
		}
		if panel && desk && browser {
			return nil
		}
	}
	return fmt.Errorf("sandbox %s: not usable (panel, desktop, Chromium focused) in 2 minutes", id)
}

// runRunsc is `bench -only-runsc`: old against new in one run, written
// to the runsc section of out.
func runRunsc(imageDir, oldBin, oldImageDir, out string, n, nOps, nPause int) error {
	defer harness.RemoveBuild()
	if oldBin == "" || oldImageDir == "" {
		return fmt.Errorf("-only-runsc needs -old-bin and -old-image-dir (scripts/bench-old.sh builds them)")
	}
	ctx := context.Background()
	old := measureRunscSide(ctx, "old", oldBin, oldImageDir, nil, n, nOps, nPause)
	cur := measureRunscSide(ctx, "new", "", imageDir, []string{"--boot-templates=false"}, n, nOps, nPause)
	return harness.ReplaceSection(out, "runsc", runscReport(old, cur, n, nOps, nPause))
}

// runscReport is the runsc section of BENCHMARKS.md.
func runscReport(old, cur runscSide, n, nOps, nPause int) string {
	var b strings.Builder
	b.WriteString("## Old runsc against new (make bench-runsc; bench -only-runsc)\n\n")
	fmt.Fprintf(&b, "The gvisor backend, one run: first cubicle as it was before the pin (the last commit before it, its images, Debian 12's runsc `%s`), then this commit on the pinned runsc `%s`. Both create cold (no boot template, no warm pool). %d creates each; then on one XFCE desktop (1024×768, Chromium on the busy page) %d clicks, %d PNG screenshots, its host memory (PSS of the sandbox's host processes) and %d pause/resume cycles.\n\n",
		orDash(old.version), orDash(cur.version), n, nOps, nOps, nPause)
	b.WriteString("| | old: Debian's runsc | new: pinned runsc | new ÷ old |\n|---|---|---|---|\n")
	row := func(name string, o, c result, p float64) {
		ov, cv := o.pct(p), c.pct(p)
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, durOrDash(ov, len(o.samples)), durOrDash(cv, len(c.samples)), ratio(float64(cv), float64(ov), len(o.samples) > 0 && len(c.samples) > 0))
	}
	row("create answered p50 (old: a screenshot answers; new: usable)", old.create, cur.create, .5)
	row("create → usable p50 (panel, desktop, Chromium focused; polled)", old.usable, cur.usable, .5)
	row("click p50", old.click, cur.click, .5)
	row("click p95", old.click, cur.click, .95)
	row("screenshot PNG p50 (screen unchanged)", old.shot, cur.shot, .5)
	row("screenshot PNG p95 (screen unchanged)", old.shot, cur.shot, .95)
	row("pause p50", old.pause, cur.pause, .5)
	row("resume p50", old.resume, cur.resume, .5)
	ob, cb := medianBytes(old.pausedBytes), medianBytes(cur.pausedBytes)
	fmt.Fprintf(&b, "| paused size (median) | %s | %s | %s |\n", mibOrDash(ob), mibOrDash(cb), ratio(float64(cb), float64(ob), ob > 0 && cb > 0))
	fmt.Fprintf(&b, "| desktop memory (PSS) | %s | %s | %s |\n", mibOrDash(old.pss), mibOrDash(cur.pss), ratio(float64(cur.pss), float64(old.pss), old.pss > 0 && cur.pss > 0))
	b.WriteString("\nThe old runsc compressed its checkpoint image (flate); the pinned one writes it uncompressed (the pinned runsc's default), hence the larger paused size. The old daemon's create answered once a screenshot worked, before XFCE and Chromium were up; the new one answers once the desktop is usable, so the polled \"usable\" row is the like-for-like one.\n")
	for _, s := range []runscSide{old, cur} {
		for _, err := range []error{s.err, s.shotsErr, s.pauseErr} {
			if err != nil {
				fmt.Fprintf(&b, "\n%s: %v\n", s.label, err)
			}
		}
	}
	b.WriteString("\n")
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func durOrDash(d time.Duration, n int) string {
	if n == 0 {
		return "—"
	}
	return ms(d)
}

func mibOrDash(n int64) string {
	if n <= 0 {
		return "—"
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

func ratio(a, b float64, ok bool) string {
	if !ok || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}
