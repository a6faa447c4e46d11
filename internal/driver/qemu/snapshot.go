package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
	"github.com/cubicle-dev/cubicle/internal/image"
)

// A snapshot is a fork whose copy waits on disk. The VM's vCPUs stop, its
// memory and devices stream to memory.bin in the snapshot's directory,
// its disk overlay and config disk are copied there (reflinks where the
// filesystem can) while nothing writes them, and the VM runs on. The
// kernel and initramfs it booted are copied there first, so that neither
// a new agent binary nor a new kernel in the image touches it. A restore
// is a fork's child made later: the saved VM's command line made for the
// new box's directory, name and TAP, its own copies of the snapshot's
// files, and the saved memory coming in.
//
// The overlay stays backed by the image's disk.ext4, which is not copied
// (it is the whole image); the snapshot records that disk's identity and
// a restore refuses to run over another (driver.ErrSnapshotStale).

// Files of a snapshot directory.
const (
	snapMemory    = "memory.bin"
	snapKernel    = "vmlinuz"
	snapInitramfs = "initrd.img"
)

// snapshotVersion is the version of the snapshot State this driver
// writes.
const snapshotVersion = 1

// snapshotData is the State.Data of a snapshot: what the saved VM's
// command line was made of, which a restored VM's must match.
type snapshotData struct {
	From     string `json:"from"` // the saved box's ID
	Machine  string `json:"machine"`
	KVM      bool   `json:"kvm"`
	VCPUs    int    `json:"vcpus"`
	MemoryMB int    `json:"memory_mb"`
	Image    string `json:"image"` // image directory whose disk.ext4 backs the overlay
	Base     fileID `json:"base"`  // that disk as it was
}

// fileID tells one version of a file from another: a rebuilt image's disk
// is a new file (another inode) or at least written again (another
// mtime).
type fileID struct {
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
}

func idOf(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{Ino: st.Ino, Size: st.Size, MtimeNS: st.Mtim.Nano()}, nil
}

var _ driver.Snapshotter = (*Driver)(nil)

// CanSnapshot returns nil: QEMU migrates to a file on every host.
func (d *Driver) CanSnapshot(ctx context.Context) error { return nil }

// Snapshot saves the running VM b into dir, and lets it run on.
func (d *Driver) Snapshot(ctx context.Context, parent driver.Box, dir string) (driver.Snapshot, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	b, err := d.lockCopyable(parent, "snapshot")
	if err != nil {
		return driver.Snapshot{}, err
	}
	defer b.mu.Unlock()
	id, bdir := b.data.ID, b.data.Dir
	fail := func(err error) (driver.Snapshot, error) {
		return driver.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if strings.ContainsAny(dir, "'\n") {
		return fail(fmt.Errorf("snapshot directory %q holds a quote", dir))
	}
	data := snapshotData{From: id, Machine: d.cfg.Machine, KVM: b.data.KVM, Image: b.data.Image}
	if data.VCPUs, err = argInt(b.data.Argv, "-smp"); err != nil {
		return fail(err)
	}
	if data.MemoryMB, err = argInt(b.data.Argv, "-m"); err != nil {
		return fail(err)
	}
	kernel := argAfter(b.data.Argv, "-kernel")
	if kernel == "" {
		return fail(errors.New("the VM's command line names no kernel"))
	}
	vm, err := image.LookupVM(b.data.Image)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", driver.ErrCannotCopy, err))
	}
	if data.Base, err = idOf(vm.Disk); err != nil {
		return fail(fmt.Errorf("the image's disk: %w", err))
	}
	// What does not change while the VM runs is copied before it stops.
	for src, dst := range map[string]string{kernel: snapKernel, b.data.Initramfs: snapInitramfs} {
		if _, err := hostfile.Clone(src, filepath.Join(dir, dst)); err != nil {
			return fail(err)
		}
	}
	if err := d.snapshotInto(ctx, b, filepath.Join(dir, snapMemory), func() error {
		for _, f := range []string{"overlay.qcow2", "config.img"} {
			if _, err := hostfile.Clone(filepath.Join(bdir, f), filepath.Join(dir, f)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	// The caller records the snapshot as there once this returns: it must
	// be on disk by then, whatever happens to the host next.
	for _, f := range []string{snapMemory, "overlay.qcow2", "config.img", snapKernel, snapInitramfs, ""} {
		if err := hostfile.Sync(filepath.Join(dir, f)); err != nil {
			return fail(err)
		}
	}
	raw, _ := json.Marshal(data) // plain struct: cannot fail
	return driver.Snapshot{
		State: driver.State{Version: snapshotVersion, Driver: d.Name(), Data: raw},
		Bytes: hostfile.DiskBytes(dir),
		VCPUs: data.VCPUs, MemoryMB: data.MemoryMB,
	}, nil
}

// Restore starts a new VM of spec from the snapshot s in dir.
func (d *Driver) Restore(ctx context.Context, s driver.State, dir string, spec driver.Spec) (_ driver.Box, err error) {
	if s.Driver != d.Name() || s.Version != snapshotVersion {
		return nil, fmt.Errorf("restore: a snapshot of driver %q version %d is not one of this driver's", s.Driver, s.Version)
	}
	var data snapshotData
	if err := json.Unmarshal(s.Data, &data); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := validID(spec.ID); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	id := spec.ID
	if len(spec.Volumes) > 0 {
		return nil, fmt.Errorf("restore %s: a box from a snapshot cannot have volumes", id)
	}
	if data.Machine != d.cfg.Machine {
		return nil, fmt.Errorf("restore %s: %w: it was taken of a %s machine, and this daemon runs %s", id, driver.ErrSnapshotStale, data.Machine, d.cfg.Machine)
	}
	if strings.ContainsAny(dir, "'\n") {
		return nil, fmt.Errorf("restore %s: snapshot directory %q holds a quote", id, dir)
	}
	vm, err := image.LookupVM(data.Image)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w: %v", id, driver.ErrSnapshotStale, err)
	}
	if now, err := idOf(vm.Disk); err != nil || now != data.Base {
		return nil, fmt.Errorf("restore %s: %w (%s was rebuilt or replaced)", id, driver.ErrSnapshotStale, vm.Disk)
	}
	for _, f := range []string{snapMemory, "overlay.qcow2", "config.img", snapKernel, snapInitramfs} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil, fmt.Errorf("restore %s: the snapshot is incomplete: %w", id, err)
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	spec.VCPUs, spec.MemoryMB = data.VCPUs, data.MemoryMB
	spec = withDefaults(spec)
	cd := d.boxDir(id)
	if err := os.Mkdir(cd, 0o700); err != nil {
		return nil, fmt.Errorf("restore %s: %w", id, err)
	}
	var cb *box
	defer func() {
		if err == nil {
			return
		}
		if cb != nil {
			_ = cb.Stop(context.WithoutCancel(ctx))
		}
		os.RemoveAll(cd)
	}()
	for _, f := range []string{"overlay.qcow2", "config.img", snapKernel, snapInitramfs} {
		if _, err := hostfile.Clone(filepath.Join(dir, f), filepath.Join(cd, f)); err != nil {
			return nil, fmt.Errorf("restore %s: %w", id, err)
		}
	}
	saved := boxData{Image: data.Image, Initramfs: filepath.Join(cd, snapInitramfs), KVM: data.KVM}
	cb, err = d.startCopy(ctx, saved, spec, cd, filepath.Join(cd, snapKernel), filepath.Join(dir, snapMemory))
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", id, err)
	}
	return cb, nil
}

// argAfter returns the argument that follows flag in argv, or "".
func argAfter(argv []string, flag string) string {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == flag {
			return argv[i+1]
		}
	}
	return ""
}

// argInt is argAfter read as a positive number.
func argInt(argv []string, flag string) (int, error) {
	n, err := strconv.Atoi(argAfter(argv, flag))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("the VM's command line has no valid %s", flag)
	}
	return n, nil
}
