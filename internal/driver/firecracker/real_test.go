package firecracker

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// realFirecracker gates a test on a real Firecracker. These tests are
// selected only by BACKEND=firecracker (`make e2e BACKEND=firecracker` on a
// KVM host): otherwise they skip unconditionally — not through needs, whose
// skips fail under CUBICLE_REQUIRE_E2E=1 — because CI runs with that set on
// machines that have no usable KVM and no Firecracker at all. Once
// BACKEND=firecracker is set, every missing piece is a needs gate, so a
// KVM host that is meant to run them cannot pass by skipping.
func realFirecracker(t *testing.T) *Driver {
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
	needs.Command(t, "go")
	agent := filepath.Join(t.TempDir(), "cubicle-agent")
	build := exec.Command("go", "build", "-o", agent, "github.com/cubicle-dev/cubicle/cmd/cubicle-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v\n%s", err, out)
	}
	d := New(Config{ChrootBase: base, UID: uid, GID: gid, AgentBinary: agent})
	if err := d.Available(context.Background()); err != nil {
		needs.Skip(t, "firecracker unavailable: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Cleanup(context.Background(), nil); err != nil {
			t.Errorf("final Cleanup: %v", err)
		}
	})
	return d
}

// TestRealBoot boots the desktop image's VM form under real Firecracker,
// waits for the agent on vsock, checks adoption by a second driver, and
// stops it leaving nothing behind.
func TestRealBoot(t *testing.T) {
	d := realFirecracker(t)
	dir := os.Getenv("CUBICLE_IMAGE_DIR")
	if dir == "" {
		dir = "/var/lib/cubicle/images"
	}
	rootfs := needs.Image(t, filepath.Join(dir, "desktop"))
	if _, err := d.resolve(rootfs); err != nil {
		needs.Skip(t, "image has no VM form: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := d.Create(ctx, driver.Spec{ID: "fcreal1", Image: rootfs, VCPUs: 1, MemoryMB: 1024, Token: "feedface"})
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
	if err := nb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.paths("fcreal1").JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail left: %v", err)
	}
	if procs := jailedProcesses(d.jailBase()); len(procs) > 0 {
		t.Errorf("jailed processes left: %v", procs)
	}
}
