package vminit

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// volumeStage is where a volume is mounted first, to be filled when new.
const volumeStage = "/run/cubicle-volume"

// mountVolumes mounts each volume's disk (found by its ext4 UUID) at its
// path. A new volume, one that holds nothing but mkfs's lost+found, is
// first filled with what the image has at the path, as container engines
// fill a named volume and the container drivers do: a profile volume at
// /home/user starts as the image's home directory.
func mountVolumes(disks diskFinder, vols []Volume, log *slog.Logger) error {
	for _, v := range vols {
		dev := ""
		for deadline := time.Now().Add(10 * time.Second); dev == "" && time.Now().Before(deadline); {
			if dev = disks.findUUID(v.UUID); dev == "" {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if dev == "" {
			return fmt.Errorf("volume at %s: no disk has the file system %s", v.Path, v.UUID)
		}
		if err := os.MkdirAll(v.Path, 0o755); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
		if err := os.MkdirAll(volumeStage, 0o700); err != nil {
			return err
		}
		if err := mount(dev, volumeStage, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
		filled, err := seed(volumeStage, v.Path)
		if err == nil {
			err = unix.Mount(volumeStage, v.Path, "", unix.MS_MOVE, "")
		}
		if err != nil {
			_ = unix.Unmount(volumeStage, unix.MNT_DETACH)
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
		log.Info("volume mounted", "path", v.Path, "disk", dev, "filled_from_image", filled)
	}
	return nil
}

// seed fills the volume mounted at mp from dir when the volume is new,
// and reports whether it did.
func seed(mp, dir string) (bool, error) {
	ents, err := os.ReadDir(mp)
	if err != nil {
		return false, err
	}
	for _, e := range ents {
		if e.Name() != "lost+found" {
			return false, nil
		}
	}
	if err := os.Remove(filepath.Join(mp, "lost+found")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false, nil
	}
	if err := copyTree(dir, mp); err != nil {
		return false, fmt.Errorf("fill from the image: %w", err)
	}
	return true, copyOwner(mp, fi)
}

// copyTree copies what is under src into the existing directory dst:
// directories, regular files and symbolic links, with their modes and
// owners (anything else, such as a socket, is left out).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." {
			return err
		}
		to := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			if err := os.Mkdir(to, fi.Mode().Perm()); err != nil {
				return err
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFile(p, to, fi.Mode().Perm()); err != nil {
				return err
			}
		default:
			return nil
		}
		return copyOwner(to, fi)
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyOwner gives p the owner of fi, and its mode unless p is a link.
func copyOwner(p string, fi fs.FileInfo) error {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil
	}
	return os.Chmod(p, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}
