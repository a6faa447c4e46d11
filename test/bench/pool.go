package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// poolResult is create-to-ready of one backend's desktops cold and from a
// warm pool, measured in the same run.
type poolResult struct {
	backend   string
	size      int
	cold      result
	pooled    result // each create with the pool full
	burst     result // creates back to back, the pool refilling meanwhile
	burstHits int
	err       error
}

// measurePool measures n cold creates on a daemon without a pool, then n
// creates on a daemon with a pool of size, each made once the pool is
// full again, then 2×size creates back to back.
func measurePool(ctx context.Context, imageDir, backend string, size, n int) poolResult {
	pr := poolResult{backend: backend, size: size,
		cold: result{name: "create cold " + backend}, pooled: result{name: "create from the pool " + backend},
		burst: result{name: "creates back to back " + backend}}
	res := client.Resolution{Width: 1024, Height: 768}
	create := func(c *client.Client, r *result) error {
		t0 := time.Now()
		sb, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &res})
		if err != nil {
			return err
		}
		r.samples = append(r.samples, time.Since(t0))
		return c.Destroy(ctx, sb.ID)
	}
	pr.err = withDaemon(ctx, imageDir, backend, nil, func(d *harness.Daemon, c *client.Client) error {
		for i := 0; i < n; i++ {
			if err := create(c, &pr.cold); err != nil {
				return fmt.Errorf("cold create %d: %w", i, err)
			}
		}
		return nil
	})
	if pr.err != nil {
		return pr
	}
	pool := fmt.Sprintf("%s/desktop-lite:%dx%d=%d", backend, res.Width, res.Height, size)
	pr.err = withDaemon(ctx, imageDir, backend, []string{"--pool", pool}, func(d *harness.Daemon, c *client.Client) error {
		for i := 0; i < n; i++ {
			if err := waitPoolFull(ctx, c, size); err != nil {
				return err
			}
			hits := poolHits(d)
			if err := create(c, &pr.pooled); err != nil {
				return fmt.Errorf("create %d from the pool: %w", i, err)
			}
			if poolHits(d) != hits+1 {
				return fmt.Errorf("create %d with the pool full was not served by it", i)
			}
		}
		if err := waitPoolFull(ctx, c, size); err != nil {
			return err
		}
		// The burst's sandboxes live until it ends, as an agent
		// fleet's would: the pool empties, and the rest boot cold.
		hits := poolHits(d)
		var ids []string
		defer func() {
			for _, id := range ids {
				c.Destroy(ctx, id)
			}
		}()
		for i := 0; i < 2*size; i++ {
			t0 := time.Now()
			sb, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &res})
			if err != nil {
				return fmt.Errorf("back-to-back create %d: %w", i, err)
			}
			pr.burst.samples = append(pr.burst.samples, time.Since(t0))
			ids = append(ids, sb.ID)
		}
		pr.burstHits = poolHits(d) - hits
		return nil
	})
	if pr.err == nil {
		log.Printf("%s: cold p50 %s p95 %s; from the pool p50 %s p95 %s; back to back %d of %d from the pool, p50 %s p95 %s", backend,
			ms(pr.cold.pct(.5)), ms(pr.cold.pct(.95)), ms(pr.pooled.pct(.5)), ms(pr.pooled.pct(.95)),
			pr.burstHits, len(pr.burst.samples), ms(pr.burst.pct(.5)), ms(pr.burst.pct(.95)))
	}
	return pr
}

// withDaemon runs f against a daemon of its own, with extra flags.
func withDaemon(ctx context.Context, imageDir, backend string, args []string, f func(*harness.Daemon, *client.Client) error) error {
	dataDir, err := os.MkdirTemp("", "cubicle-bench-pool-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	d, err := harness.Start(ctx, harness.Options{DataDir: dataDir, ImageDir: imageDir, DefaultBackend: backend, Args: args})
	if err != nil {
		return err
	}
	defer d.Stop()
	return f(d, client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(5*time.Minute)))
}

// waitPoolFull waits until the daemon's pool has size desktops booted,
// and a second more, so that the last boot's own work is over.
func waitPoolFull(ctx context.Context, c *client.Client, size int) error {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if len(info.Pools) == 1 && info.Pools[0].Ready >= size {
			time.Sleep(time.Second)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the pool did not fill in 3 minutes")
}

var poolHitRE = regexp.MustCompile(`(?m)^cubicle_pool_claims_total\{[^}]*result="hit"[^}]*\} ([0-9.e+]+)$`)

// poolHits is the daemon's cubicle_pool_claims_total of hits (-1 if it
// cannot be read).
func poolHits(d *harness.Daemon) int {
	req, _ := http.NewRequest("GET", d.URL+"/metrics", nil)
	req.Header.Set("X-API-Key", d.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0
	for _, m := range poolHitRE.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		n += int(v)
	}
	return n
}

// runPool is `bench -only-pool`: cold and pooled create-to-ready of
// backend in one run, written to the pool section of out.
func runPool(imageDir, backend, out string, n int) error {
	defer harness.RemoveBuild()
	pr := measurePool(context.Background(), imageDir, backend, 4, n)
	return harness.ReplaceSection(out, "pool", poolReport(pr))
}

// poolReport is the warm-pool section of BENCHMARKS.md.
func poolReport(pr poolResult) string {
	var b strings.Builder
	b.WriteString("## Warm pool (make bench; bench -only-pool)\n\n")
	fmt.Fprintf(&b, "Create-to-ready of a 1024×768 desktop on %s through the REST API (POST /v1/sandboxes until it answers running), each sandbox destroyed right after: cold, on a daemon without a pool, then from a pool of %d (`--pool %s/desktop-lite:1024x768=%d`) on a daemon of its own, each create made once the pool was full again. A claim gives a booted box the create's token, environment and start URL (the agent's ApplySession) and starts its browser; a boot is not part of it. Anchor: E2B's published create of about 150 ms.\n\n", pr.backend, pr.size, pr.backend, pr.size)
	if pr.err != nil {
		fmt.Fprintf(&b, "Failed: %v\n", pr.err)
		return b.String()
	}
	b.WriteString("| backend | creates | cold p50 | cold p95 | from the pool p50 | from the pool p95 | cold ÷ pool (p50) | pool ÷ E2B's ~150 ms |\n|---|---|---|---|---|---|---|---|\n")
	cold, pool := pr.cold.pct(.5), pr.pooled.pct(.5)
	fmt.Fprintf(&b, "| %s | %d + %d | %s | %s | %s | %s | %.0f× | %.2f× |\n", pr.backend, len(pr.cold.samples), len(pr.pooled.samples),
		ms(cold), ms(pr.cold.pct(.95)), ms(pool), ms(pr.pooled.pct(.95)),
		float64(cold)/float64(pool), float64(pool)/float64(150*time.Millisecond))
	fmt.Fprintf(&b, "\nBack to back, %d creates with no wait, each sandbox kept until the last was made (the pool refilling one boot at a time meanwhile): %d were served by the pool; all of them p50 %s, p95 %s. A create that finds the pool empty boots cold, as it would without one.\n",
		len(pr.burst.samples), pr.burstHits, ms(pr.burst.pct(.5)), ms(pr.burst.pct(.95)))
	return b.String()
}
