package image

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/mountinfo"
)

// unmountUnder detaches every mount at or below dir.
func unmountUnder(dir string) error {
	mps, err := mountinfo.Under(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
