package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// A daemon killed during Create leaves its `runtime run` going: the
// runtime runs in a session of its own so that the box outlives the daemon
// (see Create). Its successor must not clean that box up while the run is
// still writing it: runsc, finding its bundle gone half-way, exits leaving
// a state file, a lock file and the box's cgroups that nothing removes
// later (CI saw exactly that, a kill 135 ms into a create). So Cleanup
// first waits for such orphaned runs to end, then deletes what they made.

// orphanRunBound is how long Cleanup waits for an orphaned run before it
// kills it. Create bounds its own run to a minute (plus the 5 s WaitDelay),
// but that bound died with the daemon that set it.
const orphanRunBound = 70 * time.Second

// orphanRuns returns the runtime calls still running `run` for a box of
// this driver whose ID is not in keep. They are told by the --pid-file
// argument, a path inside the box's directory, which every stage of the
// call carries (unshare, the sh that execs the runtime, the runtime) and no
// process of a running box does.
func (d *Driver) orphanRuns(keep map[string]bool) ([]procwatch.Process, error) {
	prefix := filepath.Clean(d.cfg.StateDir) + string(filepath.Separator)
	return procwatch.FindOwn(func(argv []string) bool {
		for i := 0; i+1 < len(argv); i++ {
			if argv[i] != "--pid-file" || !strings.HasPrefix(argv[i+1], prefix) {
				continue
			}
			id, _, _ := strings.Cut(strings.TrimPrefix(argv[i+1], prefix), string(filepath.Separator))
			return validID(id) == nil && !keep[id]
		}
		return false
	})
}

// waitOrphanRuns waits, for at most bound, until no orphaned run is left,
// and kills (with their process groups) those still running then.
func (d *Driver) waitOrphanRuns(ctx context.Context, keep map[string]bool, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		ps, err := d.orphanRuns(keep)
		if err != nil || len(ps) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			for _, p := range ps {
				if p.Alive() {
					// Create's Setsid made it a group leader: the
					// group is the call and the helpers it started.
					_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
					_ = syscall.Kill(p.Pid, syscall.SIGKILL)
				}
			}
			return fmt.Errorf("%s: killed %d runtime run(s) left by the previous daemon, still running after %s", d.cfg.Runtime, len(ps), bound)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// cgroupParent is the cgroup, under every hierarchy, in which the spec
// (spec.go, CgroupsPath) puts each box's own.
const cgroupParent = "cubicle"

// removeCgroups removes what is left of box id's cgroups, in cgroup v1's
// hierarchies (/sys/fs/cgroup/*/cubicle/ID) and v2's (/sys/fs/cgroup/
// cubicle/ID). The runtime's delete removes them, but not always: the
// soak of 2026-12-01 left the empty cgroups of 34 of its 166 sandboxes,
// by a path not pinned down yet (its audit did not look at cgroups then).
// rmdir removes only an empty cgroup, so one that still has tasks stays,
// and is reported.
func removeCgroups(id string) error {
	var errs []error
	for _, dir := range cgroupDirs(id) {
		if err := syscall.Rmdir(dir); err != nil && err != syscall.ENOENT {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupDirs returns the cgroups made for box id (one per v1 hierarchy,
// or the v2 one).
func cgroupDirs(id string) []string {
	if validID(id) != nil {
		return nil
	}
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", cgroupParent, id))
	if v2 := filepath.Join("/sys/fs/cgroup", cgroupParent, id); isDirPath(v2) {
		dirs = append(dirs, v2)
	}
	return dirs
}

func isDirPath(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
