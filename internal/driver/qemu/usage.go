package qemu

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hoststat"
)

var _ driver.Meter = (*box)(nil)

// Usage reads the VM's figures from the host, the VMM's own: CPU time
// and resident memory of the QEMU process (/proc/PID/stat: the guest's
// vCPU threads, emulated or not, and QEMU's device threads), the VM's
// memory size and vCPUs from the command line that started it, and the
// blocks its qcow2 overlay has allocated against the disk size the
// guest sees. Memory used is QEMU's resident set: guest pages the guest
// has touched and QEMU's own, never less than what the guest uses; the
// guest's page cache is inside it and cannot be told apart from here
// (QMP's query-balloon would need a balloon device the VM does not
// have, and query-memory-size-summary only repeats the size).
func (b *box) Usage(ctx context.Context) (driver.Usage, error) {
	if isClosed(b.dead) {
		return driver.Usage{}, fmt.Errorf("box %s: not running", b.data.ID)
	}
	p, err := hoststat.ReadProc(b.data.Pid, b.data.StartTime)
	if err != nil {
		return driver.Usage{}, fmt.Errorf("box %s: %w", b.data.ID, err)
	}
	u := driver.Usage{CPUSeconds: p.CPUSeconds, MemoryBytes: p.RSSBytes}
	vcpus, memMB := shapeOf(b.data.Argv)
	if host := runtime.NumCPU(); vcpus > host {
		vcpus = host // more vCPUs than host CPUs share them
	}
	u.CPUs = float64(vcpus)
	u.MemoryLimitBytes = int64(memMB) << 20
	overlay := filepath.Join(b.data.Dir, "overlay.qcow2")
	if alloc, _, err := hoststat.Allocated(overlay); err == nil {
		u.DiskBytes = alloc
	}
	if size, err := hoststat.Qcow2Size(overlay); err == nil {
		u.DiskLimitBytes = size
	}
	return u, nil
}

// shapeOf reads the vCPUs (-smp N) and memory in MiB (-m N) from a
// QEMU command line as qemuArgs writes it; 0 for what is not there (a
// box started before boxes kept their command line).
func shapeOf(argv []string) (vcpus, memMB int) {
	for i := 0; i+1 < len(argv); i++ {
		switch argv[i] {
		case "-smp":
			vcpus, _ = strconv.Atoi(argv[i+1])
		case "-m":
			memMB, _ = strconv.Atoi(argv[i+1])
		}
	}
	return max(vcpus, 0), max(memMB, 0)
}
