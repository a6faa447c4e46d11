package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// stateVersion is the version of the State blob this driver writes.
const stateVersion = 1

// boxData is the State.Data of a box.
type boxData struct {
	ID        string   `json:"id"`
	Pid       int      `json:"pid"`        // host pid of Firecracker
	StartTime uint64   `json:"start_time"` // its start time (/proc/PID/stat field 22), against pid reuse
	JailDir   string   `json:"jail_dir"`   // CHROOTBASE/firecracker/ID
	APISocket string   `json:"api_socket"` // host path of the API socket
	Vsock     string   `json:"vsock"`      // host path of the hybrid-vsock socket
	Disk      string   `json:"disk"`       // host path of the VM's disk copy (inside the jail)
	Cgroups   []string `json:"cgroups"`    // cgroup directories the jailer made
	// What a resume starts the VMM with again (boxes made before pause
	// existed have none of it, and cannot pause).
	MemoryMB int    `json:"memory_mb,omitempty"`
	Netns    string `json:"netns,omitempty"`
	TAP      string `json:"tap,omitempty"`
	// Volumes are the host files of the volume drives, in order
	// (bind-mounted into the jail at volumeName(i)).
	Volumes []string `json:"volumes,omitempty"`
	// Paused: no process; the jail holds the snapshot (snapshotFile,
	// memoryFile) that Resume loads.
	Paused bool `json:"paused,omitempty"`
}

// box is one running VM. It implements driver.Box.
type box struct {
	d       *Driver
	data    boxData
	metrics *vmMetrics

	dead     chan struct{} // closed when Firecracker has exited
	deadOnce sync.Once
	watch    *procwatch.Watcher

	mu      sync.Mutex // serializes Stop
	stopped bool
}

// newBox starts watching Firecracker (its pidfd, so a recycled pid cannot
// fool it), and keeps the console log bounded while it runs.
func newBox(d *Driver, data boxData) *box {
	b := &box{d: d, data: data, dead: make(chan struct{}),
		metrics: newVMMetrics(filepath.Join(data.JailDir, "root", strings.TrimPrefix(metricsName, "/")))}
	b.watch = procwatch.Watch(procwatch.Process{Pid: data.Pid, StartTime: data.StartTime},
		procwatch.Options{Every: b.boundConsole, OnEnd: b.markDead})
	return b
}

func (b *box) markDead() { b.deadOnce.Do(func() { close(b.dead) }) }

// stopWatch stops watching Firecracker and waits for the watcher; the box
// counts as dead from then on.
func (b *box) stopWatch() {
	b.watch.Stop()
	b.markDead()
}

// boundConsole empties console.log once it is larger than the limit: the
// guest writes it and nothing else keeps it from filling the disk.
func (b *box) boundConsole() {
	p := filepath.Join(b.data.JailDir, consoleName)
	if fi, err := os.Stat(p); err == nil && fi.Size() > b.d.cfg.ConsoleMaxBytes {
		// Firecracker's descriptor is O_APPEND: it goes on writing at the
		// new end.
		if os.Truncate(p, 0) == nil {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				fmt.Fprintf(f, "[cubicle: console log truncated at %d bytes]\n", fi.Size())
				f.Close()
			}
		}
	}
}

// sameProcess reports whether b.data.Pid is still the Firecracker process
// the box was made for (alive, not a zombie, same start time).
func (b *box) sameProcess() bool {
	return procwatch.Process{Pid: b.data.Pid, StartTime: b.data.StartTime}.Alive()
}

// processStart returns the start time of a live, non-zombie process.
func processStart(pid int) (uint64, bool) {
	p, err := procwatch.Lookup(pid)
	return p.StartTime, err == nil
}

// DialAgent opens a new stream to the agent on guest vsock port AgentPort
// through Firecracker's hybrid vsock.
func (b *box) DialAgent(ctx context.Context) (net.Conn, error) {
	select {
	case <-b.dead:
		return nil, fmt.Errorf("box %s: not running", b.data.ID)
	default:
	}
	c, err := DialVsock(ctx, b.data.Vsock, AgentPort)
	if err != nil {
		return nil, fmt.Errorf("box %s: dial agent: %w", b.data.ID, err)
	}
	return c, nil
}

// State returns the versioned handle Adopt takes.
func (b *box) State() driver.State {
	data, _ := json.Marshal(b.data) // plain struct: cannot fail
	return driver.State{Version: stateVersion, Driver: b.d.Name(), Data: data}
}

// Wait returns a channel closed when Firecracker has exited.
func (b *box) Wait() <-chan struct{} { return b.dead }

// Stop shuts the VM down — Ctrl-Alt-Del, then SIGKILL after
// Config.StopTimeout — and removes its cgroups and its jail directory (the
// disk copy, sockets and logs with it), continuing past errors and
// returning them joined. It is safe to call more than once and after the
// VM died; a Stop that failed may be retried. Teardown is not cut short by
// ctx's cancellation.
func (b *box) Stop(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.d.cfg.StopTimeout+30*time.Second)
	defer cancel()
	var errs []error
	select {
	case <-b.dead:
	default:
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		err := sendCtrlAltDel(actx, newAPIClient(b.data.APISocket))
		acancel()
		if err == nil {
			select {
			case <-b.dead:
			case <-time.After(b.d.cfg.StopTimeout):
			}
		}
	}
	// Also for a box adopted dead whose process hangs on: kill checks it
	// is still the same process.
	if err := b.kill(); err != nil {
		// The VM may still run: its jail, cgroups and registration stay
		// until a retried Stop (the reaper's) gets it gone; a jail is
		// never removed under a running VM.
		return fmt.Errorf("stop %s: %w", b.data.ID, err)
	}
	b.stopWatch()
	b.d.unregister(b)
	errs = append(errs, removeCgroups(b.data.Cgroups))
	if err := unmountJail(b.data.JailDir); err != nil {
		// Never remove a jail through a volume's mount.
		return fmt.Errorf("stop %s: %w", b.data.ID, errors.Join(append(errs, err)...))
	}
	if err := os.RemoveAll(b.data.JailDir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop %s: %w", b.data.ID, err)
	}
	b.markDead()
	b.stopped = true
	return nil
}

// kill SIGKILLs Firecracker if it is still the same process and waits for
// it to be gone.
func (b *box) kill() error {
	fd, err := unix.PidfdOpen(b.data.Pid, 0)
	if err != nil {
		return nil // gone
	}
	defer unix.Close(fd)
	if !b.sameProcess() {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill firecracker pid %d: %w", b.data.Pid, err)
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if n, _ := unix.Poll(fds, 100); n > 0 {
			return nil
		}
	}
	return fmt.Errorf("firecracker pid %d still alive after SIGKILL", b.data.Pid)
}

// removeCgroups removes cgroup directories, retrying while the kernel
// still counts the exited process in them.
func removeCgroups(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		var err error
		for i := 0; i < 50; i++ {
			err = unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// Adopt re-attaches to a VM from its State: its Firecracker process must
// be the same one (pid and start time) and answer GET / on its API socket.
// When it is not running, Adopt still returns a Box — with Wait already
// closed — so the caller can Stop it to free its jail and cgroups; an error
// means the state itself is unusable (Cleanup then removes what is left).
func (d *Driver) Adopt(ctx context.Context, st driver.State) (driver.Box, error) {
	data, err := d.decode(st)
	if err != nil {
		return nil, fmt.Errorf("adopt: %w", err)
	}
	if data.Paused {
		return nil, fmt.Errorf("adopt %s: the VM is paused; resume it", data.ID)
	}
	b := newBox(d, data)
	if b.sameProcess() {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := newAPIClient(data.APISocket).instanceInfo(actx)
		cancel()
		if err == nil {
			d.register(b)
			return b, nil
		}
	}
	// Not running, or not answering: a dead box that Stop can clean up
	// (Stop kills a process that is still there).
	b.stopWatch()
	b.markDead()
	return b, nil
}

// Cleanup kills every Firecracker process running in a jail of this
// driver and removes every jail directory and cgroup whose sandbox ID is
// not in keep; it also ends what an interrupted probe boot left. The
// processes go first: a jail is never removed under a running VM.
func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	ids, errs := killJailed(d.jailBase(), keep)
	ents, err := os.ReadDir(d.jailBase())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) == nil && !keep[e.Name()] {
			ids[e.Name()] = true
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for id := range ids {
		for _, v := range []int{1, 2} {
			errs = append(errs, removeCgroups(cgroupDirs(mounts, v, d.cfg.ParentCgroup, id, []string{"memory", "cpuset"})))
		}
		if err := unmountJail(filepath.Join(d.jailBase(), id)); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(filepath.Join(d.jailBase(), id)); err != nil {
			errs = append(errs, err)
		}
	}
	// Probe boots run under probeState's lock; none is half done while
	// this holds it.
	d.probeState.mu.Lock()
	defer d.probeState.mu.Unlock()
	_, perrs := killJailed(filepath.Join(d.probeBase(), d.execName()), nil)
	errs = append(errs, perrs...)
	if err := os.RemoveAll(d.probeBase()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killJailed kills the processes in every jail under base whose ID is not
// in keep, and returns those IDs.
func killJailed(base string, keep map[string]bool) (map[string]bool, []error) {
	var errs []error
	ids := map[string]bool{}
	for id, pids := range jailedProcesses(base) {
		if keep[id] {
			continue
		}
		ids[id] = true
		errs = append(errs, killPids(id, pids)...)
	}
	return ids, errs
}

// killJail kills every process in the jail of sandbox id.
func (d *Driver) killJail(id string) error {
	return errors.Join(killPids(id, jailedProcesses(d.jailBase())[id])...)
}

// killPids kills processes of the jail of id and waits for them to go.
func killPids(id string, pids []int) []error {
	var errs []error
	for _, pid := range pids {
		if st, ok := processStart(pid); ok {
			b := &box{data: boxData{ID: id, Pid: pid, StartTime: st}}
			if err := b.kill(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// strays lists what of the VM data describes is still on the host: its
// Firecracker process, any process in its jail, the jail directory, its
// cgroups. After Stop it must be empty; tests check that.
func (d *Driver) strays(data boxData) []string {
	var out []string
	if st, ok := processStart(data.Pid); ok && st == data.StartTime {
		out = append(out, fmt.Sprintf("firecracker pid %d still running", data.Pid))
	}
	if pids := jailedProcesses(d.jailBase())[data.ID]; len(pids) > 0 {
		out = append(out, fmt.Sprintf("processes %v still in its jail", pids))
	}
	if _, err := os.Lstat(data.JailDir); !errors.Is(err, os.ErrNotExist) {
		out = append(out, fmt.Sprintf("jail %s still there (%v)", data.JailDir, err))
	}
	for _, c := range data.Cgroups {
		if _, err := os.Lstat(c); !errors.Is(err, os.ErrNotExist) {
			out = append(out, fmt.Sprintf("cgroup %s still there", c))
		}
	}
	return out
}
