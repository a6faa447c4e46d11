package firecracker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
)

// Pause and resume are Firecracker's snapshots: PATCH /vm Paused stops
// the vCPUs, PUT /snapshot/create writes the VM's device state and its
// whole memory into the jail, and the VMM ends. A paused VM is its jail
// (disk copy, config drive, kernel, snapshot) and no process, no cgroup.
// Resume starts a new Firecracker in the same jail (the jailer again,
// same id, netns and cgroup limits), which takes nothing but its logger
// and metrics before PUT /snapshot/load: the restored VM finds its disk,
// TAP and vsock socket at the paths it had, as Firecracker requires.
//
// The memory file is mapped private by the restored VM and read on
// demand for as long as it runs, so it must never change under it: a
// later pause writes a new file and renames it over the old name, and
// the old one is unlinked (its pages stay readable to the VMM that maps
// it). vsock connections do not survive a snapshot (Firecracker resets
// them); the agent's listener does, and the host dials again.
//
// As with QEMU, the order of the steps keeps a daemon killed at any
// point from losing or corrupting a VM:
//
//   - Pause: the snapshot is written to snapshotPart and memoryPart,
//     synced, and renamed (memory first; the snapshot file is the
//     commit), and only then does the VMM end. A daemon killed before
//     that leaves a running VMM, perhaps with its vCPUs stopped, which
//     Settle resumes (and removes the half-made snapshot).
//   - Resume: the snapshot is loaded with the vCPUs held (resume_vm
//     false), and only once it is loaded is snapshotFile renamed to
//     snapshotResumed and the vCPUs let run. From then on the snapshot
//     is behind the disk and is never loaded again: a later Resume
//     finds the VMM running and adopts it.
const (
	snapshotFile    = "/vm.snap"
	snapshotPart    = "/vm.snap.part"
	snapshotResumed = "/vm.snap.resumed"
	memoryFile      = "/vm.mem"
	memoryPart      = "/vm.mem.part"
)

var _ driver.Pauser = (*Driver)(nil)

// CanPause returns nil: every Firecracker the driver runs (minVersion
// and newer) takes full snapshots.
func (d *Driver) CanPause(ctx context.Context) error { return nil }

// Pause snapshots the VM into its jail and ends Firecracker.
func (d *Driver) Pause(ctx context.Context, db driver.Box) (driver.Paused, error) {
	b, ok := db.(*box)
	if !ok || b.d != d {
		return driver.Paused{}, errors.New("pause: not a box of this driver")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.data.ID
	if b.stopped || isClosed(b.dead) {
		return driver.Paused{}, fmt.Errorf("pause %s: the VM is not running", id)
	}
	if b.data.MemoryMB == 0 {
		return driver.Paused{}, fmt.Errorf("pause %s: the VM was started by a cubicled without pause; it cannot be paused", id)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	p := d.paths(id)
	c := newAPIClient(b.data.APISocket)
	fail := func(err error) (driver.Paused, error) {
		// The VM goes on as it was; ctx may be what ended the pause.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if rerr := c.setVMState(rctx, vmResumed); rerr != nil {
			err = errors.Join(err, fmt.Errorf("resume the vCPUs again: %w", rerr))
		}
		for _, f := range []string{snapshotPart, memoryPart, snapshotFile, memoryFile} {
			os.Remove(p.host(f))
		}
		return driver.Paused{}, fmt.Errorf("pause %s: %w", id, err)
	}
	if err := c.setVMState(ctx, vmPaused); err != nil {
		return fail(err)
	}
	if err := c.put(ctx, "/snapshot/create", apiSnapshotCreate{SnapshotType: "Full", SnapshotPath: snapshotPart, MemFilePath: memoryPart}); err != nil {
		return fail(err)
	}
	for _, f := range []string{memoryPart, snapshotPart} {
		if err := hostfile.Sync(p.host(f)); err != nil {
			return fail(err)
		}
	}
	if err := os.Rename(p.host(memoryPart), p.host(memoryFile)); err != nil {
		return fail(err)
	}
	if err := os.Rename(p.host(snapshotPart), p.host(snapshotFile)); err != nil {
		return fail(err)
	}
	if err := hostfile.Sync(p.Root); err != nil {
		return fail(err)
	}
	// Saved: from here on Firecracker only has to go.
	if err := b.kill(); err != nil {
		return fail(err)
	}
	b.stopWatch()
	b.d.unregister(b)
	b.stopped = true // the jail is the paused box's now: Stop must not remove it
	data := b.data
	data.Paused, data.Pid, data.StartTime = true, 0, 0
	// The VM is saved and its VMM gone: what these leave is not worth
	// failing a pause for (the box could not run on). Resume does both
	// again before it starts a VMM, and Discard removes the jail.
	_ = removeCgroups(data.Cgroups)
	_ = resetJail(p, d.execName())
	return driver.Paused{State: d.stateOf(data), Bytes: hostfile.DiskBytes(p.JailDir)}, nil
}

// resetJail removes from a jail what a Firecracker run left that the
// jailer would refuse to find on the next run (its pid file, which it
// creates exclusively, and the device nodes it makes), and the sockets
// the next Firecracker binds again.
func resetJail(p paths, execName string) error {
	var errs []error
	for _, f := range []string{p.PidFile, p.host(apiSockName), p.host(vsockName), p.host("/" + execName)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(p.host("/dev")); err != nil {
		errs = append(errs, err)
	}
	// vsock listener sockets (v.sock_PORT) of guest-initiated streams.
	socks, _ := filepath.Glob(p.host(vsockName) + "_*")
	for _, s := range socks {
		os.Remove(s)
	}
	return errors.Join(errs...)
}

// Resume starts a new Firecracker in the paused VM's jail, loads the
// snapshot and waits for the agent.
func (d *Driver) Resume(ctx context.Context, ps driver.Paused) (_ driver.Box, err error) {
	data, err := d.decode(ps.State)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	id := data.ID
	if !data.Paused || data.MemoryMB == 0 {
		return nil, fmt.Errorf("resume %s: the state is not of a paused VM", id)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	p := d.paths(id)
	if _, err := os.Stat(p.host(snapshotFile)); err != nil {
		// A resume a killed daemon left went past loading the
		// snapshot: the VM it started runs on, and is the box.
		if b, aerr := d.adoptResumed(ctx, data); aerr == nil {
			return b, nil
		} else if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("resume %s: no snapshot, and %w", id, aerr)
		}
		return nil, fmt.Errorf("resume %s: no snapshot: %w", id, err)
	}
	// What an interrupted resume started, and what it left.
	if err := d.killJail(id); err != nil {
		return nil, fmt.Errorf("resume %s: %w", id, err)
	}
	if err := errors.Join(removeCgroups(data.Cgroups), resetJail(p, d.execName())); err != nil {
		return nil, fmt.Errorf("resume %s: %w", id, err)
	}
	// The volumes' bind mounts, kept while paused, are gone after a
	// host reboot: the restored VM opens its drives where they were.
	if err := bindVolumes(p, data.Volumes, d.cfg.UID, d.cfg.GID); err != nil {
		return nil, fmt.Errorf("resume %s: %w", id, err)
	}
	if data.TAP != "" {
		if err := d.giveTAP(data.Netns, data.TAP, d.cfg.UID, d.cfg.GID); err != nil {
			return nil, fmt.Errorf("resume %s: %w", id, err)
		}
	}
	version := d.cgroupVersion()
	cmd := d.jailerCommand(id, data.Netns, data.MemoryMB, version)
	mounts, _ := os.ReadFile("/proc/self/mounts")
	nd := data
	nd.Paused = false
	nd.Cgroups = cgroupDirs(mounts, version, d.cfg.ParentCgroup, id, cgroupControllers(cmd.Args[1:]))
	pid, err := d.launch(ctx, cmd, p)
	if err != nil {
		removeCgroups(nd.Cgroups)
		resetJail(p, d.execName())
		return nil, fmt.Errorf("resume %s: %w", id, err)
	}
	st, ok := processStart(pid)
	if !ok {
		removeCgroups(nd.Cgroups)
		resetJail(p, d.execName())
		return nil, fmt.Errorf("resume %s: firecracker (pid %d) exited at once\n%s", id, pid, hostfile.Tail(p.Console, 20))
	}
	nd.Pid, nd.StartTime = pid, st
	b := newBox(d, nd)
	running := false // the vCPUs ran: the snapshot is behind the disk
	defer func() {
		if err == nil {
			return
		}
		b.kill()
		b.stopWatch()
		removeCgroups(nd.Cgroups)
		resetJail(p, d.execName())
		if running {
			err = fmt.Errorf("resume %s: %w: %w", id, driver.ErrResumeLost, err)
			return
		}
		err = fmt.Errorf("resume %s: %w\n%s", id, err, tailFiles(p, 5))
	}()
	c := newAPIClient(nd.APISocket)
	if err := waitAPI(ctx, c, b.dead); err != nil {
		return nil, err
	}
	// Logger and metrics are not in a snapshot, and are all a
	// Firecracker may be told before it loads one.
	for _, s := range []struct {
		path string
		body any
	}{
		{"/logger", apiLogger{LogPath: logName, Level: d.cfg.LogLevel, ShowLevel: true}},
		{"/metrics", apiMetrics{MetricsPath: metricsName}},
		{"/snapshot/load", apiSnapshotLoad{SnapshotPath: snapshotFile, MemBackend: apiMemoryBackend{BackendType: "File", BackendPath: memoryFile}}},
	} {
		if err := c.put(ctx, s.path, s.body); err != nil {
			return nil, fmt.Errorf("firecracker API: %w", err)
		}
	}
	if err := os.Rename(p.host(snapshotFile), p.host(snapshotResumed)); err != nil {
		return nil, err
	}
	if err := hostfile.Sync(p.Root); err != nil {
		os.Rename(p.host(snapshotResumed), p.host(snapshotFile))
		return nil, err
	}
	running = true
	if err := c.setVMState(ctx, vmResumed); err != nil {
		return nil, err
	}
	finishResume(p)
	if err := waitAgent(ctx, b); err != nil {
		return nil, err
	}
	d.register(b)
	return b, nil
}

// finishResume removes the snapshot of a VM that runs from it. The
// memory file stays mapped by the VMM, which reads it on demand: its
// name goes, its pages stay (and its disk space, until the VMM ends).
func finishResume(p paths) {
	os.Remove(p.host(snapshotResumed))
	os.Remove(p.host(memoryFile))
}

// adoptResumed adopts the VMM an interrupted resume left running in the
// jail, lets its vCPUs run if they were still held, and removes the
// snapshot it runs from.
func (d *Driver) adoptResumed(ctx context.Context, data boxData) (*box, error) {
	// The jailer's pid file names the VMM; it must be a process in the
	// jail (not a pid reused by another since).
	p := d.paths(data.ID)
	pid, err := hostfile.ReadPid(p.PidFile)
	if err != nil {
		return nil, fmt.Errorf("no VMM an earlier resume started: %w", err)
	}
	if !slices.Contains(jailedProcesses(d.jailBase())[data.ID], pid) {
		return nil, fmt.Errorf("pid %d of %s is not a process in the jail", pid, p.PidFile)
	}
	st, ok := processStart(pid)
	if !ok {
		return nil, fmt.Errorf("pid %d gone", pid)
	}
	nd := data
	nd.Paused, nd.Pid, nd.StartTime = false, pid, st
	mounts, _ := os.ReadFile("/proc/self/mounts")
	version := d.cgroupVersion()
	nd.Cgroups = cgroupDirs(mounts, version, d.cfg.ParentCgroup, data.ID,
		cgroupControllers(d.jailerCommand(data.ID, data.Netns, data.MemoryMB, version).Args[1:]))
	b := newBox(d, nd)
	if err := thaw(ctx, newAPIClient(nd.APISocket)); err != nil {
		b.stopWatch()
		return nil, err
	}
	finishResume(p)
	if err := waitAgent(ctx, b); err != nil {
		b.stopWatch()
		return nil, err
	}
	d.register(b)
	return b, nil
}

// thaw lets a VM's vCPUs run if they are paused (a daemon killed in the
// middle of a pause or a resume leaves them so).
func thaw(ctx context.Context, c *apiClient) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := c.instanceInfo(ctx)
	if err != nil {
		return err
	}
	if info.State == "Paused" {
		return c.setVMState(ctx, vmResumed)
	}
	return nil
}

// waitAgent waits until the agent answers GET /health over vsock, the
// VMM dies, or ctx ends. Each attempt is short: a stream that a restored
// VM's transport reset dropped is not waited out.
func waitAgent(ctx context.Context, b *box) error {
	var last error
	for {
		last = probeAgent(ctx, b, 2*time.Second)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not ready: %w (last: %v)", ctx.Err(), last)
		case <-b.dead:
			return fmt.Errorf("firecracker exited before the agent answered (last: %v)", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probeAgent sends one GET /health and reads the status line.
func probeAgent(ctx context.Context, b *box, timeout time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := b.DialAgent(pctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := pctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("agent health: %w", err)
	}
	if !strings.HasPrefix(line, "HTTP/1.1 2") {
		return fmt.Errorf("agent health: %q", strings.TrimSpace(line))
	}
	return nil
}

// Discard removes a paused VM's jail, and any Firecracker a resume that
// never finished left in it.
func (d *Driver) Discard(ctx context.Context, ps driver.Paused) error {
	data, err := d.decode(ps.State)
	if err != nil {
		return fmt.Errorf("discard: %w", err)
	}
	// A jail is never removed under a running VMM.
	if err := d.killJail(data.ID); err != nil {
		return fmt.Errorf("discard %s: %w", data.ID, err)
	}
	if err := errors.Join(removeCgroups(data.Cgroups), unmountJail(data.JailDir)); err != nil {
		return fmt.Errorf("discard %s: %w", data.ID, err)
	}
	if err := os.RemoveAll(data.JailDir); err != nil {
		return fmt.Errorf("discard %s: %w", data.ID, err)
	}
	return nil
}

// Settle decides a pause a killed daemon left, from the running box's
// State: a Firecracker still there runs on (its vCPUs let run again,
// the half-made snapshot removed); one that is gone after the snapshot
// was complete leaves the VM paused; otherwise the VM is gone.
func (d *Driver) Settle(ctx context.Context, st driver.State) (driver.Box, *driver.Paused, error) {
	data, err := d.decode(st)
	if err != nil {
		return nil, nil, fmt.Errorf("settle: %w", err)
	}
	p := d.paths(data.ID)
	b := newBox(d, data)
	if b.sameProcess() {
		if err := thaw(ctx, newAPIClient(data.APISocket)); err == nil {
			for _, f := range []string{snapshotPart, memoryPart, snapshotFile, memoryFile} {
				os.Remove(p.host(f))
			}
			d.register(b)
			return b, nil, nil
		}
	}
	b.stopWatch()
	_, serr := os.Stat(p.host(snapshotFile))
	_, merr := os.Stat(p.host(memoryFile))
	if serr == nil && merr == nil && !b.sameProcess() {
		if err := errors.Join(d.killJail(data.ID), removeCgroups(data.Cgroups), resetJail(p, d.execName())); err != nil {
			return nil, nil, fmt.Errorf("settle %s: %w", data.ID, err)
		}
		data.Paused, data.Pid, data.StartTime = true, 0, 0
		return nil, &driver.Paused{State: d.stateOf(data), Bytes: hostfile.DiskBytes(p.JailDir)}, nil
	}
	// Gone, or not answering: a dead box, which the caller stops (as
	// one Adopt returns), freeing the jail.
	return b, nil, nil
}

// decode checks a State and returns its box data; everything it names
// must be this driver's, whatever the store says.
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
	p := d.paths(data.ID)
	if data.JailDir != p.JailDir || data.APISocket != p.host(apiSockName) || data.Vsock != p.host(vsockName) {
		return data, fmt.Errorf("%s: paths in state are not under %s", data.ID, d.jailBase())
	}
	for _, c := range data.Cgroups {
		if filepath.Base(c) != data.ID || !strings.HasPrefix(c, "/sys/fs/cgroup/") {
			return data, fmt.Errorf("%s: cgroup %q is not the VM's", data.ID, c)
		}
	}
	return data, nil
}

// stateOf is the versioned State of data.
func (d *Driver) stateOf(data boxData) driver.State {
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
