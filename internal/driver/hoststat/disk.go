package hoststat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// MountUsage returns the bytes used and the size of the filesystem
// mounted at dir, as df counts them. It refuses a dir that is not a
// mount point: statfs would answer for the filesystem beneath, which is
// not the box's.
func MountUsage(dir string) (used, size int64, err error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("disk %s: %w", dir, err)
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return 0, 0, fmt.Errorf("disk %s: %w", dir, err)
	}
	if st.Dev == parent.Dev {
		return 0, 0, fmt.Errorf("disk %s: not a mount point", dir)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return 0, 0, fmt.Errorf("disk %s: %w", dir, err)
	}
	bs := int64(sfs.Bsize)
	return int64(sfs.Blocks-sfs.Bfree) * bs, int64(sfs.Blocks) * bs, nil
}

// Allocated returns the bytes of disk the file at path has allocated
// (its blocks, not its apparent size: a sparse or copy-on-write disk
// costs the host only what was written), and its apparent size.
func Allocated(path string) (allocated, size int64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("disk %s: %w", path, err)
	}
	return st.Blocks * 512, st.Size, nil
}

// TreeSizer measures the blocks a directory tree has allocated (a box's
// writable layer without a disk of its own). A walk costs a stat per
// file and a box decides how many files there are, so the answer is
// kept for Every, and a walk stops after MaxEntries entries (the figure
// is then a lower bound). The zero value is ready to use.
type TreeSizer struct {
	Every      time.Duration // default 60 s
	MaxEntries int           // default 200,000

	mu    sync.Mutex
	dir   string
	at    time.Time
	bytes int64
	err   error
}

// Size returns the allocated bytes of the tree at dir, walking it at
// most once per Every (a dir other than the last one's is walked at
// once).
func (t *TreeSizer) Size(dir string) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	every := t.Every
	if every <= 0 {
		every = time.Minute
	}
	if dir == t.dir && !t.at.IsZero() && time.Since(t.at) < every {
		return t.bytes, t.err
	}
	limit := t.MaxEntries
	if limit <= 0 {
		limit = 200_000
	}
	t.bytes, t.err = treeAllocated(dir, limit)
	t.dir, t.at = dir, time.Now()
	return t.bytes, t.err
}

// maxWalk bounds the time of one walk: it runs on the daemon's sampling
// loop, which other sandboxes' samples wait on.
const maxWalk = time.Second

// errEnough ends a walk at its entry or time limit.
var errEnough = errors.New("entry limit reached")

// treeAllocated sums the blocks of dir and everything under it, without
// following symlinks, counting a file with several links once, for at
// most limit entries and maxWalk.
func treeAllocated(dir string, limit int) (int64, error) {
	var (
		total    int64
		n        int
		seen     = map[[2]uint64]bool{}
		deadline = time.Now().Add(maxWalk)
	)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // a file removed meanwhile, an unreadable directory
		}
		if n++; n > limit {
			return errEnough
		}
		if n%1024 == 0 && time.Now().After(deadline) {
			return errEnough // a partial figure beats a late one
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if d.IsDir() && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			// Swapped for a symlink since it was listed: do not
			// follow it out of the sandbox's layer.
			return fs.SkipDir
		}
		if st.Nlink > 1 && !d.IsDir() {
			k := [2]uint64{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return 0, fmt.Errorf("disk %s: %w", dir, err)
	}
	return total, nil
}

// qcow2Magic starts every qcow2 file: "QFI\xfb".
const qcow2Magic = 0x514649fb

// ParseQcow2Size returns the virtual disk size recorded in a qcow2
// header (its first 32 bytes at least): the size the guest sees.
func ParseQcow2Size(hdr []byte) (int64, error) {
	if len(hdr) < 32 {
		return 0, fmt.Errorf("qcow2 header: %d bytes, want 32", len(hdr))
	}
	if binary.BigEndian.Uint32(hdr[0:4]) != qcow2Magic {
		return 0, errors.New("qcow2 header: bad magic")
	}
	if v := binary.BigEndian.Uint32(hdr[4:8]); v != 2 && v != 3 {
		return 0, fmt.Errorf("qcow2 header: version %d, want 2 or 3", v)
	}
	size := binary.BigEndian.Uint64(hdr[24:32])
	if size > 1<<62 {
		return 0, fmt.Errorf("qcow2 header: implausible size %d", size)
	}
	return int64(size), nil
}

// Qcow2Size reads the virtual size of the qcow2 disk at path.
func Qcow2Size(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("disk %s: %w", path, err)
	}
	defer f.Close()
	hdr := make([]byte, 32)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return 0, fmt.Errorf("disk %s: %w", path, err)
	}
	size, err := ParseQcow2Size(hdr)
	if err != nil {
		return 0, fmt.Errorf("disk %s: %w", path, err)
	}
	return size, nil
}
