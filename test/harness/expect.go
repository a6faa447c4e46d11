package harness

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cubicle-dev/cubicle/client"
)

// Capabilities are what sandboxes of a backend must be able to do, as
// GET /v1/info's capabilities say it: the tests hold the daemon to them
// instead of taking its word. A backend that should pause and says it
// cannot would otherwise have its pause tests skipped, and pass.
type Capabilities struct {
	Pause    bool
	Snapshot bool // and fork: the daemon forks where it snapshots (qemu, gvisor)
	Volumes  bool
}

// expected is written from the drivers (internal/driver), not read from
// a daemon. None of these depends on the host: CanPause and CanSnapshot
// return nil on every host for gvisor, qemu and firecracker, whether or
// not the backend is available there.
//
// runc says no to pause on every host, and so does this table. runc
// would pause with CRIU (`runc checkpoint`), which cubicle does not drive:
// its CanPause (internal/driver/oci/criu.go) answers why not, in CRIU's
// words where `criu check` fails (on this project's machines, Debian 12's
// CRIU 3.17.1 cannot run on their 6.x kernels) and "cubicle does not
// drive it yet" where it passes. So the table need not run `criu check`:
// a runc that says it can pause is a mismatch, and a failure, until a
// runc pause exists and is tested; then this row becomes "pause where
// `criu check` passes", and the check here runs it.
var expected = map[string]Capabilities{
	"gvisor":      {Pause: true, Snapshot: true, Volumes: true},
	"runc":        {Volumes: true},
	"qemu":        {Pause: true, Snapshot: true, Volumes: true},
	"firecracker": {Pause: true, Volumes: true},
}

// Expected returns the capabilities backend must have, and false for a
// backend the table does not know.
func Expected(backend string) (Capabilities, bool) {
	c, ok := expected[backend]
	return c, ok
}

// CheckCapabilities compares what a daemon reports of backend with what
// it must report, and returns one line for each difference: a
// capability it lacks (with the reason it gives) or one it claims that
// the backend does not have. It returns nil when they agree.
func CheckCapabilities(backend string, got client.Capabilities) []string {
	want, ok := expected[backend]
	if !ok {
		return []string{fmt.Sprintf("backend %s has no expected capabilities: add it to test/harness/expect.go (known: %s)",
			backend, strings.Join(slices.Sorted(maps.Keys(expected)), ", "))}
	}
	var out []string
	check := func(what string, want, got bool, reason string) {
		switch {
		case want && !got:
			out = append(out, fmt.Sprintf("%s should %s and says it cannot: %q", backend, what, reason))
		case !want && got:
			out = append(out, fmt.Sprintf("%s says it can %s, which it should not (untested)", backend, what))
		}
	}
	check("pause", want.Pause, got.Pause, got.PauseReason)
	check("snapshot", want.Snapshot, got.Snapshot, got.SnapshotReason)
	check("attach volumes", want.Volumes, got.Volumes, "")
	return out
}
