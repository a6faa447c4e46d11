package firecracker_test

import (
	"context"
	"os"
	"os/user"
	"strconv"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/drivertest"
	"github.com/cubicle-dev/cubicle/internal/driver/firecracker"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestConformance runs the driver conformance suite on real Firecracker
// microVMs. Like the package's other real-Firecracker tests it runs only
// with BACKEND=firecracker (`make e2e BACKEND=firecracker` on a KVM host)
// and skips unconditionally otherwise — not through needs, whose skips fail
// under CUBICLE_REQUIRE_E2E=1, which CI sets on machines without usable KVM
// or any Firecracker. Once BACKEND=firecracker is set every missing piece
// is a needs gate, so a host meant to run it cannot pass by skipping.
func TestConformance(t *testing.T) {
	if os.Getenv("BACKEND") != "firecracker" {
		t.Skip("real-Firecracker test: runs only with BACKEND=firecracker on a KVM host (make e2e BACKEND=firecracker)")
	}
	needs.Root(t)
	needs.Command(t, "firecracker", "jailer")
	u, err := user.Lookup("cubicle-vm")
	if err != nil {
		needs.Skip(t, "needs the cubicle-vm user (deploy/provision.sh makes it): %v", err)
		return
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	rootfs := drivertest.DesktopImage(t, true)
	// The jails live on /srv as in production (DefaultChrootBase), in a
	// directory of this run's own.
	base, err := os.MkdirTemp("/srv", "cubicle-conformance-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	cfg := firecracker.Config{ChrootBase: base, UID: uid, GID: gid, AgentBinary: drivertest.AgentBinary(t),
		ProbeImage: func() (string, error) { return rootfs, nil }}
	if err := firecracker.New(cfg).Available(context.Background()); err != nil {
		needs.Skip(t, "firecracker unavailable: %v", err)
	}
	t.Cleanup(func() {
		// Whatever a failed run left, so the machine stays clean.
		if err := firecracker.New(cfg).Cleanup(context.Background(), nil); err != nil {
			t.Errorf("final Cleanup: %v", err)
		}
	})
	drivertest.Run(t, func(*testing.T) driver.Driver { return firecracker.New(cfg) },
		drivertest.StateDirs(base), drivertest.VM(), drivertest.Image(rootfs))
}
