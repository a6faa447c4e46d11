package oci

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hoststat"
)

var _ driver.Meter = (*box)(nil)

// cgroupRoot is where Usage looks for the box's cgroup; tests point it
// at a tree of their own.
var cgroupRoot = hoststat.CgroupRoot

// Usage reads the box's figures from the host: CPU and memory from the
// cgroup the spec put it in (cgroupParent/ID, in every hierarchy; runsc
// puts its Sentry, gofer and ptrace stubs there, runc the container's
// processes), and its disk from its writable layer: the ext4 disk
// mounted at layer/ when the box has a disk limit (as df counts it), or
// the blocks under layer/upper otherwise (walked at most once a minute).
func (b *box) Usage(ctx context.Context) (driver.Usage, error) {
	if isClosed(b.dead) {
		return driver.Usage{}, fmt.Errorf("box %s: not running", b.data.ID)
	}
	cg, err := hoststat.ReadCgroup(cgroupRoot, filepath.Join(cgroupParent, b.data.ID))
	if err != nil {
		return driver.Usage{}, fmt.Errorf("box %s: %w", b.data.ID, err)
	}
	u := driver.Usage{
		CPUSeconds: cg.CPUSeconds, CPUs: cg.CPUs,
		MemoryBytes: cg.MemoryBytes, MemoryCacheBytes: cg.MemoryCacheBytes, MemoryLimitBytes: cg.MemoryLimitBytes,
	}
	layer := filepath.Join(b.data.Dir, "layer")
	if used, size, err := hoststat.MountUsage(layer); err == nil {
		u.DiskBytes, u.DiskLimitBytes = used, size
	} else {
		if n, err := b.layerSize.Size(filepath.Join(layer, "upper")); err == nil {
			u.DiskBytes = n
		}
	}
	return u, nil
}
