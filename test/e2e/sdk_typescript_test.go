package e2e

import (
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// skippedLine is the summary line of node's spec reporter that counts
// skipped tests.
var skippedLine = regexp.MustCompile(`(?m)^ℹ skipped (\d+)$`)

// TestTypeScriptSDK builds the TypeScript SDK in sdk/typescript (npm ci
// with its pinned typescript, then tsc) and runs its node --test suite
// against a real cubicled on gvisor (or the backend CUBICLE_E2E_BACKEND
// names), which it finds through CUBICLE_URL and CUBICLE_API_KEY only, as
// the SDK's users configure it. The suite also runs the SDK's HTTP layer
// against a stand-in server of its own. Afterwards no sandbox the suite
// made may be left running, nor anything of one on the host, and no test
// of the suite may have been skipped.
func TestTypeScriptSDK(t *testing.T) {
	needs.Root(t)
	needs.Command(t, "node", "npm")
	nodeForSDK(t)

	dir := filepath.Join(harness.RepoRoot(), "sdk", "typescript")
	npmCI(t, dir)
	if _, err := runLogged(t, 5*time.Minute, dir, nil, "npm", "run", "build"); err != nil {
		t.Fatalf("npm run build in %s: %v", dir, err)
	}
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testTypeScriptSDK(t, dir, backend)
		})
	}
}

func testTypeScriptSDK(t *testing.T, dir, backend string) {
	// Sampling every second (5 s by default): the suite's metrics test
	// waits for the first sample, which otherwise came 5 to 10 s in.
	d, c := startDaemonArgs(t, backend, "--metrics-interval", "1s")
	env := []string{
		"CUBICLE_URL=" + d.URL,
		"CUBICLE_API_KEY=" + d.APIKey,
		"CUBICLE_SDK_BACKEND=" + backend,
		"NO_COLOR=1",
	}
	start := time.Now()
	out, err := runLogged(t, 5*time.Minute, dir, env,
		"node", "--test", "--test-reporter=spec", "--test-concurrency=1", "test/")
	t.Logf("node --test took %v", time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		t.Errorf("node --test: %v", err)
	}
	if m := skippedLine.FindStringSubmatch(out); m == nil {
		t.Error("node --test printed no summary of skipped tests")
	} else if n, _ := strconv.Atoi(m[1]); n != 0 {
		t.Errorf("node --test skipped %d tests; with a daemon given, none may be", n)
	}

	assertSuiteLeftNothing(t, d, c, "SDK suite")
}
