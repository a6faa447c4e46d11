package hostfile

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Ways Clone made a copy.
const (
	// CloneReflink is FICLONE: every block shared, instant.
	CloneReflink = "reflink"
	// CloneSparse is a copy of the data extents, holes kept.
	CloneSparse = "sparse-copy"
)

// Clone makes dst (created, mode 0600) a private copy of src that the
// VM may write without touching src. It tries a reflink first (FICLONE:
// XFS, btrfs, bcachefs — constant time, no space used until written) and
// falls back to a sparse copy: only the data extents (SEEK_DATA/SEEK_HOLE)
// are copied, with copy_file_range, which itself shares blocks where the
// filesystem can. It returns which method was used. On error dst is
// removed.
func Clone(src, dst string) (method string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return CloneReflink, nil
	}
	fi, err := in.Stat()
	if err != nil {
		return "", err
	}
	if err := sparseCopy(in, out, fi.Size()); err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	return CloneSparse, nil
}

// sparseCopy copies the data extents of in (size bytes) to the same
// offsets of out and sizes out to match, leaving holes as holes.
func sparseCopy(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		}
		if err != nil {
			// No SEEK_DATA support: copy everything.
			return plainCopy(in, out, off, size)
		}
		end, err := unix.Seek(ifd, start, unix.SEEK_HOLE)
		if err != nil {
			end = size
		}
		for pos := start; pos < end; {
			roff, woff := pos, pos
			n, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(min(end-pos, 1<<30)), 0)
			if err != nil {
				if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
					return plainCopy(in, out, pos, size)
				}
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			pos += int64(n)
		}
		off = end
	}
	return nil
}

// plainCopy copies in[off:size] to out at the same offsets.
func plainCopy(in, out *os.File, off, size int64) error {
	_, err := io.Copy(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, size-off))
	return err
}
