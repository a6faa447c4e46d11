package firecracker

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// testVolume writes a file with an ext4 superblock (magic and UUID, all
// the guest reads of it) and some data, as a volume's file.
func testVolume(t *testing.T, dir, name string) driver.Volume {
	t.Helper()
	head := make([]byte, 1<<20)
	binary.LittleEndian.PutUint16(head[1024+0x38:], 0xEF53)
	copy(head[1024+0x68:], []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	copy(head[512<<10:], "the user's cookies")
	f := filepath.Join(dir, name+".ext4")
	if err := os.WriteFile(f, head, 0o600); err != nil {
		t.Fatal(err)
	}
	return driver.Volume{Name: name, File: f, Path: "/home/user"}
}

// volumeIntact checks the volume's file still holds its data.
func volumeIntact(t *testing.T, v driver.Volume) {
	t.Helper()
	b, err := os.ReadFile(v.File)
	if err != nil || len(b) != 1<<20 || string(b[512<<10:512<<10+18]) != "the user's cookies" {
		t.Errorf("volume file %s lost its data (%d bytes, %v)", v.File, len(b), err)
	}
}

// TestVolumes: a volume is a read-write drive in the conversation, its
// file bind-mounted into the jail (the same file, owned by the VMM's
// user) and named by its UUID on the config drive; the mount stays
// through a pause, serves the restored VM, and is gone after Stop, with
// the volume's data untouched.
func TestVolumes(t *testing.T) {
	needs.Root(t)
	fake := newFake(t)
	d := newFakeDriver(t, fake, testLimits)
	spec := testSpec(testImage(t))
	vol := testVolume(t, t.TempDir(), "profile")
	spec.Volumes = []driver.Volume{vol}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var drives []request
	for _, r := range fake.requests() {
		if strings.HasPrefix(r.Path, "/drives/") {
			drives = append(drives, r)
		}
	}
	if len(drives) != 3 || !cmp.Equal(drives[2], request{"PUT", "/drives/vol0", map[string]any{
		"drive_id": "vol0", "path_on_host": "/vol0.ext4", "is_root_device": false, "is_read_only": false,
	}}) {
		t.Errorf("drives %v; want root, config and a read-write vol0", drives)
	}
	p := d.paths(spec.ID)
	var src, dst syscall.Stat_t
	syscall.Stat(vol.File, &src)
	if err := syscall.Stat(p.host("/vol0.ext4"), &dst); err != nil || src.Ino != dst.Ino || src.Dev != dst.Dev {
		t.Errorf("the jail's /vol0.ext4 is not the volume's file (%v)", err)
	}
	if int(dst.Uid) != os.Getuid() {
		t.Errorf("volume owned by %d, want the VMM's user", dst.Uid)
	}
	blob, _ := os.ReadFile(p.host(configName))
	gc, err := vminit.DecodeConfig(blob)
	if err != nil || !cmp.Equal(gc.Volumes, []vminit.Volume{{UUID: "deadbeef0102030405060708090a0b0c", Path: "/home/user"}}) {
		t.Errorf("config drive volumes %+v, %v", gc.Volumes, err)
	}

	paused, err := d.Pause(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if !mountsUnder(p.JailDir)[p.host("/vol0.ext4")] {
		t.Error("the paused VM's volume is not mounted in its jail")
	}
	// As after a host reboot: the mount is gone, and Resume makes it.
	if err := unmountJail(p.JailDir); err != nil {
		t.Fatal(err)
	}
	b, err = d.Resume(ctx, paused)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if !mountsUnder(p.JailDir)[p.host("/vol0.ext4")] {
		t.Error("the resumed VM's volume is not mounted in its jail")
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(p.JailDir); len(m) > 0 {
		t.Errorf("after Stop, mounted under the jail: %v", m)
	}
	if _, err := os.Stat(p.JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail after Stop: %v", err)
	}
	volumeIntact(t, vol)
}

// TestVolumesRollBack: a create that fails after the volume was mounted
// into the jail, a discarded paused VM and an orphan jail found by
// Cleanup all unmount it before the jail goes, and leave its data.
func TestVolumesRollBack(t *testing.T) {
	needs.Root(t)
	for _, tc := range []string{"create fails", "discard", "cleanup"} {
		t.Run(tc, func(t *testing.T) {
			fake := newFake(t)
			d := newFakeDriver(t, fake, testLimits)
			spec := testSpec(testImage(t))
			vol := testVolume(t, t.TempDir(), "profile")
			spec.Volumes = []driver.Volume{vol}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p := d.paths(spec.ID)
			switch tc {
			case "create fails":
				fake.fail["/network-interfaces/eth0"] = "Open tap device failed"
				if _, err := d.Create(ctx, spec); err == nil {
					t.Fatal("create succeeded")
				}
			case "discard":
				b, err := d.Create(ctx, spec)
				if err != nil {
					t.Fatal(err)
				}
				paused, err := d.Pause(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				if err := d.Discard(ctx, paused); err != nil {
					t.Fatal(err)
				}
			case "cleanup":
				b, err := d.Create(ctx, spec)
				if err != nil {
					t.Fatal(err)
				}
				b.(*box).stopWatch()
				if err := d.Cleanup(ctx, nil); err != nil {
					t.Fatal(err)
				}
			}
			if m := mountsUnder(p.JailDir); len(m) > 0 {
				t.Errorf("mounted under the jail: %v", m)
			}
			if _, err := os.Stat(p.JailDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("jail: %v, want removed", err)
			}
			volumeIntact(t, vol)
		})
	}
}
