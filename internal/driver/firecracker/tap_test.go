package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/netpool"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
)

// jailTun makes a TUN/TAP device node owned by uid:gid, mode 0600, as
// the jailer makes /dev/net/tun in each jail, and returns its path.
func jailTun(t *testing.T, uid, gid int) string {
	t.Helper()
	// Not t.TempDir: its parent is closed to other users.
	dir, err := os.MkdirTemp("", "cubicle-jail-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "tun")
	if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(10, 200))); err != nil {
		t.Fatalf("mknod tun: %v", err)
	}
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
	return p
}

// openTAP attaches to the persistent TAP name as Firecracker's
// Tap::open_named does: open the TUN device (tun, the jail's
// /dev/net/tun) and TUNSETIFF with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR.
func openTAP(tun, name string) error {
	fd, err := unix.Open(tun, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", tun, err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return nil
}

// openTAPAs opens the TAP as uid:gid, as the jailed VMM does (the jailer
// drops to its user before exec'ing Firecracker): on an OS thread of its
// own whose credentials (uid, gid, no supplementary groups) are changed
// with raw system calls, which change only the calling thread. The thread
// is never handed back: its goroutine ends locked, so Go ends the thread.
func openTAPAs(tun, name string, uid, gid int) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		for _, c := range []struct {
			what       string
			trap       uintptr
			a1, a2, a3 uintptr
		}{
			{"setgroups", unix.SYS_SETGROUPS, 0, 0, 0},
			{"setresgid", unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)},
			{"setresuid", unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)},
		} {
			if _, _, e := unix.RawSyscall(c.trap, c.a1, c.a2, c.a3); e != 0 {
				errc <- fmt.Errorf("%s: %w", c.what, e)
				return
			}
		}
		errc <- openTAP(tun, name)
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("open tap %s as uid %d: %w", name, uid, err)
	}
	return nil
}

// vmmUID and vmmGID stand for the jailer's unprivileged user (cubicle-vm
// in production): nobody.
const vmmUID, vmmGID = 65534, 65534

// TestTAPOpensAsVMMUser: a VM's TAP, made by the real netpool as the
// daemon makes it (owned by no one: root only), can be opened by the user
// the jailer runs Firecracker as once Create has run — Firecracker opens it
// at PUT /network-interfaces, which the fake does here as that user — and
// by no other unprivileged user.
func TestTAPOpensAsVMMUser(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	ctx := context.Background()
	tmp := t.TempDir()
	pool, err := netpool.New(ctx, netpool.Config{
		Bridge: "cbfctest0", CIDR: netip.MustParsePrefix("10.98.0.0/24"),
		StateDir: filepath.Join(tmp, "netpool"), NetnsDir: filepath.Join(tmp, "netns"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Teardown(ctx) })
	n, err := pool.Attach(ctx, "fc1", netpool.KindTAP, nil)
	if err != nil {
		t.Fatal(err)
	}
	tun := jailTun(t, vmmUID, vmmGID)
	if err := openTAPAs(tun, n.TAP, vmmUID, vmmGID); !errors.Is(err, unix.EPERM) {
		t.Fatalf("the pool's TAP opened as uid %d before Create: %v; want EPERM (else this test shows nothing)", vmmUID, err)
	}

	fake := newFake(t)
	d := newFakeDriver(t, fake, Config{})
	d.cfg.UID, d.cfg.GID = vmmUID, vmmGID
	d.giveTAP = ownTAP // the real one: the TAP is real
	fake.onRequest = func(method, path string, body any) error {
		if method == "PUT" && strings.HasPrefix(path, "/network-interfaces/") {
			return openTAPAs(tun, body.(map[string]any)["host_dev_name"].(string), vmmUID, vmmGID)
		}
		return nil
	}
	spec := testSpec(testImage(t))
	spec.Net = n
	b, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer b.Stop(ctx)
	if err := openTAPAs(tun, n.TAP, vmmUID, vmmGID); err != nil {
		t.Errorf("after Create: %v", err)
	}
	if err := openTAPAs(jailTun(t, vmmUID+1, vmmGID+1), n.TAP, vmmUID+1, vmmGID+1); !errors.Is(err, unix.EPERM) {
		t.Errorf("another user opened the VM's TAP: %v, want EPERM", err)
	}
}
