package firecracker

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
)

// makeDisk writes a sparse file of size bytes with data blocks every
// `every` bytes.
func makeDisk(t testing.TB, path string, size, every int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	block := bytes.Repeat([]byte{0xab}, 64<<10)
	for off := int64(0); off < size; off += every {
		if _, err := f.WriteAt(block, off); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCloneFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "disk.ext4")
	makeDisk(t, src, 32<<20, 4<<20)
	dst := filepath.Join(dir, "copy.ext4")
	method, err := hostfile.Clone(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clone method on this filesystem: %s", method)
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs")
	}
	var st unix.Stat_t
	unix.Stat(dst, &st)
	if method == hostfile.CloneSparse && st.Blocks*512 > 2*(8*64<<10)+(1<<20) {
		t.Errorf("sparse copy allocates %d bytes for 512 KiB of data", st.Blocks*512)
	}
	// Writing the copy leaves the source alone.
	os.WriteFile(dst, []byte("changed"), 0o600)
	if a2, _ := os.ReadFile(src); !bytes.Equal(a, a2) {
		t.Error("source changed")
	}
	if _, err := hostfile.Clone(src, dst); err == nil {
		t.Error("clone over an existing file succeeded")
	}
}

func TestLinkOrCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "vmlinux")
	os.WriteFile(src, []byte("kernel"), 0o644)
	if err := linkOrCopy(src, filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(dir, "private")
	os.WriteFile(private, []byte("kernel"), 0o600)
	dst := filepath.Join(dir, "p")
	if err := linkOrCopy(private, dst); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(dst)
	if fi.Mode().Perm() != 0o444 || os.SameFile(fi, mustStat(t, private)) {
		t.Errorf("unreadable kernel linked, not copied world-readable: %v", fi.Mode())
	}
}

func mustStat(t *testing.T, p string) os.FileInfo {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// BenchmarkDiskCopy measures the per-VM disk copy of a 1 GiB image with
// 256 MiB of data (the shape of a packed ext4 image) by each method that
// works on the filesystem of $CUBICLE_BENCH_DIR (default: the test's temp
// dir): cloneFile (reflink, else sparse copy) and `cp --reflink=auto
// --sparse=always` for comparison.
func BenchmarkDiskCopy(b *testing.B) {
	dir := os.Getenv("CUBICLE_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	} else {
		var err error
		if dir, err = os.MkdirTemp(dir, "fcbench"); err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	src := filepath.Join(dir, "disk.ext4")
	makeDisk(b, src, 1<<30, 256<<10) // 64 KiB of every 256 KiB: 256 MiB of data
	b.Run("cloneFile", func(b *testing.B) {
		var method string
		for i := 0; b.Loop(); i++ {
			dst := filepath.Join(dir, fmt.Sprint("c", i))
			m, err := hostfile.Clone(src, dst)
			if err != nil {
				b.Fatal(err)
			}
			method = m
			b.StopTimer()
			os.Remove(dst)
			b.StartTimer()
		}
		b.Logf("method: %s", method)
	})
	b.Run("cp", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			dst := filepath.Join(dir, fmt.Sprint("p", i))
			if out, err := exec.Command("cp", "--reflink=auto", "--sparse=always", src, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp: %v: %s", err, out)
			}
			b.StopTimer()
			os.Remove(dst)
			b.StartTimer()
		}
	})
}
