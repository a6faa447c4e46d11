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
	cannot        string // why the backend cannot pause here ("" when it can)
}

// measurePauses measures every backend of cc that can pause here; the
// pauseResults of those that cannot carry only the reason /v1/info gives.
func measurePauses(ctx context.Context, c *client.Client, res client.Resolution, cc createConfig) []pauseResult {
	var prs []pauseResult
	info, err := c.Info(ctx)
	if err != nil || cc.nPause <= 0 {
		return nil
	}
	for _, b := range info.Backends {
		switch {
		case !slices.Contains(cc.backends, b.Name) || !b.Available:
		case b.Capabilities.Pause:
			prs = append(prs, measurePause(ctx, c, b.Name, res, cc.nPause))
		default:
			prs = append(prs, pauseResult{backend: b.Name, cannot: b.Capabilities.PauseReason})
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
		if pr.cannot == "" {
			brs = append(brs, measureCreate(ctx, c, pr.backend, res, cc))
		}
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
	b.WriteString("| backend | cycles | pause p50 | pause p95 | resume p50 | resume p95 | paused size (median) | cold create p50 (creates), same run | resume vs cold create | resume ÷ E2B's ~1 s |\n|---|---|---|---|---|---|---|---|---|---|\n")
	var cannot []string
	for _, pr := range prs {
		if pr.cannot != "" {
			r := strings.TrimSuffix(pr.cannot, ".")
			cannot = append(cannot, strings.ToUpper(r[:1])+r[1:])
			continue
		}
		if pr.err != nil {
			fmt.Fprintf(&b, "| %s | — | failed: %v |||||||\n", pr.backend, pr.err)
			continue
		}
		cold, creates := time.Duration(0), 0
		for _, br := range brs {
			if br.name == pr.backend && br.err == nil {
				cold, creates = br.create.pct(.5), len(br.create.samples)
			}
		}
		ratio := "—"
		if r := pr.resume.pct(.5); cold > 0 && cold >= r {
			ratio = fmt.Sprintf("%.1f× faster", float64(cold)/float64(r))
		} else if cold > 0 {
			ratio = fmt.Sprintf("%.1f× slower", float64(r)/float64(cold))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %d MiB | %s (%d) | %s | %.1f× |\n", pr.backend, len(pr.pause.samples),
			ms(pr.pause.pct(.5)), ms(pr.pause.pct(.95)), ms(pr.resume.pct(.5)), ms(pr.resume.pct(.95)),
			medianBytes(pr.bytes)>>20, ms(cold), creates, ratio, float64(pr.resume.pct(.5))/float64(time.Second))
	}
	b.WriteString("\nqemu runs under TCG here (no usable KVM): its guest has 1 GiB and its memory image is what the guest touched. gVisor's checkpoint is of the sandbox kernel's whole state, compressed: its resume takes longer than a cold create takes to be ready, and gives back the page, the processes and their memory as they were. firecracker pauses with its snapshot API, which needs KVM: not measurable here.")
	for _, c := range cannot {
		b.WriteString(" " + c + ".")
	}
	b.WriteString("\n")
	return b.String()
}
