package oci_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/drivertest"
	"github.com/cubicle-dev/cubicle/internal/driver/oci"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestConformance runs the driver conformance suite on gVisor and runc, each
// box with a disk-limited writable layer (a loop-mounted ext4 file), as
// cubicled's default gives them.
func TestConformance(t *testing.T) {
	needs.Root(t)
	agent := drivertest.AgentBinary(t)
	for _, rt := range []string{"runsc", "runc"} {
		t.Run(rt, func(t *testing.T) {
			needs.Runtime(t, rt)
			cfg := oci.Config{Runtime: rt, StateDir: filepath.Join(t.TempDir(), "st"), AgentBinary: agent, DiskMB: 512}
			t.Cleanup(func() {
				// Whatever a failed run left, so the machine stays clean.
				if err := oci.New(cfg).Cleanup(context.Background(), nil); err != nil {
					t.Errorf("final Cleanup: %v", err)
				}
				os.RemoveAll(oci.DefaultRuntimeRoot(cfg.StateDir))
			})
			drivertest.Run(t, func(*testing.T) driver.Driver { return oci.New(cfg) }, drivertest.StateDirs(cfg.StateDir, oci.DefaultRuntimeRoot(cfg.StateDir)), drivertest.Copies())
		})
	}
}
