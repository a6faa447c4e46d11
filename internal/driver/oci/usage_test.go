package oci

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestUsage reads a box's figures from a cgroup v2 tree of the test's own
// and its writable layer without a disk limit (a plain directory).
func TestUsage(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"cgroup.controllers":           "cpu memory pids\n",
		"cubicle/box1/cpu.stat":        "usage_usec 7250000\n",
		"cubicle/box1/cpu.max":         "100000 100000\n",
		"cubicle/box1/memory.current":  "104857600\n",
		"cubicle/box1/memory.stat":     "file 1048576\ninactive_file 524288\n",
		"cubicle/box1/memory.max":      "2147483648\n",
		"cubicle/other/memory.current": "1\n",
	}
	for p, c := range files {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := cgroupRoot
	cgroupRoot = root
	defer func() { cgroupRoot = old }()

	dir := t.TempDir()
	upper := filepath.Join(dir, "layer", "upper")
	if err := os.MkdirAll(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, "written"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &box{data: boxData{ID: "box1", Dir: dir}, dead: make(chan struct{})}
	u, err := b.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if u.CPUSeconds != 7.25 || u.CPUs != 1 || u.MemoryBytes != 104857600-524288 || u.MemoryCacheBytes != 1<<20 || u.MemoryLimitBytes != 2<<30 {
		t.Errorf("cgroup figures: %+v", u)
	}
	if u.DiskBytes < 1<<20 || u.DiskBytes > 2<<20 || u.DiskLimitBytes != 0 {
		t.Errorf("a layer holding a 1 MiB file, without a disk limit: %d bytes, limit %d", u.DiskBytes, u.DiskLimitBytes)
	}
	b.markDead()
	if _, err := b.Usage(context.Background()); err == nil {
		t.Error("a dead box was measured")
	}
	gone := &box{data: boxData{ID: "nosuchbox", Dir: dir}, dead: make(chan struct{})}
	if _, err := gone.Usage(context.Background()); err == nil {
		t.Error("a box without a cgroup was measured")
	}
}
