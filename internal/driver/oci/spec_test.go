package oci

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// TestSpecPidsLimit checks the pids limit per runtime: guest processes
// under runc, host tasks (scaled) under runsc.
func TestSpecPidsLimit(t *testing.T) {
	tests := []struct {
		name  string
		limit int
		runc  bool
		want  int64
	}{
		{"runc default", 0, true, DefaultPidsLimit},
		{"runc explicit", 300, true, 300},
		{"runsc default", 0, false, DefaultPidsLimit * gvisorPidsFactor},
		{"runsc explicit", 300, false, 300 * gvisorPidsFactor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := withDefaults(driver.Spec{ID: "abc", Shape: driver.Shape{PidsLimit: tt.limit}, Session: driver.Session{Token: "t"}})
			sp := ociSpec(s, "/rootfs", "/run/x", "/bin/agent", tt.runc)
			if got := *sp.Linux.Resources.Pids.Limit; got != tt.want {
				t.Fatalf("pids limit %d, want %d", got, tt.want)
			}
		})
	}
}

// TestNoSeccompFilter: boxes of either runtime carry no seccomp filter
// of cubicle's and runsc is not asked to load one: the filter Debian's
// runsc of 2022 needed for GLib (close_range) is gone with it.
func TestNoSeccompFilter(t *testing.T) {
	for _, runc := range []bool{false, true} {
		s := withDefaults(driver.Spec{ID: "abc", Session: driver.Session{Token: "t"}})
		if sc := ociSpec(s, "/rootfs", "/run/x", "/bin/agent", runc).Linux.Seccomp; sc != nil {
			t.Errorf("runc=%v: the box has a seccomp filter: %+v", runc, sc)
		}
	}
	d := New(Config{Runtime: "runsc", RuntimePath: "/nonexistent/runsc", StateDir: t.TempDir()})
	if cmd := d.commandNet(context.Background(), "", "run", "--bundle", "b", "id"); slices.Contains(cmd.Args, "--oci-seccomp") {
		t.Errorf("runsc is asked to load a filter: %q", cmd.Args)
	}
}

// TestCloseRangeInBox checks, in a real box, what GLib's spawn sees of
// close_range(3, ~0U, CLOSE_RANGE_CLOEXEC): success under both runtimes.
// Debian 12's runsc (20221219) answered EINVAL, which GLib does not
// handle: every spawn of XFCE's session and of gtk-launch failed, until a
// seccomp filter of cubicle's turned it into ENOSYS. The pinned runsc caps
// the range at its descriptor limit as Linux does, and needs no filter.
func TestCloseRangeInBox(t *testing.T) {
	for _, tt := range []struct{ runtime, want string }{
		{"runsc", "0"},
		{"runc", "0"},
	} {
		t.Run(tt.runtime, func(t *testing.T) {
			d, image := newTestDriver(t, tt.runtime)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			id := "tcr" + tt.runtime[3:]
			b, err := d.Create(ctx, driver.Spec{ID: id, Shape: driver.Shape{Image: image}, Session: driver.Session{Token: "x"}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := b.Stop(ctx); err != nil {
					t.Error(err)
				}
			}()
			if got := get(t, b, "/closerange"); got != tt.want {
				t.Errorf("close_range(3, ~0U, CLOEXEC) errno = %s, want %s", got, tt.want)
			}
		})
	}
}
