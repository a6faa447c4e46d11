package firecracker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/driver"
)

// Volumes are extra virtio-blk drives. A jailed Firecracker sees only
// its chroot, so each volume's file is bind-mounted into it, at
// /volN.ext4 (the jailer bind-mounts the chroot recursively, so the VMM
// finds it there), and given to the VMM's user; the guest's init mounts
// it by its ext4 UUID, as under QEMU. The bind mounts stay while the VM
// is paused — a restored VM opens its drives at the paths it had — and
// go before the jail is removed: nothing under a jail is ever deleted
// through a mount.

// AttachesVolumes reports that Firecracker VMs mount volumes
// (driver.VolumeAttacher).
func (d *Driver) AttachesVolumes() bool { return true }

var _ driver.VolumeAttacher = (*Driver)(nil)

// volumeName is the path in the chroot of the i-th volume's drive.
func volumeName(i int) string { return fmt.Sprintf("/vol%d.ext4", i) }

// volumeDrives returns the drives of the volumes, in order.
func volumeDrives(n int) []apiDrive {
	var out []apiDrive
	for i := 0; i < n; i++ {
		out = append(out, apiDrive{DriveID: fmt.Sprintf("vol%d", i), PathOnHost: volumeName(i)})
	}
	return out
}

// guestVolumes reads each volume's ext4 UUID, by which the guest finds
// its drive.
func guestVolumes(vols []driver.Volume) ([]vminit.Volume, error) {
	var out []vminit.Volume
	for _, v := range vols {
		gv, err := vminit.VolumeOnDisk(v.File, v.Path)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		out = append(out, gv)
	}
	return out, nil
}

// bindVolumes bind-mounts each of files into the jail (where it is not
// mounted already) and gives it to uid:gid. On error what it mounted is
// unmounted again.
func bindVolumes(p paths, files []string, uid, gid int) (err error) {
	var done []string
	defer func() {
		if err != nil {
			for _, t := range done {
				unix.Unmount(t, unix.MNT_DETACH)
			}
		}
	}()
	mounted := mountsUnder(p.JailDir)
	for i, f := range files {
		t := p.host(volumeName(i))
		if mounted[t] {
			continue
		}
		// The mount point; never truncated (were it a mount after all,
		// that would be the volume).
		mp, err := os.OpenFile(t, os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		mp.Close()
		if err := unix.Mount(f, t, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind volume %s into the jail: %w", f, err)
		}
		done = append(done, t)
		if err := os.Chown(t, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// unmountJail unmounts everything mounted under a jail directory (its
// volumes' bind mounts), deepest first.
func unmountJail(jailDir string) error {
	var targets []string
	for t := range mountsUnder(jailDir) {
		targets = append(targets, t)
	}
	// Longer paths first: a mount below another goes before it.
	sort.Slice(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	var errs []error
	for _, t := range targets {
		if err := unix.Unmount(t, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", t, err))
		}
	}
	if left := mountsUnder(jailDir); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still mounted under %s: %d", jailDir, len(left)))
	}
	return errors.Join(errs...)
}

// mountsUnder returns the mount points (in this mount namespace) at or
// under dir.
func mountsUnder(dir string) map[string]bool {
	out := map[string]bool{}
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return out
	}
	dir = filepath.Clean(dir)
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out[mp] = true
		}
	}
	return out
}
