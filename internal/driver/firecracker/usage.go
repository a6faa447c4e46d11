package firecracker

import (
	"context"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hoststat"
)

var _ driver.Meter = (*box)(nil)

// Usage reads the VM's figures from the host, the VMM's own: CPU time
// and resident memory of the Firecracker process (/proc/PID/stat: its
// vCPU threads and its device emulation), the VM's memory size, and the
// blocks its disk copy has allocated against the disk's size. vCPUs are
// not kept in the box's state, so CPUs is 0 (unknown) and the manager
// takes the host's CPUs. Untested on a real VM here (no usable KVM on
// the development machine); the same /proc and file figures are those
// the qemu backend's test checks.
func (b *box) Usage(ctx context.Context) (driver.Usage, error) {
	if isClosed(b.dead) {
		return driver.Usage{}, fmt.Errorf("box %s: not running", b.data.ID)
	}
	p, err := hoststat.ReadProc(b.data.Pid, b.data.StartTime)
	if err != nil {
		return driver.Usage{}, fmt.Errorf("box %s: %w", b.data.ID, err)
	}
	u := driver.Usage{CPUSeconds: p.CPUSeconds, MemoryBytes: p.RSSBytes, MemoryLimitBytes: int64(b.data.MemoryMB) << 20}
	if b.data.Disk != "" {
		if alloc, size, err := hoststat.Allocated(b.data.Disk); err == nil {
			u.DiskBytes, u.DiskLimitBytes = alloc, size
		}
	}
	return u, nil
}
