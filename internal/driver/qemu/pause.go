package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
)

// Pause and resume are QEMU's own migration, to a file: a paused VM is
// its directory (disk overlay, config disk) plus memory.bin, the
// migration stream of its RAM and device state, and no process. Resume
// starts the VM's exact command line again with the stream coming in
// (-incoming), so every device, the agent's virtio-serial port and the
// TAP reattach as they were.
//
// The order of the steps is what keeps a daemon killed at any point
// from losing or corrupting a VM:
//
//   - Pause: vCPUs stop, the stream is written to memory.part, synced
//     and renamed to memory.bin, QEMU quits, and only then box.json
//     says paused. A daemon killed before QEMU quits leaves a running
//     VM with its vCPUs stopped, which Adopt thaws (and removes the
//     stream, which the disk is about to outgrow).
//   - Resume: QEMU starts with -S (vCPUs held), loads the stream, and
//     only once it is loaded is memory.bin renamed to memory.resumed
//     and box.json rewritten, then the vCPUs run. A stream is never
//     loaded after the disk went on without it: from the moment the
//     VM runs, memory.bin is gone, and a later Resume adopts the VM it
//     finds running instead.
const (
	memoryFile    = "memory.bin"
	memoryPart    = "memory.part"
	memoryResumed = "memory.resumed"
)

var _ driver.Pauser = (*Driver)(nil)

// CanPause returns nil: QEMU migrates to a file on every host.
func (d *Driver) CanPause(ctx context.Context) error { return nil }

// Pause saves the VM's memory and devices to memory.bin and ends QEMU.
func (d *Driver) Pause(ctx context.Context, db driver.Box) (driver.Paused, error) {
	b, ok := db.(*box)
	if !ok || b.d != d {
		return driver.Paused{}, errors.New("pause: not a box of this driver")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	id, dir := b.data.ID, b.data.Dir
	if b.stopped || isClosed(b.dead) {
		return driver.Paused{}, fmt.Errorf("pause %s: the VM is not running", id)
	}
	if len(b.data.Argv) == 0 {
		return driver.Paused{}, fmt.Errorf("pause %s: the VM was started by a cubicled without pause; it cannot be paused", id)
	}
	if strings.ContainsAny(dir, "'\n") {
		return driver.Paused{}, fmt.Errorf("pause %s: state directory %q holds a quote", id, dir)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	// The host's end of the agent channel goes first: its streams
	// would not survive the VM's restart anyway.
	b.resetSession(b.currentSession())
	q, err := dialQMP(ctx, filepath.Join(dir, "qmp.sock"))
	if err != nil {
		return driver.Paused{}, fmt.Errorf("pause %s: %w", id, err)
	}
	defer q.Close()
	part := filepath.Join(dir, memoryPart)
	fail := func(err error) (driver.Paused, error) {
		// The VM goes on as it was: the stream is not used. On a
		// connection of its own, since ctx may be what ended the pause
		// (QMP serves one connection at a time: this one goes first).
		q.Close()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if cq, cerr := dialQMP(cctx, filepath.Join(dir, "qmp.sock")); cerr != nil {
			err = errors.Join(err, cerr)
		} else {
			_, _ = cq.run("migrate_cancel", nil)
			if _, cerr := cq.run("cont", nil); cerr != nil {
				err = errors.Join(err, cerr)
			}
			cq.Close()
		}
		os.Remove(part)
		return driver.Paused{}, fmt.Errorf("pause %s: %w", id, err)
	}
	// QEMU's default cap of 32 MiB/s is for live migration over a
	// network; to a local file, with the vCPUs stopped, the disk is
	// the only limit.
	if _, err := q.run("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
		return fail(err)
	}
	if _, err := q.run("stop", nil); err != nil {
		return fail(err)
	}
	if _, err := q.run("migrate", map[string]any{"uri": "exec:cat > '" + part + "'"}); err != nil {
		return fail(err)
	}
	if err := waitMigration(ctx, q); err != nil {
		return fail(err)
	}
	if err := hostfile.Sync(part); err != nil {
		return fail(err)
	}
	if err := os.Rename(part, filepath.Join(dir, memoryFile)); err != nil {
		return fail(err)
	}
	if err := hostfile.Sync(dir); err != nil {
		os.Rename(filepath.Join(dir, memoryFile), part)
		return fail(err)
	}
	// Saved: from here on QEMU only has to go.
	_, _ = q.run("quit", nil)
	select {
	case <-b.dead:
	case <-time.After(10 * time.Second):
		_ = unix.Kill(b.data.Pid, unix.SIGKILL)
	}
	if !waitGone(b.data.Pid, b.data.StartTime, 10*time.Second) {
		return driver.Paused{}, fmt.Errorf("pause %s: qemu pid %d still alive after SIGKILL", id, b.data.Pid)
	}
	b.stopWatch()
	b.stopped = true // the directory is the paused box's now: Stop must not remove it
	data := b.data
	data.Paused, data.Pid, data.StartTime = true, 0, 0
	if err := writeBoxData(data); err != nil {
		return driver.Paused{}, fmt.Errorf("pause %s: %w", id, err)
	}
	return driver.Paused{State: stateOf(d, data), Bytes: hostfile.DiskBytes(dir)}, nil
}

// waitMigration polls query-migrate until the migration has completed.
func waitMigration(ctx context.Context, q *qmp) error {
	for {
		raw, err := q.run("query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("query-migrate: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration still %s: %w", st.Status, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Resume starts a paused VM from memory.bin and waits for its agent.
func (d *Driver) Resume(ctx context.Context, p driver.Paused) (_ driver.Box, err error) {
	data, err := d.decode(p.State)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	id, dir := data.ID, data.Dir
	if !data.Paused || len(data.Argv) == 0 {
		return nil, fmt.Errorf("resume %s: the state is not of a paused VM", id)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	mem := filepath.Join(dir, memoryFile)
	if _, err := os.Stat(mem); err != nil {
		// A resume a killed daemon left went past loading the memory:
		// the VM it started runs on, and is the box.
		if vms := d.vmsOf(dir); len(vms) == 1 && errors.Is(err, fs.ErrNotExist) {
			data.Pid, data.StartTime, data.Paused = vms[0].Pid, vms[0].StartTime, false
			if err := writeBoxData(data); err != nil {
				return nil, fmt.Errorf("resume %s: %w", id, err)
			}
			b := newBox(d, data, nil)
			if err := b.waitAgentEvery(ctx, 2*time.Second); err != nil {
				return nil, fmt.Errorf("resume %s: the VM an earlier resume started: %w", id, err)
			}
			os.Remove(filepath.Join(dir, memoryResumed))
			return b, nil
		}
		return nil, fmt.Errorf("resume %s: no saved memory: %w", id, err)
	}
	d.killVMsOf(dir) // what an interrupted resume started from memory.bin
	argv := append(slices.Clone(data.Argv), "-S", "-incoming", "exec:cat '"+mem+"'")
	pid, exited, err := startQEMU(dir, argv)
	if err != nil {
		return nil, fmt.Errorf("resume %s: %w", id, err)
	}
	nd := data
	nd.Pid, nd.StartTime, nd.Paused = pid, procStartTime(pid), false
	b := newBox(d, nd, exited)
	running := false // the vCPUs ran: the saved memory is behind the disk
	defer func() {
		if err == nil {
			return
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, nd.StartTime, 10*time.Second)
		b.stopWatch()
		if running {
			err = fmt.Errorf("%w: %w", driver.ErrResumeLost, err)
			return
		}
		_ = writeBoxData(data)
		err = fmt.Errorf("resume %s: %w\n%s", id, err, hostfile.Tail(filepath.Join(dir, "qemu.log"), 5))
	}()
	if err := waitIncoming(ctx, b); err != nil {
		return nil, err
	}
	if err := os.Rename(mem, filepath.Join(dir, memoryResumed)); err != nil {
		return nil, err
	}
	if err := hostfile.Sync(dir); err != nil {
		os.Rename(filepath.Join(dir, memoryResumed), mem)
		return nil, err
	}
	running = true
	if err := writeBoxData(nd); err != nil {
		return nil, err
	}
	if err := qmpCommand(ctx, filepath.Join(dir, "qmp.sock"), "cont"); err != nil {
		return nil, err
	}
	kickGuestSession(ctx, dir)
	if err := b.waitAgentEvery(ctx, 2*time.Second); err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(dir, memoryResumed))
	return b, nil
}

// kickGuestSession ends the agent channel's session the guest kept
// through the pause. Its end of the yamux session of the host before the
// pause is in the guest's memory, and a new host session that it took
// for the old one answered a first probe and then broke on the old
// session's frames (EOF on the next requests). Bytes no yamux session
// can read make the guest's drop it and start a new one, whichever it
// had; the probes that follow reach that one.
func kickGuestSession(ctx context.Context, dir string) {
	kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := dialUnix(kctx, filepath.Join(dir, "agent.sock"))
	if err != nil {
		return
	}
	_, _ = c.Write(bytes.Repeat([]byte{0xff}, 12)) // not yamux version 0
	time.Sleep(300 * time.Millisecond)             // the guest reads them before anything else
	c.Close()
}

// waitIncoming waits until the VM has loaded its memory and holds its
// vCPUs (-S), or QEMU exits (a stream it cannot load).
func waitIncoming(ctx context.Context, b *box) error {
	sock := filepath.Join(b.data.Dir, "qmp.sock")
	var last error
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		q, err := dialQMP(qctx, sock)
		if err == nil {
			var raw json.RawMessage
			raw, err = q.run("query-status", nil)
			q.Close()
			var st struct {
				Status string `json:"status"`
			}
			if err == nil {
				err = json.Unmarshal(raw, &st)
			}
			if err == nil {
				if st.Status == "paused" || st.Status == "prelaunch" {
					cancel()
					return nil
				}
				err = fmt.Errorf("vm status %s", st.Status)
			}
		}
		cancel()
		last = err
		select {
		case <-b.dead:
			return fmt.Errorf("qemu exited while loading the saved memory (last: %v)", last)
		case <-ctx.Done():
			return fmt.Errorf("saved memory not loaded: %w (last: %v)", ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Discard removes a paused VM: its directory, and any QEMU a resume
// that never finished left.
func (d *Driver) Discard(ctx context.Context, p driver.Paused) error {
	data, err := d.decode(p.State)
	if err != nil {
		return fmt.Errorf("discard: %w", err)
	}
	d.killVMsOf(data.Dir)
	if err := os.RemoveAll(data.Dir); err != nil {
		return fmt.Errorf("discard %s: %w", data.ID, err)
	}
	return nil
}

// thaw makes an adopted VM run: a daemon killed while pausing it may have
// left it with its vCPUs stopped, its migration going or done, and a
// stream that the disk is about to outgrow.
func thaw(ctx context.Context, data boxData) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, filepath.Join(data.Dir, "qmp.sock"))
	if err != nil {
		return err
	}
	defer q.Close()
	raw, err := q.run("query-migrate", nil)
	if err != nil {
		return err
	}
	var mig struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(raw, &mig)
	if mig.Status == "setup" || mig.Status == "active" || mig.Status == "device" {
		if _, err := q.run("migrate_cancel", nil); err != nil {
			return err
		}
		for mig.Status != "cancelled" && mig.Status != "failed" && mig.Status != "completed" {
			if ctx.Err() != nil {
				return fmt.Errorf("migration still %s: %w", mig.Status, ctx.Err())
			}
			time.Sleep(20 * time.Millisecond)
			if raw, err = q.run("query-migrate", nil); err != nil {
				return err
			}
			_ = json.Unmarshal(raw, &mig)
		}
	}
	for _, f := range []string{memoryPart, memoryFile, memoryResumed} {
		os.Remove(filepath.Join(data.Dir, f))
	}
	raw, err = q.run("query-status", nil)
	if err != nil {
		return err
	}
	var st struct {
		Running bool `json:"running"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return err
	}
	if !st.Running {
		_, err = q.run("cont", nil)
	}
	return err
}

// decode checks a State and returns its box data.
func (d *Driver) decode(st driver.State) (boxData, error) {
	var data boxData
	if st.Driver != d.Name() {
		return data, fmt.Errorf("state is for driver %q, not %q", st.Driver, d.Name())
	}
	if st.Version != stateVersion {
		return data, fmt.Errorf("unknown state version %d", st.Version)
	}
	if err := json.Unmarshal(st.Data, &data); err != nil {
		return data, err
	}
	if err := validID(data.ID); err != nil {
		return data, err
	}
	if data.Dir != d.boxDir(data.ID) {
		return data, fmt.Errorf("%s: directory %q is not under %s", data.ID, data.Dir, d.cfg.StateDir)
	}
	return data, nil
}

// stateOf is the versioned State of data.
func stateOf(d *Driver, data boxData) driver.State {
	raw, _ := json.Marshal(data) // plain struct: cannot fail
	return driver.State{Version: stateVersion, Driver: d.Name(), Data: raw}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Settle decides a pause a killed daemon left: a VM still running (its
// vCPUs perhaps stopped, its migration perhaps done) is thawed and runs
// on, as Adopt does; a VM that had quit with box.json saying paused (the
// daemon died before its store did) is paused.
func (d *Driver) Settle(ctx context.Context, st driver.State) (driver.Box, *driver.Paused, error) {
	data, err := d.decode(st)
	if err != nil {
		return nil, nil, fmt.Errorf("settle: %w", err)
	}
	if raw, err := os.ReadFile(filepath.Join(data.Dir, "box.json")); err == nil {
		var disk boxData
		if json.Unmarshal(raw, &disk) == nil && disk.ID == data.ID && disk.Paused {
			if _, err := os.Stat(filepath.Join(data.Dir, memoryFile)); err == nil {
				return nil, &driver.Paused{State: stateOf(d, disk), Bytes: hostfile.DiskBytes(data.Dir)}, nil
			}
		}
	}
	b, err := d.Adopt(ctx, st)
	if err != nil {
		return nil, nil, err
	}
	if isClosed(b.Wait()) {
		return nil, nil, nil
	}
	return b, nil, nil
}
