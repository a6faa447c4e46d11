package oci

import (
	"testing"

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
