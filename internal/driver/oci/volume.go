package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// AttachesVolumes reports that OCI boxes mount volumes (driver.VolumeAttacher).
func (d *Driver) AttachesVolumes() bool { return true }

// volumeDir is where a box's volume is mounted on the host, under the
// box's directory: unmounting everything below the directory (Stop,
// Cleanup) detaches the volume with the rest, and the volume's file,
// which lives elsewhere, is never under what is removed.
func volumeDir(boxDir, name string) string { return filepath.Join(boxDir, "volumes", name) }

// mountVolumes mounts each volume's filesystem image at its place under
// the box's directory, fills a new one from the image, and makes its
// mount point in the box's rootfs.
func mountVolumes(ctx context.Context, boxDir, image, rootfs string, vols []driver.Volume) error {
	for _, v := range vols {
		mp := volumeDir(boxDir, v.Name)
		if err := os.MkdirAll(mp, 0o700); err != nil {
			return err
		}
		if err := mountVolume(ctx, v.File, mp); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if err := seedVolume(ctx, mp, image, v.Path); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		root, err := os.OpenRoot(rootfs)
		if err != nil {
			return err
		}
		err = root.MkdirAll(strings.TrimPrefix(v.Path, "/"), 0o755)
		root.Close()
		if err != nil {
			return fmt.Errorf("volume %s: mount point %s: %w", v.Name, v.Path, err)
		}
	}
	return nil
}

// mountVolume mounts the ext4 image file at dir through a loop device.
// It refuses a file some loop device already holds: two mounts of one
// ext4 filesystem corrupt it, whatever the manager believes.
func mountVolume(ctx context.Context, file, dir string) error {
	out, err := exec.CommandContext(ctx, "losetup", "-j", file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("losetup -j: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		return fmt.Errorf("its disk is in use on the host (%s)", s)
	}
	if out, err := exec.CommandContext(ctx, "mount", "-t", "ext4", "-o", "loop,nodev,nosuid", file, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mount: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// seedVolume gives a new volume what the image has at path, the way a
// container engine fills an empty named volume: a profile volume at
// /home/user starts as the image's home directory (settings, ownership),
// not as an empty root-owned directory the user cannot write. A volume
// is new while it holds nothing but mkfs's lost+found. The image's path
// is used only if no part of it is a symbolic link, which would lead out
// of the image on the host.
func seedVolume(ctx context.Context, mp, image, path string) error {
	ents, err := os.ReadDir(mp)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() != "lost+found" {
			return nil // in use before: keep it as it is
		}
	}
	if err := os.Remove(filepath.Join(mp, "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	src := image
	for _, part := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		src = filepath.Join(src, part)
		fi, err := os.Lstat(src)
		if err != nil || !fi.IsDir() {
			return nil // not a plain directory in the image: start empty
		}
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--no-dereference", src+"/.", mp+"/").CombinedOutput(); err != nil {
		return fmt.Errorf("fill from the image's %s: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if err := os.Lchown(mp, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return os.Chmod(mp, fi.Mode().Perm())
}

// volumeMounts are the bind mounts that put the box's volumes at their
// paths.
func volumeMounts(boxDir string, vols []driver.Volume) []specs.Mount {
	var out []specs.Mount
	for _, v := range vols {
		out = append(out, specs.Mount{
			Destination: v.Path, Type: "bind", Source: volumeDir(boxDir, v.Name),
			Options: []string{"rbind", "rw", "nosuid", "nodev"},
		})
	}
	return out
}
