package firecracker

import (
	"context"
	"os"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/drivertest"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// realFirecracker gates a test on a real Firecracker. These tests are
// selected only by BACKEND=firecracker (`make e2e BACKEND=firecracker` on a
// KVM host): otherwise they skip unconditionally — not through needs, whose
// skips fail under CUBICLE_REQUIRE_E2E=1 — because CI runs with that set on
// machines that have no usable KVM and no Firecracker at all. Once
// BACKEND=firecracker is set, every missing piece is a needs gate, so a
// KVM host that is meant to run them cannot pass by skipping.
func realFirecracker(t *testing.T) (*Driver, string) {
	t.Helper()
	if os.Getenv("BACKEND") != "firecracker" {
		t.Skip("real-Firecracker test: runs only with BACKEND=firecracker on a KVM host (make e2e BACKEND=firecracker)")
	}
	needs.Root(t)
	needs.Command(t, "firecracker", "jailer")
	uid, gid := 0, 0
	if u, err := user.Lookup("cubicle-vm"); err == nil {
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	} else {
		needs.Skip(t, "needs the cubicle-vm user (deploy/provision.sh makes it): %v", err)
	}
	base, err := os.MkdirTemp("/srv", "cubicle-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	rootfs := drivertest.DesktopImage(t, true)
	agent := drivertest.AgentBinary(t)
	// The probe boot is the first real boot: it must pass here, on a KVM
	// host.
	d := New(Config{ChrootBase: base, UID: uid, GID: gid, AgentBinary: agent,
		ProbeImage: func() (string, error) { return rootfs, nil }})
	if err := d.Available(context.Background()); err != nil {
		needs.Skip(t, "firecracker unavailable: %v", err)
	}
	if err := d.Probe(context.Background()); err != nil {
		needs.Skip(t, "firecracker cannot boot a guest here: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Cleanup(context.Background(), nil); err != nil {
			t.Errorf("final Cleanup: %v", err)
		}
	})
	return d, rootfs
}

// TestRealBoot boots the desktop image's VM form under real Firecracker
// (after the probe boot Available makes), waits for the agent on vsock,
// checks adoption by a second driver, and stops it leaving nothing
// behind.
func TestRealBoot(t *testing.T) {
	d, rootfs := realFirecracker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := d.Create(ctx, driver.Spec{ID: "fcreal1", Shape: driver.Shape{Image: rootfs, VCPUs: 1, MemoryMB: 1024}, Session: driver.Session{Token: "feedface"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	for {
		c, err := b.DialAgent(ctx)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("agent never answered on vsock: %v\n%s", err, tailFiles(d.paths("fcreal1"), 40))
		case <-b.Wait():
			t.Fatalf("VM died while booting\n%s", tailFiles(d.paths("fcreal1"), 40))
		case <-time.After(200 * time.Millisecond):
		}
	}
	nb, err := New(d.cfg).Adopt(ctx, b.State())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-nb.Wait():
		t.Fatal("running VM adopted as dead")
	default:
	}
	b.(*box).stopWatch()
	data := nb.(*box).data
	if s := d.strays(data); len(s) == 0 {
		t.Fatal("strays of a running VM: none; the check below would see nothing")
	}
	if err := nb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Firecracker (by pid and start time), any process in its jail (found
	// by its mount table: the jailer pivot_roots, see jailproc.go), the
	// jail, the cgroups: all gone.
	if s := d.strays(data); len(s) > 0 {
		t.Errorf("left after Stop: %s", strings.Join(s, "; "))
	}
}
