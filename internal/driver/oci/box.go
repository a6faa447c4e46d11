package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hoststat"
	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// stateVersion is the version of the State blob this driver writes.
const stateVersion = 1

// boxData is the State.Data of a box.
type boxData struct {
	ID      string `json:"id"`
	Runtime string `json:"runtime"`
	Pid     int    `json:"pid"`   // host pid of the container (runc: init; runsc: sandbox)
	Dir     string `json:"dir"`   // STATEDIR/ID
	Image   string `json:"image"` // lower layer of the rootfs overlay
	// Volumes names the volumes the box holds: its Stop ends the box's
	// programs gracefully first, so that what they still hold in memory
	// (a browser's cookies) reaches the volume.
	Volumes []string `json:"volumes,omitempty"`
	// Netns is the network namespace the box joined ("" for none): a
	// restore joins it again.
	Netns string `json:"netns,omitempty"`
	// Addr and Gateway are the box's address (with its prefix) and its
	// default route in Netns, which a gVisor restore needs on the
	// interface again (readdress.go).
	Addr    string `json:"addr,omitempty"`
	Gateway string `json:"gateway,omitempty"`
	// Paused is set while the box is saved in its checkpoint directory.
	Paused bool `json:"paused,omitempty"`
}

// box is one running container. It implements driver.Box.
type box struct {
	d    *Driver
	data boxData

	dead     chan struct{} // closed when the container is gone
	deadOnce sync.Once
	watch    *procwatch.Watcher // nil for a box adopted dead

	mu      sync.Mutex // serializes Stop
	stopped bool

	layerSize hoststat.TreeSizer // the writable layer without a disk of its own (usage.go)
}

func newBox(d *Driver, data boxData) *box {
	b := &box{d: d, data: data, dead: make(chan struct{})}
	p := procwatch.Process{Pid: data.Pid}
	if cur, err := procwatch.Lookup(data.Pid); err == nil {
		p = cur // against the pid being reused once the container ends
	}
	b.watch = procwatch.Watch(p, procwatch.Options{OnEnd: b.markDead})
	return b
}

func (b *box) markDead() { b.deadOnce.Do(func() { close(b.dead) }) }

// stopWatch stops watching the container's process (a Stop, or a test
// forgetting the box as a crashed daemon would). The box counts as dead
// from then on.
func (b *box) stopWatch() {
	if b.watch != nil {
		b.watch.Stop()
	}
	b.markDead()
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool { return procwatch.Process{Pid: pid}.Alive() }

// waitAgent waits until the agent accepts a connection on its socket, the
// container dies, or ctx ends.
func (b *box) waitAgent(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := dialAgent(dctx, b.data.Dir)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not ready: %w (last dial: %v)", ctx.Err(), err)
		case <-b.dead:
			return fmt.Errorf("container exited before the agent listened (last dial: %v)", err)
		case <-t.C:
		}
	}
}

// DialAgent opens a new connection to the agent's unix socket, reachable on
// the host because runsc runs with --host-uds=create (runc needs nothing).
func (b *box) DialAgent(ctx context.Context) (net.Conn, error) {
	select {
	case <-b.dead:
		return nil, fmt.Errorf("box %s: not running", b.data.ID)
	default:
	}
	c, err := dialAgent(ctx, b.data.Dir)
	if err != nil {
		return nil, fmt.Errorf("box %s: dial agent: %w", b.data.ID, err)
	}
	return c, nil
}

// State returns the versioned handle Adopt takes.
func (b *box) State() driver.State {
	return stateOf(b.d, b.data)
}

// Wait returns a channel closed when the container has died.
func (b *box) Wait() <-chan struct{} { return b.dead }

// Stop kills and deletes the container, unmounts its rootfs and removes its
// directory, continuing past errors and returning them joined. It is safe to
// call more than once and after the box died; a Stop that failed may be
// retried. Teardown is not cut short by ctx's cancellation.
func (b *box) Stop(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var errs []error
	if len(b.data.Volumes) > 0 && !isClosed(b.dead) {
		b.stopGracefully(ctx)
	}
	if err := b.d.deleteContainer(ctx, b.data.ID); err != nil {
		errs = append(errs, err)
	}
	// The runtime's delete kills the container; wait for it to be gone
	// before pulling its rootfs away.
	select {
	case <-b.dead:
	case <-time.After(10 * time.Second):
		if alive(b.data.Pid) {
			errs = append(errs, fmt.Errorf("box %s: pid %d still alive after delete", b.data.ID, b.data.Pid))
		}
	}
	b.stopWatch()
	if err := removeBoxDir(b.data.Dir); err != nil {
		errs = append(errs, err)
	}
	b.markDead()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop %s: %w", b.data.ID, err)
	}
	b.stopped = true
	return nil
}

// gracePeriod bounds a graceful stop: the agent gives the session's
// programs 5 s after SIGTERM, and then syncs.
const gracePeriod = 10 * time.Second

// stopGracefully sends the agent SIGTERM, which ends the desktop session
// and every command the way a shutdown does (SIGTERM, then SIGKILL after
// a grace period) and syncs, and waits for the box to exit, up to
// gracePeriod. What follows kills whatever is left.
func (b *box) stopGracefully(ctx context.Context) {
	if _, err := b.d.output(ctx, "kill", b.data.ID, "TERM"); err != nil {
		return
	}
	select {
	case <-b.dead:
	case <-time.After(gracePeriod):
	case <-ctx.Done():
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Adopt re-attaches to a box from its State. When the runtime says the
// container does not exist or is not running, Adopt still returns a Box —
// with Wait already closed — so the caller can Stop it to free its
// directory and mounts. When the runtime fails or does not answer within
// a bound, the container is not taken for dead: the Box is returned with
// Wait open, and the runtime is asked again in the background until it
// answers (see adopt.go). An error means the state itself is unusable
// (Cleanup then removes what is left).
func (d *Driver) Adopt(ctx context.Context, st driver.State) (driver.Box, error) {
	data, err := d.decode(st)
	if err != nil {
		return nil, fmt.Errorf("adopt: %w", err)
	}
	if data.Paused {
		return deadBox(d, data), nil
	}
	cs, v, _ := d.probe(ctx, data.ID)
	if v == verdictGone && d.isRunsc() && cs.Status == "paused" && cs.Pid > 0 {
		// Frozen by a pause, fork or snapshot (pause.go, copy.go) whose
		// undoing did not happen (a runsc that failed the resume, a
		// daemon that died in between): the box is whole, and runs on
		// once resumed.
		if _, err := d.output(ctx, "resume", data.ID); err == nil {
			cs, v, _ = d.probe(ctx, data.ID)
		}
	}
	switch v {
	case verdictGone:
		return deadBox(d, data), nil
	case verdictUnknown:
		// No answer is not death: the box is adopted and the runtime
		// asked again (adopt.go).
		return d.adoptUnsure(data), nil
	}
	data.Pid = cs.Pid
	b := newBox(d, data)
	if d.isRunsc() {
		// A fork or snapshot that a killed daemon cut short leaves its
		// image (a running box has no other), and may leave the agent
		// let go of its socket (moved aside): it is told to listen
		// again.
		os.RemoveAll(filepath.Join(data.Dir, checkpointDir))
		if _, err := os.Stat(b.socketPath() + asideSuffix); err == nil {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := d.relisten(lctx, b)
			cancel()
			if err != nil {
				b.stopWatch()
				return nil, fmt.Errorf("adopt %s: the agent a cut-short copy left: %w", data.ID, err)
			}
		}
	}
	return b, nil
}

// deadBox returns the handle of a container that is gone: Wait is closed,
// and Stop frees what is left of it.
func deadBox(d *Driver, data boxData) *box {
	b := &box{d: d, data: data, dead: make(chan struct{})}
	b.markDead()
	return b
}

// Cleanup deletes every container in the runtime root and every box
// directory (with its mounts) under the state directory whose ID is not in
// keep, once the runtime calls a previous daemon left running have ended.
func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	var errs []error
	// What a run of the previous daemon is still making is cleaned once
	// it is made (orphan.go).
	if err := d.waitOrphanRuns(ctx, keep, orphanRunBound); err != nil {
		errs = append(errs, err)
	}
	cs, err := d.list(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, c := range cs {
		if !keep[c.ID] {
			if err := d.deleteContainer(ctx, c.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	ents, err := os.ReadDir(d.cfg.StateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if !e.IsDir() || validID(e.Name()) != nil || keep[e.Name()] {
			continue
		}
		if err := removeBoxDir(filepath.Join(d.cfg.StateDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
		if err := removeCgroups(e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	// Runtime roots of state directories that are gone (root.go), and
	// the legacy root under this one once it records no container.
	if err := pruneRoots(); err != nil {
		errs = append(errs, err)
	}
	if legacy := filepath.Join(d.cfg.StateDir, "runtime-root"); legacy != d.runtimeRoot() {
		if err := os.RemoveAll(legacy); err != nil {
			errs = append(errs, err)
		}
	}
	// runsc lock files of containers that are gone (see removeRunscLocks).
	if d.isRunsc() {
		locks, _ := filepath.Glob(filepath.Join(d.runtimeRoot(), "*_sandbox:*.lock"))
		for _, l := range locks {
			id, _, _ := strings.Cut(filepath.Base(l), "_sandbox:")
			if validID(id) == nil && !keep[id] {
				_ = os.Remove(l)
			}
		}
	}
	return errors.Join(errs...)
}
