package firecracker

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestUsage measures a process standing in for Firecracker (this test)
// and a sparse disk copy. The real VMM is untested here (no usable KVM).
func TestUsage(t *testing.T) {
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		// some CPU time to measure
	}
	disk := filepath.Join(t.TempDir(), "rootfs.ext4")
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(2 << 30)
	f.WriteAt(make([]byte, 1<<20), 0)
	f.Close()
	b := &box{data: boxData{ID: "vm1", Pid: os.Getpid(), Disk: disk, MemoryMB: 512}, dead: make(chan struct{})}
	u, err := b.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if u.CPUSeconds <= 0 || u.MemoryBytes < 1<<20 || u.MemoryLimitBytes != 512<<20 || u.CPUs != 0 {
		t.Errorf("process figures: %+v", u)
	}
	if u.DiskBytes < 1<<20 || u.DiskBytes > 4<<20 || u.DiskLimitBytes != 2<<30 {
		t.Errorf("disk: %d of %d", u.DiskBytes, u.DiskLimitBytes)
	}
	b.markDead()
	if _, err := b.Usage(context.Background()); err == nil {
		t.Error("a dead VM was measured")
	}
}
