package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/mountinfo"
)

// mountOverlay mounts an overlay of lower (read-only) and upper at merged.
func mountOverlay(lower, upper, work, merged string) error {
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if strings.ContainsAny(lower+upper+work, ",:") {
		return fmt.Errorf("overlay paths may not contain ',' or ':': %s", opts)
	}
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay on %s (%s): %w", merged, opts, err)
	}
	return nil
}

// mountDisk makes a sparse ext4 filesystem of sizeMB in file and mounts it
// at dir through a loop device. The file takes host disk only as the box
// writes; the box cannot write more than sizeMB. mount(8) sets up the loop
// device with autoclear, so unmounting frees it, and a crash between the
// two steps leaves only the file (removed with the box's directory). No
// journal: the layer never outlives its box, so there is nothing to
// replay after a host crash.
func mountDisk(ctx context.Context, file, dir string, sizeMB int) error {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("disk file: %w", err)
	}
	err = f.Truncate(int64(sizeMB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("disk file: %w", err)
	}
	for _, args := range [][]string{
		{"mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", "-m", "0", file},
		{"mount", "-t", "ext4", "-o", "loop,nodev,nosuid", file, dir},
	} {
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("disk: %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// MountsUnder returns the mount points at or below dir, deepest first, read
// from /proc/self/mountinfo. Tests use it to check for leaks.
func MountsUnder(dir string) ([]string, error) { return mountinfo.Under(dir) }

// unmount unmounts mp, retrying while it is busy (a runtime process may
// still be exiting) and detaching it lazily as a last resort.
func unmount(mp string) error {
	var err error
	for i := 0; i < 20; i++ {
		err = unix.Unmount(mp, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if derr := unix.Unmount(mp, unix.MNT_DETACH); derr == nil {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", mp, err)
}

// removeBoxDir unmounts everything under dir and removes it. It refuses to
// remove anything while a mount remains, so RemoveAll never reaches through
// a mount into the shared image or a host directory.
func removeBoxDir(dir string) error {
	mps, err := MountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mps {
		if err := unmount(mp); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if mps, _ := MountsUnder(dir); len(mps) > 0 {
		return fmt.Errorf("mounts remain under %s: %v", dir, mps)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}
