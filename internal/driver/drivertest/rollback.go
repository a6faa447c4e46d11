package drivertest

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// cutAfter are the deadlines of the roll-back probes: from before anything
// is made to well into a slow start, so that some Create is cut while the
// driver is half-way (gVisor starts in about a second, runc in a fifth,
// QEMU under TCG takes over ten).
var cutAfter = []time.Duration{2 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond,
	60 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
	800 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second, 6 * time.Second}

// createRollsBack checks construct-or-roll-back: a Create whose context is
// cancelled before it starts, or whose deadline passes while it runs, fails
// and leaves nothing on the host. A probe that finishes in time is stopped
// (and must leave nothing either); longer deadlines are then pointless.
func (s *suite) createRollsBack(t *testing.T, d driver.Driver) {
	spec := s.newSpec("r", "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if b, err := d.Create(ctx, spec); err == nil {
		t.Errorf("Create with a cancelled context succeeded")
		s.stop(t, spec.ID, b)
	} else {
		s.assertNoTraces(t, spec.ID, "after a Create with a cancelled context failed")
	}

	halfway := 0 // cut Creates that had made something
	for _, after := range cutAfter {
		spec := s.newSpec("r", "")
		sm := startSampler(spec.ID, s.cfg.stateDirs)
		ctx, cancel := context.WithTimeout(context.Background(), after)
		t0 := time.Now()
		b, err := d.Create(ctx, spec)
		took := time.Since(t0)
		cancel()
		made := sm.Stop()
		if err == nil {
			t.Logf("deadline %s: Create finished in %s; stopping it", after, took.Round(time.Millisecond))
			s.stop(t, spec.ID, b)
			break
		}
		if !made.Empty() {
			halfway++
		}
		if took > after+time.Minute {
			t.Errorf("deadline %s: Create took %s to give up", after, took)
		}
		t.Logf("deadline %s: Create failed after %s, having made %d processes and %d paths: %s",
			after, took.Round(time.Millisecond), len(made.Processes), len(made.Paths), firstLine(err))
		s.assertNoTraces(t, spec.ID, "after a Create cut by its deadline ("+after.String()+") failed")
	}
	if halfway == 0 {
		t.Error("no Create was cut half-way (none had made a process or a path when it failed): roll-back untested")
	}
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// killPid sends SIGKILL to pid; a process already gone is not an error.
func killPid(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
