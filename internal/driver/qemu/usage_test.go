package qemu

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestShapeOf(t *testing.T) {
	for _, tt := range []struct {
		argv         []string
		vcpus, memMB int
	}{
		{[]string{"qemu", "-name", "cubicle-x", "-smp", "2", "-m", "1024", "-append", "console=ttyS0 -m 5"}, 2, 1024},
		{[]string{"nsenter", "--net=/run/netns/x", "--", "qemu", "-m", "2048", "-smp", "4"}, 4, 2048},
		{[]string{"qemu", "-m"}, 0, 0},
		{[]string{"qemu", "-smp", "lots", "-m", "-5"}, 0, 0},
		{nil, 0, 0},
	} {
		if v, m := shapeOf(tt.argv); v != tt.vcpus || m != tt.memMB {
			t.Errorf("shapeOf(%q) = %d, %d; want %d, %d", tt.argv, v, m, tt.vcpus, tt.memMB)
		}
	}
}

// TestUsage measures a process standing in for QEMU (this test) and a
// qcow2 overlay of 8 GiB that has allocated one block.
func TestUsage(t *testing.T) {
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		// some CPU time to measure
	}
	dir := t.TempDir()
	hdr := make([]byte, 104)
	binary.BigEndian.PutUint32(hdr[0:], 0x514649fb)
	binary.BigEndian.PutUint32(hdr[4:], 3)
	binary.BigEndian.PutUint64(hdr[24:], 8<<30)
	if err := os.WriteFile(filepath.Join(dir, "overlay.qcow2"), hdr, 0o600); err != nil {
		t.Fatal(err)
	}
	b := &box{data: boxData{ID: "vm1", Pid: os.Getpid(), Dir: dir, Argv: []string{"qemu", "-smp", "64", "-m", "1024"}}, dead: make(chan struct{})}
	u, err := b.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if u.CPUSeconds <= 0 || u.MemoryBytes < 1<<20 || u.MemoryLimitBytes != 1<<30 || u.CPUs != float64(runtime.NumCPU()) {
		t.Errorf("process figures: %+v (64 vCPUs count as the host's %d)", u, runtime.NumCPU())
	}
	if u.DiskBytes <= 0 || u.DiskBytes > 64<<10 || u.DiskLimitBytes != 8<<30 {
		t.Errorf("disk: %d of %d", u.DiskBytes, u.DiskLimitBytes)
	}
	b.data.StartTime = 1 // not this process's start time: a reused pid
	if _, err := b.Usage(context.Background()); err == nil {
		t.Error("a process with another start time was measured")
	}
	b.markDead()
	if _, err := b.Usage(context.Background()); err == nil {
		t.Error("a dead VM was measured")
	}
}
