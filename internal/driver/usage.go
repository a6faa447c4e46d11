package driver

import "context"

// Meter is implemented by boxes whose backend can measure, from the host,
// what they use of it. The manager samples it on a schedule (every few
// seconds), so Usage must be cheap: a few small file reads, no call into
// the box and nothing that grows with what the box holds (a tree walk is
// cached; see internal/driver/hoststat).
type Meter interface {
	// Usage returns the box's figures now. A figure the backend cannot
	// tell is zero; an error means none could be read (the box is going).
	Usage(ctx context.Context) (Usage, error)
}

// Usage is what one box uses of the host at one moment, as its backend
// sees it from outside the box. Network figures are not here: the
// network device belongs to internal/netpool, which reports NetUsage.
type Usage struct {
	// CPUSeconds is the CPU time the box has used since it started, user
	// and system, all its host processes and threads together (its
	// cgroup's, or its VMM process's). It only grows while the box lives;
	// a box resumed from a pause starts again from zero.
	CPUSeconds float64
	// CPUs is how many CPUs' worth of time the box may use: its CPU quota
	// or vCPU count, at most the host's CPUs; 0 when unknown.
	CPUs float64
	// MemoryBytes is the memory the box holds now, less the page cache
	// the kernel can drop at once (inactive file pages), as docker stats
	// counts it; for a VM, the VMM's resident set.
	MemoryBytes int64
	// MemoryCacheBytes is the page cache within MemoryBytes' cgroup (file
	// pages, shared memory included); 0 for a VM, whose cache is inside
	// the guest.
	MemoryCacheBytes int64
	// MemoryLimitBytes is the most memory the box may hold (its cgroup
	// limit, or the VM's memory size); 0 when unlimited or unknown.
	MemoryLimitBytes int64
	// DiskBytes is what the box's own writable disk holds: its writable
	// layer (OCI) or the blocks its copy-on-write disk has allocated
	// (VMs); the shared, read-only image is not counted.
	DiskBytes int64
	// DiskLimitBytes is the size of that disk, the most the box can
	// write; 0 when unbounded.
	DiskLimitBytes int64
}

// NetUsage are the counters of a box's network device, seen from the
// box: Rx is what the box received, Tx what it sent (the host end of
// its veth or TAP counts them the other way round). They start at zero
// when the device is made and only grow.
type NetUsage struct {
	RxBytes, TxBytes     uint64
	RxPackets, TxPackets uint64
}
