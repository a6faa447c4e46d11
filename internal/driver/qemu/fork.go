package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
)

// A fork is a pause that does not end the VM: the parent's vCPUs stop,
// its memory and devices stream to memory.part in its directory (the
// name a pause uses, so that a daemon killed meanwhile leaves what
// Adopt's thaw already cleans and resumes), its disk overlay and config
// disk are copied (a reflink where the filesystem can) while nothing
// writes them, and the parent runs on. Each child is then the parent's
// QEMU command line made for the child's directory, name and TAP, with
// the stream coming in (-incoming), as a resume is. The children share
// the read-only stream and each has its own overlay, so none sees what
// another writes.

// memoryFork is a child's link to its parent's stream while it loads.
const memoryFork = "memory.fork"

var _ driver.Forker = (*Driver)(nil)

// CanFork returns nil: QEMU migrates to a file on every host.
func (d *Driver) CanFork(ctx context.Context) error { return nil }

// Fork copies the running VM parent into one new VM per child spec.
func (d *Driver) Fork(ctx context.Context, parent driver.Box, children []driver.Spec) (_ []driver.Box, err error) {
	if len(children) == 0 {
		return nil, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	b, err := d.lockCopyable(parent, "fork")
	if err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	id, dir := b.data.ID, b.data.Dir
	for i := range children {
		if err := validID(children[i].ID); err != nil {
			return nil, fmt.Errorf("fork %s: child %d: %w", id, i, err)
		}
		if len(children[i].Volumes) > 0 {
			return nil, fmt.Errorf("fork %s: a child cannot have volumes: one sandbox at a time holds a volume", id)
		}
		children[i] = withDefaults(children[i])
	}
	// The children boot what the parent booted: its kernel and
	// initramfs, which a parent started from a snapshot keeps in its own
	// directory (each child then gets its own copies of them).
	kernel := argAfter(b.data.Argv, "-kernel")
	if kernel == "" {
		return nil, fmt.Errorf("fork %s: the VM's command line names no kernel", id)
	}
	stream := filepath.Join(dir, memoryPart)
	defer os.Remove(stream)
	var made []*box
	var dirs []string
	defer func() {
		if err == nil {
			return
		}
		teardown := context.WithoutCancel(ctx)
		for _, c := range made {
			_ = c.Stop(teardown)
		}
		for _, cd := range dirs {
			os.RemoveAll(cd)
		}
	}()

	// What does not change while the parent runs is set up first.
	saved := make([]boxData, len(children))
	kernels := make([]string, len(children))
	for i, c := range children {
		cd := d.boxDir(c.ID)
		if err := os.Mkdir(cd, 0o700); err != nil {
			return nil, fmt.Errorf("fork %s: child %s: %w", id, c.ID, err)
		}
		dirs = append(dirs, cd)
		saved[i] = b.data
		if kernels[i], err = ownCopy(kernel, dir, cd, snapKernel); err == nil {
			saved[i].Initramfs, err = ownCopy(b.data.Initramfs, dir, cd, snapInitramfs)
		}
		if err != nil {
			return nil, fmt.Errorf("fork %s: child %s: %w", id, c.ID, err)
		}
	}

	// The copy: vCPUs stopped, stream written, disks copied, parent on.
	if err := d.snapshotInto(ctx, b, stream, func() error {
		for i, c := range children {
			cd := dirs[i]
			for _, f := range []string{"overlay.qcow2", "config.img"} {
				if _, err := hostfile.Clone(filepath.Join(dir, f), filepath.Join(cd, f)); err != nil {
					return fmt.Errorf("child %s: %w", c.ID, err)
				}
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}

	for i, c := range children {
		cb, err := d.startCopy(ctx, saved[i], c, dirs[i], kernels[i], stream)
		if cb != nil {
			made = append(made, cb)
		}
		if err != nil {
			return nil, fmt.Errorf("fork %s: child %s: %w", id, c.ID, err)
		}
	}
	out := make([]driver.Box, len(made))
	for i, c := range made {
		out[i] = c
	}
	return out, nil
}

// ownCopy returns the path a child in cd uses for its parent's file
// src: src itself, or, when src is in the parent's directory pdir, a copy
// in cd called name. Nothing of a child's command line may name another
// box's directory (by which that box's processes are found and killed),
// and a child must outlive its parent's directory.
func ownCopy(src, pdir, cd, name string) (string, error) {
	if !strings.HasPrefix(src, pdir+"/") {
		return src, nil
	}
	dst := filepath.Join(cd, name)
	if _, err := hostfile.Clone(src, dst); err != nil {
		return "", err
	}
	return dst, nil
}

// lockCopyable returns parent as a box of d that can be copied (forked
// or snapshotted), locked against Stop and other copies; the caller
// unlocks b.mu. op names the copy in errors.
func (d *Driver) lockCopyable(parent driver.Box, op string) (*box, error) {
	b, ok := parent.(*box)
	if !ok || b.d != d {
		return nil, fmt.Errorf("%s: not a box of this driver", op)
	}
	b.mu.Lock()
	id, dir := b.data.ID, b.data.Dir
	var err error
	switch {
	case b.stopped || isClosed(b.dead):
		err = errors.New("the VM is not running")
	case len(b.data.Argv) == 0:
		err = fmt.Errorf("%w: the VM was started by a cubicled without pause", driver.ErrCannotCopy)
	case strings.ContainsAny(dir, "'\n"):
		err = fmt.Errorf("state directory %q holds a quote", dir)
	}
	if err != nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("%s %s: %w", op, id, err)
	}
	return b, nil
}

// snapshotInto stops b's vCPUs, migrates its memory and devices to
// stream, runs copyDisks (the disks are still and flushed then), and lets b
// run again whatever happened.
func (d *Driver) snapshotInto(ctx context.Context, b *box, stream string, copyDisks func() error) (err error) {
	sock := filepath.Join(b.data.Dir, "qmp.sock")
	q, err := dialQMP(ctx, sock)
	if err != nil {
		return err
	}
	defer func() {
		// The parent runs on, on a connection of its own when ctx is
		// what ended the copy (QMP serves one connection at a time).
		q.Close()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		cq, cerr := dialQMP(cctx, sock)
		if cerr != nil {
			err = errors.Join(err, fmt.Errorf("let the parent run again: %w", cerr))
			return
		}
		defer cq.Close()
		if err != nil {
			// QEMU refuses cont until a cancelled migration has ended.
			_, _ = cq.run("migrate_cancel", nil)
			for cctx.Err() == nil {
				raw, qerr := cq.run("query-migrate", nil)
				var mig struct {
					Status string `json:"status"`
				}
				if qerr != nil || json.Unmarshal(raw, &mig) != nil {
					break
				}
				if st := mig.Status; st == "" || st == "none" || st == "cancelled" || st == "failed" || st == "completed" {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		if _, cerr := cq.run("cont", nil); cerr != nil {
			// A parent that cannot run again is ended rather than left
			// frozen for good: its watcher then reaps it as dead.
			_ = syscall.Kill(b.data.Pid, syscall.SIGKILL)
			err = errors.Join(err, fmt.Errorf("the parent could not run again and was ended: %w", cerr))
		}
	}()
	if _, err := q.run("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
		return err
	}
	if _, err := q.run("stop", nil); err != nil {
		return err
	}
	if _, err := q.run("migrate", map[string]any{"uri": "exec:cat > '" + stream + "'"}); err != nil {
		return err
	}
	if err := waitMigration(ctx, q); err != nil {
		return err
	}
	return copyDisks()
}

// startCopy starts child c in cd from stream, a copy of the VM parent
// describes, and waits until its agent answers.
func (d *Driver) startCopy(ctx context.Context, parent boxData, c driver.Spec, cd, kernel, stream string) (*box, error) {
	args := d.qemuArgs(c, cd, kernel, parent.Initramfs, parent.KVM)
	name := d.cfg.QEMU
	if c.Net != nil && c.Net.Netns != "" {
		args = append([]string{"--net=" + c.Net.Netns, "--", name}, args...)
		name = "nsenter"
	}
	argv := append([]string{name}, args...)
	// The child reads the stream through a link in its own directory:
	// nothing of its command line may name another box's directory, by
	// which the parent's QEMU is found (vmsOf) and killed.
	in := filepath.Join(cd, memoryFork)
	if err := os.Link(stream, in); err != nil {
		// A snapshot's stream on another filesystem than the state
		// directory: QEMU's cat reads through a symbolic link as well.
		if serr := os.Symlink(stream, in); serr != nil {
			return nil, errors.Join(err, serr)
		}
	}
	pid, exited, err := startQEMU(cd, append(argv, "-S", "-incoming", "exec:cat '"+in+"'"))
	if err != nil {
		return nil, err
	}
	data := boxData{ID: c.ID, Pid: pid, Dir: cd, Image: parent.Image, Initramfs: parent.Initramfs, KVM: parent.KVM,
		StartTime: procStartTime(pid), Argv: argv}
	cb := newBox(d, data, exited)
	if err := writeBoxData(data); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return cb, err
	}
	if err := waitIncoming(ctx, cb); err != nil {
		return cb, fmt.Errorf("%w\n%s", err, hostfile.Tail(filepath.Join(cd, "qemu.log"), 5))
	}
	os.Remove(in)
	if err := qmpCommand(ctx, filepath.Join(cd, "qmp.sock"), "cont"); err != nil {
		return cb, err
	}
	kickGuestSession(ctx, cd)
	if err := cb.waitAgentEvery(ctx, 2*time.Second); err != nil {
		return cb, err
	}
	return cb, nil
}
