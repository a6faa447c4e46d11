package oci

import (
	"context"
	"slices"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

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

// TestSpecSeccomp checks the close_range filter of gVisor boxes (see
// gvisorSeccomp): under runsc, close_range whose last fd is above MaxInt32
// (what this runsc fails with EINVAL, and GLib sends) is turned into
// ENOSYS and nothing else is touched; runc boxes get no filter.
func TestSpecSeccomp(t *testing.T) {
	const closeRange = "close_range"
	tests := []struct {
		name    string
		runc    bool
		syscall string
		last    uint64 // close_range's second argument, as the register holds it
		want    specs.LinuxSeccompAction
	}{
		{"runsc GLib closefrom", false, closeRange, 0xffffffff, specs.ActTrace},
		{"runsc sign-extended ~0U", false, closeRange, ^uint64(0), specs.ActTrace},
		{"runsc last 2^31", false, closeRange, 1 << 31, specs.ActTrace},
		{"runsc last MaxInt32", false, closeRange, 1<<31 - 1, specs.ActAllow},
		{"runsc small range", false, closeRange, 200, specs.ActAllow},
		{"runsc high garbage, small last", false, closeRange, 0xffffffff_00000100, specs.ActAllow},
		{"runsc other syscall", false, "close", 0xffffffff, specs.ActAllow},
		{"runc GLib closefrom", true, closeRange, 0xffffffff, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := withDefaults(driver.Spec{ID: "abc", Session: driver.Session{Token: "t"}})
			sc := ociSpec(s, "/rootfs", "/run/x", "/bin/agent", tt.runc).Linux.Seccomp
			if tt.want == "" {
				if sc != nil {
					t.Fatalf("runc box has a seccomp filter: %+v", sc)
				}
				return
			}
			if sc == nil {
				t.Fatal("gVisor box has no seccomp filter")
			}
			if got := seccompAction(t, sc, tt.syscall, tt.last); got != tt.want {
				t.Errorf("%s(3, %#x, 0): %s, want %s", tt.syscall, tt.last, got, tt.want)
			}
		})
	}
}

// seccompAction evaluates the OCI filter sc for syscall name with args
// (3, last, 0), for the rule shapes gvisorSeccomp uses: rules with one
// argument condition per index (all must hold), first match wins.
func seccompAction(t *testing.T, sc *specs.LinuxSeccomp, name string, last uint64) specs.LinuxSeccompAction {
	t.Helper()
	args := [6]uint64{3, last, 0}
	for _, r := range sc.Syscalls {
		if !slices.Contains(r.Names, name) {
			continue
		}
		if r.ErrnoRet != nil {
			// runsc 20221219 ignores errnoRet (SCMP_ACT_ERRNO is EPERM).
			t.Errorf("rule for %v relies on errnoRet", r.Names)
		}
		match := true
		for _, a := range r.Args {
			var ok bool
			switch a.Op {
			case specs.OpMaskedEqual:
				ok = args[a.Index]&a.Value == a.ValueTwo
			default:
				t.Fatalf("operator %s not evaluated by this test", a.Op)
			}
			match = match && ok
		}
		if match {
			return r.Action
		}
	}
	return sc.DefaultAction
}

// TestRunscFlags checks that runsc is told to load the spec's seccomp
// filter (it ignores it without --oci-seccomp), with and without a
// network namespace, and that runc gets no runsc flags.
func TestRunscFlags(t *testing.T) {
	tests := []struct {
		runtime, netns string
		want           bool
	}{
		{"runsc", "", true},
		{"runsc", "/run/netns/x", true},
		{"runc", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.runtime+tt.netns, func(t *testing.T) {
			d := New(Config{Runtime: tt.runtime, RuntimePath: "/nonexistent/" + tt.runtime, StateDir: t.TempDir()})
			cmd := d.commandNet(context.Background(), tt.netns, "run", "--bundle", "b", "id")
			if got := slices.Contains(cmd.Args, "--oci-seccomp"); got != tt.want {
				t.Errorf("--oci-seccomp in %q: %v, want %v", cmd.Args, got, tt.want)
			}
		})
	}
}

// TestCloseRangeInBox checks, in a real box, what GLib's spawn sees of
// close_range(3, ~0U, CLOSE_RANGE_CLOEXEC): ENOSYS (38) under runsc, so it
// falls back to /proc/self/fd (runsc 20221219 itself says EINVAL, which
// GLib does not handle), and success under runc.
func TestCloseRangeInBox(t *testing.T) {
	for _, tt := range []struct{ runtime, want string }{
		{"runsc", "38"},
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
