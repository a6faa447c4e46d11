package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/test/harness"
)

// e2bKey is an API key in E2B's format, which the E2B SDKs insist on.
func e2bKey() string {
	b := make([]byte, 20)
	rand.Read(b)
	return "e2b_" + hex.EncodeToString(b)
}

// measureE2B runs test/e2b-js/bench.mjs (the unmodified @e2b/desktop SDK)
// against sandbox id and returns its screenshot() and leftClick() samples.
func measureE2B(ctx context.Context, d *harness.Daemon, id string, n int) ([]result, error) {
	dir := filepath.Join(harness.RepoRoot(), "test", "e2b-js")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@e2b", "desktop")); err != nil {
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("npm ci: %v: %s", err, out)
		}
	}
	cmd := exec.CommandContext(ctx, "node", "bench.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+d.URL, "E2B_SANDBOX_URL="+d.URL, "E2B_API_KEY="+d.APIKey,
		"CUBICLE_BENCH_SANDBOX="+id, "CUBICLE_BENCH_N="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("node bench.mjs: %w", err)
	}
	var samples map[string][]float64
	if err := json.Unmarshal(out, &samples); err != nil {
		return nil, fmt.Errorf("bench.mjs output %q: %w", strings.TrimSpace(string(out)), err)
	}
	var rs []result
	for _, name := range []string{"screenshot", "leftClick"} {
		r := result{name: "@e2b/desktop " + name + "()"}
		for _, ms := range samples[name] {
			r.samples = append(r.samples, time.Duration(ms*float64(time.Millisecond)))
		}
		log.Printf("%-40s p50 %8s  p95 %8s", r.name, ms(r.pct(.5)), ms(r.pct(.95)))
		rs = append(rs, r)
	}
	return rs, nil
}
