package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
)

// Fork and snapshots of gVisor boxes are a pause that does not end the
// box: the box is saved as a pause saves it (save, in pause.go: the
// agent lets go of its host socket, runsc pause, checkpoint
// --leave-running), then thawed, and each copy is `runsc restore` of
// that image into a box of its own — its own directory, writable layer,
// bundle, network namespace and agent socket.
//
// The image holds the whole box, its files too: runsc's default root
// overlay (--overlay2=root:self) keeps everything the box writes to its
// root filesystem in the Sentry's memory (backed by a file in the rootfs
// directory), and a checkpoint saves that memory. A copy's rootfs is a
// fresh overlay of the same image directory, so what the copy finds
// below the Sentry's overlay is what its parent found, but the network
// files (/etc/hosts, /etc/hostname, resolv.conf) are its own. runsc reads
// the network namespace's interfaces again at a restore, so a copy
// answers on its own address and MAC from its first instruction
// (identity.renumber then finds nothing to move). What else is the
// parent's in the copy's memory (its agent token, hostname, machine-id,
// random state) the manager re-keys before anyone can reach it.
//
// runc boxes are not copied: that is CRIU, which cannot run on these
// hosts (criu.go).

// snapshotImage is the checkpoint's directory inside a snapshot's
// directory.
const snapshotImage = "checkpoint"

var (
	_ driver.Forker      = (*Driver)(nil)
	_ driver.Snapshotter = (*Driver)(nil)
)

// canCopy returns nil for gVisor, and why not for runc.
func (d *Driver) canCopy(ctx context.Context, what string) error {
	if d.isRunsc() {
		return nil
	}
	if err := d.criu.check(ctx); err != nil {
		return fmt.Errorf("a runc box would %s through CRIU (runc checkpoint), as it would pause: %w", what, err)
	}
	return fmt.Errorf("runc boxes are not copied (%s needs CRIU, which cubicle does not drive); gvisor and qemu copy", what)
}

// CanFork returns nil for gVisor, and why not for runc.
func (d *Driver) CanFork(ctx context.Context) error { return d.canCopy(ctx, "fork") }

// CanSnapshot returns nil for gVisor, and why not for runc.
func (d *Driver) CanSnapshot(ctx context.Context) error { return d.canCopy(ctx, "snapshot") }

// boxOf is db as this driver's watched box (an adopted box once its
// runtime has said it runs), or nil.
func (d *Driver) boxOf(db driver.Box) *box {
	b, ok := db.(*box)
	if !ok {
		if u, isUnsure := db.(*unsureBox); isUnsure {
			u.mu.Lock()
			b = u.inner
			u.mu.Unlock()
		}
	}
	if b == nil || b.d != d {
		return nil
	}
	return b
}

// running returns db as this driver's watched box that runs.
func (d *Driver) running(db driver.Box, what string) (*box, error) {
	b := d.boxOf(db)
	if b == nil {
		return nil, fmt.Errorf("%s: %w: not a running box of this driver (the runtime has not said it runs)", what, driver.ErrCannotCopy)
	}
	return b, nil
}

// copyOut saves the running box b into img and lets it run on, its agent
// listening again; the caller holds b.mu. On error b runs on and img is
// gone.
func (d *Driver) copyOut(ctx context.Context, b *box, img string) error {
	if b.stopped || isClosed(b.dead) {
		return errors.New("the box is not running")
	}
	if err := d.save(ctx, b, img); err != nil {
		return err
	}
	if err := d.unfreeze(b, nil); err != nil {
		return d.thaw(ctx, b, img, err)
	}
	if err := d.thaw(ctx, b, "", nil); err != nil {
		os.RemoveAll(img)
		return err
	}
	return nil
}

// Fork copies the running gVisor box parent into one new box per child
// spec.
func (d *Driver) Fork(ctx context.Context, parent driver.Box, children []driver.Spec) (_ []driver.Box, err error) {
	if err := d.CanFork(ctx); err != nil {
		return nil, err
	}
	if len(children) == 0 {
		return nil, nil
	}
	b, err := d.running(parent, "fork")
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	for i := range children {
		if err := validID(children[i].ID); err != nil {
			return nil, fmt.Errorf("fork %s: child %d: %w", b.data.ID, i, err)
		}
		if len(children[i].Volumes) > 0 {
			return nil, fmt.Errorf("fork %s: a child cannot have volumes: one sandbox at a time holds a volume", b.data.ID)
		}
	}
	// The parent's lock is held until every child runs: the image is in
	// the parent's directory, where a pause would write its own (the
	// name a pause uses, so that a daemon killed meanwhile leaves what
	// Adopt cleans).
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.data.ID
	sp, err := b.spec()
	if err != nil {
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	img := filepath.Join(b.data.Dir, checkpointDir)
	if err := d.copyOut(ctx, b, img); err != nil {
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	defer os.RemoveAll(img)
	for i := range children {
		children[i].Shape = shapeOf(sp, b.data.Image, children[i].Net)
	}
	boxes, err := d.startCopies(ctx, img, children)
	if err != nil {
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	return boxes, nil
}

// startCopies restores img into one box per spec, at once, and returns
// them all, or none.
func (d *Driver) startCopies(ctx context.Context, img string, all []driver.Spec) ([]driver.Box, error) {
	out := make([]driver.Box, len(all))
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, spec := range all {
		wg.Go(func() {
			b, err := d.restoreCopy(ctx, img, spec)
			if err != nil {
				errs[i] = fmt.Errorf("copy %s: %w", spec.ID, err)
				return
			}
			out[i] = b
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, b := range out {
			if b != nil {
				_ = b.Stop(context.WithoutCancel(ctx))
			}
		}
		return nil, err
	}
	return out, nil
}

// restoreCopy starts box spec (whose Shape is the saved box's) from the
// checkpoint img and waits until its agent answers. On error nothing of
// it is left.
func (d *Driver) restoreCopy(ctx context.Context, img string, spec driver.Spec) (_ *box, err error) {
	if spec.Net != nil && spec.Net.Netns == "" {
		return nil, fmt.Errorf("a gVisor box needs a network namespace to join, got TAP %q", spec.Net.TAP)
	}
	spec = withDefaults(spec)
	if fi, err := os.Stat(filepath.Join(spec.Image, "etc")); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: image %s is gone", driver.ErrSnapshotStale, spec.Image)
	}
	teardown := context.WithoutCancel(ctx)
	var cu cleanup.Stack
	defer cu.Run()
	dir, bundle, err := d.prepare(ctx, spec, &cu)
	if err != nil {
		return nil, err
	}
	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer console.Close()
	pidFile := filepath.Join(dir, "pid")
	cu.Add(func() { d.deleteContainer(teardown, spec.ID) })
	netns := ""
	if spec.Net != nil {
		netns = spec.Net.Netns
	}
	// Not killed when ctx ends, as Create's run is not.
	rctx, cancel := context.WithTimeout(teardown, 2*time.Minute)
	defer cancel()
	cmd := d.commandNet(rctx, netns, "restore", "--detach", "--image-path", img, "--pid-file", pidFile, "--bundle", bundle, spec.ID)
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s restore: %w\n%s", d.cfg.Runtime, err, hostfile.Tail(filepath.Join(dir, "console.log"), 20))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pid, err := hostfile.ReadPid(pidFile)
	if err != nil {
		return nil, err
	}
	b := newBox(d, d.dataOf(spec, dir, pid))
	cu.Add(func() { b.stopWatch() })
	// The saved agent had let go of its socket: it listens on the
	// copy's own socket once told to.
	if err := d.relisten(ctx, b); err != nil {
		return nil, fmt.Errorf("agent: %w\n%s", err, hostfile.Tail(filepath.Join(dir, "console.log"), 20))
	}
	cu.Release()
	return b, nil
}

// spec reads the box's OCI config from its bundle.
func (b *box) spec() (*specs.Spec, error) {
	raw, err := os.ReadFile(filepath.Join(b.data.Dir, "bundle", "config.json"))
	if err != nil {
		return nil, err
	}
	var sp specs.Spec
	if err := json.Unmarshal(raw, &sp); err != nil {
		return nil, fmt.Errorf("the bundle's config.json: %w", err)
	}
	return &sp, nil
}

// shapeOf is the Shape of the box whose OCI config is sp, started on
// image, with network n: a copy must have its parent's (the validation
// of runsc restore compares the two configs), whatever it asked for.
func shapeOf(sp *specs.Spec, image string, n *driver.Net) driver.Shape {
	sh := driver.Shape{Image: image, Net: n}
	if sp.Linux == nil || sp.Linux.Resources == nil {
		return sh
	}
	r := sp.Linux.Resources
	if r.Memory != nil && r.Memory.Limit != nil {
		sh.MemoryMB = int(*r.Memory.Limit >> 20)
	}
	if r.CPU != nil && r.CPU.Quota != nil && r.CPU.Period != nil && *r.CPU.Period > 0 {
		sh.VCPUs = int(*r.CPU.Quota / int64(*r.CPU.Period))
	}
	if r.Pids != nil && r.Pids.Limit != nil {
		sh.PidsLimit = int(*r.Pids.Limit / gvisorPidsFactor)
	}
	return sh
}

// snapData is a snapshot's State data: the saved box, and its shape.
type snapData struct {
	Box       boxData `json:"box"`
	VCPUs     int     `json:"vcpus"`
	MemoryMB  int     `json:"memory_mb"`
	PidsLimit int     `json:"pids_limit"`
}

// Snapshot saves the running gVisor box db into dir and lets it run on.
func (d *Driver) Snapshot(ctx context.Context, db driver.Box, dir string) (driver.Snapshot, error) {
	if err := d.CanSnapshot(ctx); err != nil {
		return driver.Snapshot{}, err
	}
	b, err := d.running(db, "snapshot")
	if err != nil {
		return driver.Snapshot{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.data.ID
	if len(b.data.Volumes) > 0 {
		return driver.Snapshot{}, fmt.Errorf("snapshot %s: %w: it holds volumes, which a snapshot cannot take along", id, driver.ErrCannotCopy)
	}
	sp, err := b.spec()
	if err != nil {
		return driver.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	img := filepath.Join(b.data.Dir, checkpointDir)
	if err := d.copyOut(ctx, b, img); err != nil {
		return driver.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	defer os.RemoveAll(img)
	dst := filepath.Join(dir, snapshotImage)
	if err := moveTree(img, dst); err != nil {
		os.RemoveAll(dst)
		return driver.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	sh := shapeOf(sp, b.data.Image, nil)
	data := snapData{Box: b.data, VCPUs: sh.VCPUs, MemoryMB: sh.MemoryMB, PidsLimit: sh.PidsLimit}
	data.Box.Pid = 0
	raw, _ := json.Marshal(data) // plain struct: cannot fail
	return driver.Snapshot{
		State: driver.State{Version: stateVersion, Driver: d.Name(), Data: raw},
		Bytes: treeBytes(dst), VCPUs: sh.VCPUs, MemoryMB: sh.MemoryMB,
	}, nil
}

// Restore starts a new box of spec from the snapshot s in dir.
func (d *Driver) Restore(ctx context.Context, s driver.State, dir string, spec driver.Spec) (driver.Box, error) {
	if err := d.CanSnapshot(ctx); err != nil {
		return nil, err
	}
	if s.Driver != d.Name() || s.Version != stateVersion {
		return nil, fmt.Errorf("restore: a snapshot of %s (version %d), not of %s", s.Driver, s.Version, d.Name())
	}
	var data snapData
	if err := json.Unmarshal(s.Data, &data); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := validID(spec.ID); err != nil {
		return nil, err
	}
	if len(spec.Volumes) > 0 {
		return nil, fmt.Errorf("restore %s: a box from a snapshot cannot have volumes", spec.ID)
	}
	if data.Box.Image == "" {
		return nil, fmt.Errorf("restore %s: the snapshot names no image", spec.ID)
	}
	img := filepath.Join(dir, snapshotImage)
	if _, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil {
		return nil, fmt.Errorf("restore %s: %w: no checkpoint in %s", spec.ID, driver.ErrSnapshotStale, dir)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	spec.Shape = driver.Shape{Image: data.Box.Image, VCPUs: data.VCPUs, MemoryMB: data.MemoryMB, PidsLimit: data.PidsLimit, Net: spec.Net}
	b, err := d.restoreCopy(ctx, img, spec)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.ID, err)
	}
	return b, nil
}

// moveTree moves directory src to dst: a rename, or a copy and a
// removal where they are on different filesystems.
func moveTree(src, dst string) error {
	err := os.Rename(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return fmt.Errorf("checkpoint holds %s, not a file", e.Name())
		}
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return os.RemoveAll(src)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
