package oci

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// DefaultRunscPath is where scripts/runsc.sh installs the pinned runsc (a
// link to /usr/local/libexec/cubicle/runsc-VERSION), and where the
// gvisor backend looks for it unless told otherwise: never a PATH lookup,
// which on a Debian host finds the distribution's runsc of 2022.
const DefaultRunscPath = "/usr/local/libexec/cubicle/runsc"

// MinRunscDate is the date (YYYYMMDD) of the oldest runsc the gvisor
// backend runs: that of the version deploy/runsc/go.mod pins, the one the
// tests run (TestMinRunscDateFollowsThePin keeps the two together). An
// older runsc lacks what cubicle relies on: --gofer-network-namespace, a
// checkpoint that can leave the sandbox running, filesystem checkpoints,
// close_range and statx; Debian 12's (20221219) also fails a checkpoint
// on any TCP listener and ends the sandbox when one fails.
const MinRunscDate = "20260905"

// runscDate finds the date in a runsc version: "v0.0.0-20260905035102-…"
// (a build of the module's pseudo-version, scripts/runsc.sh),
// "release-20260901.0" (gVisor's releases), "0.0~20221219.0" (Debian's
// package).
var runscDate = regexp.MustCompile(`(?:^|[^0-9])(20[0-9]{2}[01][0-9][0-3][0-9])`)

// checkRunscVersion says why the runsc whose `--version` printed out
// cannot be used, or nil; it answers the version line's version.
func checkRunscVersion(out string) (string, error) {
	first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	version, ok := strings.CutPrefix(strings.TrimSpace(first), "runsc version ")
	if !ok {
		return "", fmt.Errorf("runsc --version printed %q, not \"runsc version …\"", first)
	}
	version = strings.TrimSpace(version)
	m := runscDate.FindStringSubmatch(version)
	if m == nil {
		return version, fmt.Errorf("runsc version %q names no date, so it cannot be told from one older than %s (a build without -ldflags -X …/runsc/version.version; scripts/runsc.sh builds the pinned one)", version, MinRunscDate)
	}
	if m[1] < MinRunscDate {
		return version, fmt.Errorf("runsc %s is older than the oldest cubicle runs (%s): it cannot pause without risk, snapshot or fork; scripts/runsc.sh installs the pinned one at %s", version, MinRunscDate, DefaultRunscPath)
	}
	return version, nil
}

// runtimeVersion runs the runtime's --version (bounded by 10 s) and
// answers its version, and for runsc why it is too old to use.
func (d *Driver) runtimeVersion(ctx context.Context, path string) (string, error) {
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(vctx, path, "--version").CombinedOutput() //depcheck:runs /usr/local/libexec/cubicle/runsc runc
	if err != nil {
		return "", fmt.Errorf("%s --version failed: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	if d.isRunsc() {
		return checkRunscVersion(string(out))
	}
	// "runc version 1.1.5+ds1" and the lines of its commit and spec.
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(strings.TrimPrefix(first, "runc version ")), nil
}

// Runtime names the runtime program and its version, as Available last
// found them (the version is empty before, or when it did not run).
func (d *Driver) Runtime() driver.Runtime {
	d.mu.Lock()
	defer d.mu.Unlock()
	return driver.Runtime{Name: d.cfg.Runtime, Path: d.cfg.RuntimePath, Version: d.version}
}
