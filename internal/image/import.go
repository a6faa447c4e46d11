package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Import installs the root filesystem in the tar stream r (plain or gzip,
// e.g. `docker export` output) as the image called name, atomically replacing
// an image of that name.
//
// Extraction is confined to the new rootfs: an entry whose name or hard-link
// target contains ".." fails the import, and every path is resolved with
// os.Root so no symlink (including ones the archive itself created) can lead
// a write outside it. Symlinks are stored verbatim — absolute ones resolve
// inside the sandbox. Device nodes and FIFOs are skipped (sandboxes get their
// own /dev); owners, modes (setuid included), mtimes and security.capability
// xattrs are kept. Import also makes the image's VM form: an ext4 disk of
// the rootfs and a kernel (see ImportOptions.KernelFrom), and records in
// image.json what the image has for a desktop. On error nothing of the new
// image is left.
func Import(ctx context.Context, name string, r io.Reader, imageDir string, opts ImportOptions) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	unlock, err := lockName(imageDir, name)
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	gcName(imageDir, name) // interrupted imports
	tmp, err := newVersion(imageDir, name)
	if err != nil {
		return Image{}, err
	}
	done := false
	defer func() {
		if !done {
			removeWork(tmp)
		}
	}()
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Image{}, err
	}
	if err := extractTar(ctx, r, rootfs); err != nil {
		return Image{}, fmt.Errorf("import image %s: %w", name, err)
	}
	kernelFrom, err := importVM(ctx, imageDir, tmp, opts)
	if err != nil {
		return Image{}, fmt.Errorf("import image %s: %w", name, err)
	}
	img, err := install(imageDir, tmp, Image{Name: name, Source: "import", KernelFrom: kernelFrom, CreatedAt: time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return Image{}, err
	}
	done = true
	return img, nil
}

// ImportOptions tune Import.
type ImportOptions struct {
	// KernelFrom names the installed image whose guest kernel the imported
	// image gets when its tarball has none (boot/vmlinuz-RELEASE with
	// lib/modules/RELEASE): `docker export` output rarely carries a kernel,
	// and the host's own /boot is no good choice — it may be missing (as on
	// cloud VMs) or lack the virtio modules. "" means DefaultKernelFrom,
	// and then an import without it still succeeds, for the container
	// backends only; a KernelFrom named explicitly must exist.
	KernelFrom string
}

// DefaultKernelFrom is the image whose kernel imported images boot with on
// VM backends unless told otherwise: build "desktop" first.
const DefaultKernelFrom = "desktop"

// errEscape is returned for tar entries that try to leave the rootfs.
var errEscape = errors.New("path escapes the image root")

// entryPath turns a tar entry name into a clean path relative to the root,
// "" for the root itself.
func entryPath(name string) (string, error) {
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: %q", errEscape, name)
		}
	}
	p := strings.TrimPrefix(path.Clean("/"+name), "/")
	return p, nil
}

func extractTar(ctx context.Context, r io.Reader, rootfs string) error {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	n := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if n++; n%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if err := extractEntry(root, tr, hdr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	if n == 0 {
		return errors.New("empty archive")
	}
	return nil
}

func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header) error {
	rel, err := entryPath(hdr.Name)
	if err != nil {
		return err
	}
	mode := hdr.FileInfo().Mode()
	if rel == "" {
		if hdr.Typeflag == tar.TypeDir {
			return root.Chmod(".", mode.Perm())
		}
		return nil
	}
	if dir := path.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		fi, err := root.Lstat(rel)
		if err == nil && !fi.IsDir() {
			if err := root.Remove(rel); err != nil {
				return err
			}
		}
		if err != nil || !fi.IsDir() {
			if err := root.Mkdir(rel, 0o700); err != nil {
				return err
			}
		}
	case tar.TypeReg: // the reader reports old-style TypeRegA entries as TypeReg
		if err := removeNonDir(root, rel); err != nil {
			return err
		}
		f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if err == nil {
			if c, ok := hdr.PAXRecords["SCHILY.xattr.security.capability"]; ok {
				err = unix.Fsetxattr(int(f.Fd()), "security.capability", []byte(c), 0)
			}
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := removeNonDir(root, rel); err != nil {
			return err
		}
		return errors.Join(root.Symlink(hdr.Linkname, rel), root.Lchown(rel, hdr.Uid, hdr.Gid))
	case tar.TypeLink:
		target, err := entryPath(hdr.Linkname)
		if err != nil {
			return err
		}
		if target == "" {
			return fmt.Errorf("hard link to the root")
		}
		if err := removeNonDir(root, rel); err != nil {
			return err
		}
		return root.Link(target, rel)
	default:
		// Devices, FIFOs, PAX/GNU extension records: sandboxes get their
		// own /dev, so nothing here needs to exist on disk.
		return nil
	}
	if err := root.Lchown(rel, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	// chown clears setuid, so chmod comes after.
	if err := root.Chmod(rel, mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeDir && !hdr.ModTime.IsZero() {
		return root.Chtimes(rel, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

// removeNonDir removes rel unless it is absent; a directory is an error (a
// tar that replaces a directory with a file is malformed).
func removeNonDir(root *os.Root, rel string) error {
	fi, err := root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("would replace directory %s", rel)
	}
	return root.Remove(rel)
}
