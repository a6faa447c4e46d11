// Package needs holds test gates: helpers that skip a test whose
// preconditions (root, a command, Xvfb, a container runtime, a built image)
// are missing on this host, with a reason saying what is missing.
//
// When the environment variable CUBICLE_REQUIRE_E2E is "1" every gate fails
// the test instead of skipping it, so a CI machine that is meant to run the
// whole suite can never pass by silently skipping. Only tests import this
// package.
package needs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// RequireEnv is the environment variable that turns every skip into a
// failure when set to "1".
const RequireEnv = "CUBICLE_REQUIRE_E2E"

// Required reports whether gates must fail instead of skip
// (CUBICLE_REQUIRE_E2E=1).
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Skip skips t with the formatted reason, or fails it when Required.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("%s (%s=1 forbids skipping)", msg, RequireEnv)
	}
	t.Skip(msg)
}

// Root gates t on running as root.
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root (euid %d)", os.Geteuid())
	}
}

// Command gates t on every named program being on PATH.
func Command(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil { //depcheck:caller
			Skip(t, "needs command %q on PATH: %v", n, err)
		}
	}
}

// Xvfb gates t on the Xvfb X server being installed.
func Xvfb(t testing.TB) {
	t.Helper()
	Command(t, "Xvfb")
}

// RunscPath is where the gvisor backend runs runsc from: the pinned build
// of scripts/runsc.sh (internal/driver/oci.DefaultRunscPath; a test there
// keeps the two equal). Debian's /usr/bin/runsc is not the backend's.
const RunscPath = "/usr/local/libexec/cubicle/runsc"

// Runtime gates t on an OCI runtime ("runsc" or "runc") being installed,
// answering "--version", and the test running as root (both runtimes need
// root to start containers). runsc is the pinned one at RunscPath.
func Runtime(t testing.TB, name string) {
	t.Helper()
	Root(t)
	lookup := name
	if name == "runsc" {
		lookup = RunscPath
	}
	path, err := exec.LookPath(lookup) //depcheck:caller
	if err != nil {
		Skip(t, "needs OCI runtime %q (%s; scripts/deps.sh installs it): %v", name, lookup, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput(); err != nil { //depcheck:caller
		Skip(t, "OCI runtime %s does not run: %v: %s", path, err, out)
	}
}

// Image gates t on dir being a built image rootfs (a directory holding
// /bin and /etc). dir may be a rootfs itself or an image directory with a
// rootfs/ subdirectory; the rootfs path is returned.
func Image(t testing.TB, dir string) string {
	t.Helper()
	if dir == "" {
		Skip(t, "needs a built image: no image directory given")
		return ""
	}
	for _, root := range []string{filepath.Join(dir, "rootfs"), dir} {
		if isDir(filepath.Join(root, "etc")) && isDir(filepath.Join(root, "bin")) {
			return root
		}
	}
	Skip(t, "needs a built image at %s (build it with `cubicle image build desktop`)", dir)
	return ""
}

// Env gates t on the environment variable name being non-empty and returns
// its value.
func Env(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		Skip(t, "needs environment variable %s", name)
	}
	return v
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// Long gates t on the run not being -short: reason says what makes the
// test long (it starts Chromium, builds a binary).
func Long(t testing.TB, reason string) {
	t.Helper()
	if testing.Short() {
		Skip(t, "%s; skipped in -short mode", reason)
	}
}

// Path gates t on the file or directory p existing (a kernel interface
// such as /proc/self/mountinfo, a device).
func Path(t testing.TB, p string) {
	t.Helper()
	if _, err := os.Stat(p); err != nil {
		Skip(t, "needs %s: %v", p, err)
	}
}
