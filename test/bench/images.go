package main

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// imageResult is one image on one backend: create-to-ready, the time
// until its whole session shows (Chromium's window, and for XFCE its
// panel, in the window list), and idle memory.
type imageResult struct {
	backend, template string
	create, session   result
	pss               int64
	err               error
}

// runImages is `bench -only-images`: the XFCE desktop image against the
// openbox desktop-lite, created alternately on each backend by one daemon,
// written to the images section of out.
func runImages(imageDir, out string, backends []string, n int) error {
	defer harness.RemoveBuild()
	ctx := context.Background()
	var rs []imageResult
	for _, backend := range backends {
		lite := imageResult{backend: backend, template: "desktop-lite"}
		xfce := imageResult{backend: backend, template: "desktop"}
		err := withDaemon(ctx, imageDir, backend, nil, func(d *harness.Daemon, c *client.Client) error {
			for i := 0; i < n; i++ {
				// Alternate, so a machine that slows down during
				// the run slows both alike.
				for _, r := range []*imageResult{&lite, &xfce} {
					if err := measureImage(ctx, c, r, i == 0); err != nil {
						return fmt.Errorf("%s on %s, create %d: %w", r.template, backend, i, err)
					}
				}
			}
			return nil
		})
		if err != nil {
			log.Printf("images on %s: %v", backend, err)
			lite.err, xfce.err = err, err
		}
		rs = append(rs, lite, xfce)
	}
	return harness.ReplaceSection(out, "images", imagesReport(rs, n))
}

// measureImage creates one sandbox of r's image, times it, and on the
// first one reads its memory 20 s after its session showed.
func measureImage(ctx context.Context, c *client.Client, r *imageResult, first bool) error {
	res := client.Resolution{Width: 1024, Height: 768}
	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{Backend: r.backend, Template: r.template, Resolution: &res})
	if err != nil {
		return err
	}
	defer c.Destroy(ctx, sb.ID)
	r.create.samples = append(r.create.samples, time.Since(t0))
	want := []string{"chromium"}
	if r.template == "desktop" {
		want = append(want, "xfce4-panel")
	}
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the session did not show %v in 90 s", want)
		}
		ws, err := c.Windows(ctx, sb.ID)
		if err != nil {
			return err
		}
		found := 0
		for _, w := range want {
			for _, win := range ws {
				if strings.EqualFold(win.Class, w) {
					found++
					break
				}
			}
		}
		if found == len(want) {
			break
		}
	}
	r.session.samples = append(r.session.samples, time.Since(t0))
	if first {
		time.Sleep(20 * time.Second)
		r.pss = sandboxPSS(sb.ID)
	}
	return nil
}

// imagesReport is the images section of BENCHMARKS.md.
func imagesReport(rs []imageResult, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Images: desktop (XFCE) against desktop-lite (openbox) (`go run ./test/bench -only-images`, %s)\n\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "%d sandboxes of each image per backend, 1024×768, created alternately by one daemon, each destroyed before the next. Ready is POST /v1/sandboxes until the desktop answers a screenshot; session is until the window list shows Chromium (and, for XFCE, its panel). Idle memory is the PSS of the sandbox's host processes 20 s after the first one's session showed, Chromium on about:blank. qemu is left out: under TCG a create takes tens of seconds either way (see above).\n\n", n)
	b.WriteString("| backend | image | ready p50 | ready p95 | session p50 | session p95 | idle memory |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.err != nil {
			fmt.Fprintf(&b, "| %s | %s | failed: %v | | | | |\n", r.backend, r.template, r.err)
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %d MiB |\n", r.backend, r.template,
			ms(r.create.pct(.5)), ms(r.create.pct(.95)), ms(r.session.pct(.5)), ms(r.session.pct(.95)), r.pss>>20)
	}
	for i := 0; i+1 < len(rs); i += 2 {
		lite, xfce := rs[i], rs[i+1]
		if lite.err != nil || xfce.err != nil || lite.pss == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s: XFCE costs %+d MiB of memory (%.2f× desktop-lite) and %+.0f ms until its session shows (p50).",
			lite.backend, (xfce.pss-lite.pss)>>20, float64(xfce.pss)/float64(lite.pss),
			float64(xfce.session.pct(.5)-lite.session.pct(.5))/float64(time.Millisecond))
	}
	b.WriteString("\n")
	return b.String()
}
