package firecracker

import (
	"os"

	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
)

// linkOrCopy hard-links src at dst (kernels and initramfs are read-only
// and shared) or, across filesystems, copies it, read-only.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		// The link shares src's mode: the jailed VMM, not root, must read it.
		if fi, err := os.Stat(dst); err == nil && fi.Mode().Perm()&0o004 != 0 {
			return nil
		}
		os.Remove(dst)
	}
	if _, err := hostfile.Clone(src, dst); err != nil {
		return err
	}
	return os.Chmod(dst, 0o444)
}
