package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// pauseResult is one backend's pause and resume figures: each on the
// same desktop, Chromium on the busy page, its memory in use.
type pauseResult struct {
	backend       string
	pause, resume result
	bytes         []int64
	err           error
}

// measurePauses measures every backend of cc that can pause here.
func measurePauses(ctx context.Context, c *client.Client, res client.Resolution, cc createConfig) []pauseResult {
	var prs []pauseResult
	info, err := c.Info(ctx)
	if err != nil || cc.nPause <= 0 {
		return nil
	}
	for _, b := range info.Backends {
		if b.Capabilities.Pause && slices.Contains(cc.backends, b.Name) {
			prs = append(prs, measurePause(ctx, c, b.Name, res, cc.nPause))
		}
	}
	return prs
}

// runPause is `bench -only-pause`: cold create and pause/resume of the
// backends that pause, in one run, written to the pause section of out.
func runPause(imageDir, backend, out string, cc createConfig) error {
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
	res := client.Resolution{Width: 1024, Height: 768}
	prs := measurePauses(ctx, c, res, cc)
	var brs []backendResult
	for _, pr := range prs {
		brs = append(brs, measureCreate(ctx, c, pr.backend, res, cc))
	}
	return harness.ReplaceSection(out, "pause", pauseReport(prs, brs))
}

// measurePause pauses and resumes one desktop of backend n times.
func measurePause(ctx context.Context, c *client.Client, backend string, res client.Resolution, n int) pauseResult {
	pr := pauseResult{backend: backend, pause: result{name: "pause " + backend}, resume: result{name: "resume " + backend}}
	req := client.CreateRequest{Backend: backend, Resolution: &res}
	sb, err := c.Create(ctx, req)
	if err != nil {
		pr.err = err
		return pr
	}
	defer c.Destroy(ctx, sb.ID)
	time.Sleep(20 * time.Second) // Chromium starts after ready
	if err := openBusyPage(ctx, c, sb.ID); err != nil {
		pr.err = err
		return pr
	}
	time.Sleep(5 * time.Second)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		p, err := c.Pause(ctx, sb.ID)
		if err != nil {
			pr.err = fmt.Errorf("pause %d: %w", i, err)
			return pr
		}
		pr.pause.samples = append(pr.pause.samples, time.Since(t0))
		pr.bytes = append(pr.bytes, p.PausedBytes)
		t0 = time.Now()
		if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
			pr.err = fmt.Errorf("resume %d: %w", i, err)
			return pr
		}
		pr.resume.samples = append(pr.resume.samples, time.Since(t0))
		// The desktop answers at once: a screenshot right after resume.
		if _, err := c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{}); err != nil {
			pr.err = fmt.Errorf("screenshot after resume %d: %w", i, err)
			return pr
		}
	}
	log.Printf("%s: pause p50 %s p95 %s; resume p50 %s p95 %s; paused %d MiB", backend,
		ms(pr.pause.pct(.5)), ms(pr.pause.pct(.95)), ms(pr.resume.pct(.5)), ms(pr.resume.pct(.95)), medianBytes(pr.bytes)>>20)
	return pr
}

func medianBytes(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// pauseReport is the pause section of BENCHMARKS.md: pause, resume and
// the paused size per backend, resume against the same backend's cold
// create in the same run and against the published anchors.
func pauseReport(prs []pauseResult, brs []backendResult) string {
	var b strings.Builder
	b.WriteString("## Pause and resume (make bench; bench -only-pause)\n\n")
	b.WriteString("One desktop per backend (1024×768, Chromium on the busy page), paused and resumed through the REST API; a screenshot after each resume. A paused sandbox holds no process and no memory: only the files below. Anchors: E2B's published resume of about 1 s; Firecracker's documented snapshot load of about 3 ms (KVM, memory mapped from the file; not measurable here).\n\n")
	b.WriteString("| backend | cycles | pause p50 | pause p95 | resume p50 | resume p95 | paused size (median) | cold create p50, same run | resume vs cold create | vs E2B's ~1 s resume |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, pr := range prs {
		if pr.err != nil {
			fmt.Fprintf(&b, "| %s | — | failed: %v |||||||\n", pr.backend, pr.err)
			continue
		}
		cold := time.Duration(0)
		for _, br := range brs {
			if br.name == pr.backend && br.err == nil {
				cold = br.create.pct(.5)
			}
		}
		ratio := "—"
		if cold > 0 {
			ratio = fmt.Sprintf("%.1f× faster", float64(cold)/float64(pr.resume.pct(.5)))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %d MiB | %s | %s | %.1f× |\n", pr.backend, len(pr.pause.samples),
			ms(pr.pause.pct(.5)), ms(pr.pause.pct(.95)), ms(pr.resume.pct(.5)), ms(pr.resume.pct(.95)),
			medianBytes(pr.bytes)>>20, ms(cold), ratio, float64(pr.resume.pct(.5))/float64(time.Second))
	}
	b.WriteString("\nqemu runs under TCG here (no usable KVM): its guest has 1 GiB and its memory image is what the guest touched. gVisor's checkpoint is of the sandbox kernel's state, compressed. runc cannot pause (CRIU is not driven yet).\n")
	return b.String()
}
