package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestPythonSDK runs the Python SDK's unittest suite (sdk/python/tests)
// against a real cubicled on gvisor (or the backends CUBICLE_E2E_BACKEND
// names). The SDK is installed the way its users install it, with pip,
// into a fresh venv of Debian's python3 that sees the system's setuptools
// (--system-site-packages) and never reaches the network (--no-index,
// --no-build-isolation); the suite then imports that installed copy, not
// the source tree. Afterwards no sandbox the suite made may be left
// running, nor anything of one on the host.
func TestPythonSDK(t *testing.T) {
	needs.Root(t)
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	needs.Command(t, "/usr/bin/python3")

	src := filepath.Join(harness.RepoRoot(), "sdk", "python")
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testPythonSDK(t, src, backend)
		})
	}
}

func testPythonSDK(t *testing.T, src, backend string) {
	py := installPythonSDK(t, src)
	// Sampling every second (5 s by default): the suite's metrics test
	// waits for the first sample, which otherwise came 5 to 10 s in.
	d, c := startDaemonArgs(t, backend, "--metrics-interval", "1s")

	env := []string{
		"CUBICLE_URL=" + d.URL,
		"CUBICLE_API_KEY=" + d.APIKey,
		"CUBICLE_TEST_BACKEND=" + backend,
		"PYTHONDONTWRITEBYTECODE=1", // nothing written into the source tree
		"PYTHONNOUSERSITE=1",
		"PYTHONUNBUFFERED=1",
	}
	tests := filepath.Join(src, "tests")

	// The suite must test the installed package, not a copy next to it.
	where, err := runLogged(t, time.Minute, tests, env, py, pyArgs("-c", "import cubicle; print(cubicle.__file__)")...) //depcheck:runs /usr/bin/python3
	if err != nil {
		t.Fatalf("import cubicle: %v", err)
	}
	if venv := filepath.Dir(filepath.Dir(py)); !strings.HasPrefix(strings.TrimSpace(where), venv+"/") {
		t.Fatalf("cubicle imported from %q, want the venv %s", strings.TrimSpace(where), venv)
	}

	start := time.Now()
	out, err := runLogged(t, 5*time.Minute, tests, env, py, pyArgs("-m", "unittest", "-v")...) //depcheck:runs /usr/bin/python3
	t.Logf("python -m unittest: %v", time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		t.Errorf("python -m unittest: %v", err)
	}
	if skips := regexp.MustCompile(`(?m)^.* \.\.\. skipped .*$`).FindAllString(out, -1); len(skips) > 0 {
		t.Errorf("the suite skipped tests:\n%s", strings.Join(skips, "\n"))
	}
	if !regexp.MustCompile(`(?m)^Ran [1-9][0-9]* tests? in `).MatchString(out) {
		t.Errorf("the suite ran no tests")
	}

	assertSuiteLeftNothing(t, d, c, "Python suite")
}

// installPythonSDK makes a venv in a temporary directory and pip-installs
// the SDK at src into it, offline, and returns the venv's python. The SDK is
// built from a copy, since pip builds in the tree it is given.
func installPythonSDK(t *testing.T, src string) string {
	t.Helper()
	tmp := t.TempDir()
	venv, build := filepath.Join(tmp, "venv"), filepath.Join(tmp, "sdk")
	if err := os.CopyFS(build, os.DirFS(src)); err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
	env := []string{"PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONNOUSERSITE=1"}
	if _, err := runLogged(t, 2*time.Minute, tmp, env, "/usr/bin/python3", pyArgs("-m", "venv", "--system-site-packages", venv)...); err != nil {
		t.Fatalf("python3 -m venv (python3-venv, from scripts/deps.sh): %v", err)
	}
	py := filepath.Join(venv, "bin", "python")
	install := pyArgs("-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir", build)
	if _, err := runLogged(t, 3*time.Minute, tmp, env, py, install...); err != nil { //depcheck:runs /usr/bin/python3
		t.Fatalf("pip install the SDK offline (python3-setuptools and python3-wheel, from scripts/deps.sh): %v", err)
	}
	return py
}

// pyArgs returns its arguments: the interpreter's arguments go through it so
// that the dependency check (a runner's first string literal is the program
// it runs) does not take "-m" for a program.
func pyArgs(args ...string) []string { return args }
