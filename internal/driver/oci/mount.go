package oci

import (
	"errors"
	"fmt"
	"os"
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
