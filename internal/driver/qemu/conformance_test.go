package qemu_test

import (
	"context"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/drivertest"
	"github.com/cubicle-dev/cubicle/internal/driver/qemu"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestConformance runs the driver conformance suite on QEMU: under TCG on
// a machine without a usable KVM (as here), so with two VM boots in all
// (drivertest.Boxes(2)) and patient timeouts; under KVM where a probe boot
// shows it works, as cubicled configures the driver.
func TestConformance(t *testing.T) {
	needs.Root(t)
	needs.Command(t, "qemu-system-x86_64", "qemu-img")
	rootfs := drivertest.DesktopImage(t, true)
	cfg := qemu.Config{
		StateDir:    t.TempDir(),
		AgentBinary: drivertest.AgentBinary(t),
		ProbeImage:  func() (string, error) { return rootfs, nil },
	}
	t.Cleanup(func() {
		// Whatever a failed run left, so the machine stays clean.
		if err := qemu.New(cfg).Cleanup(context.Background(), nil); err != nil {
			t.Errorf("final Cleanup: %v", err)
		}
	})
	d := qemu.New(cfg)
	t.Logf("accelerated: %v (%s)", d.Accelerated(context.Background()), d.AccelReason(context.Background()))
	drivertest.Run(t, func(*testing.T) driver.Driver { return qemu.New(cfg) },
		drivertest.StateDirs(cfg.StateDir), drivertest.VM(), drivertest.Image(rootfs),
		drivertest.Boxes(2), drivertest.Timeouts(6*time.Minute, 4*time.Minute),
		// The guest's vCPUs stop (QMP "stop") while the adopt check
		// severs the old host and sends its first request: the guest
		// then sees the host go and come back in one go, as a guest
		// busy under TCG does after a daemon restart, and keeps the
		// old yamux session unless the adopted box ends it.
		drivertest.FreezeDuringHandover(func(ctx context.Context, id string) (func() error, error) {
			if err := qemu.QMPCommand(ctx, cfg.StateDir, id, "stop"); err != nil {
				return nil, err
			}
			return func() error { return qemu.QMPCommand(context.Background(), cfg.StateDir, id, "cont") }, nil
		}))
}
