package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// stateVersion is the version of the State blob this driver writes.
const stateVersion = 1

// boxData is the State.Data of a box.
type boxData struct {
	ID        string `json:"id"`
	Pid       int    `json:"pid"`        // QEMU's pid
	StartTime uint64 `json:"start_time"` // QEMU's start time (clock ticks), against pid reuse
	Dir       string `json:"dir"`        // STATEDIR/ID
	Image     string `json:"image"`      // image version directory (its disk.ext4 backs the overlay)
	Initramfs string `json:"initramfs"`
	KVM       bool   `json:"kvm"`
	// Argv is the command that started QEMU (nsenter first when the VM
	// has a network namespace): a resume starts the same VM again, with
	// its memory coming in. Boxes of daemons before pause existed lack
	// it and cannot pause.
	Argv []string `json:"argv,omitempty"`
	// Paused is set while the VM is saved in memory.bin and not running.
	Paused bool `json:"paused,omitempty"`
}

// box is one running VM. It implements driver.Box.
type box struct {
	d    *Driver
	data boxData

	dead     chan struct{}
	deadOnce sync.Once
	watch    *procwatch.Watcher // nil for a box adopted dead

	sessMu sync.Mutex
	sess   *yamux.Session

	// adopted is set for a VM that an earlier daemon ran: its guest may
	// still hold that daemon's yamux session (a guest busy under TCG
	// does not see the host go and come back), and would take our first
	// frames for that session's and drop them. The first DialAgent ends
	// it and waits for the agent to answer a fresh one; settling is
	// closed when that attempt ends, for calls that came meanwhile.
	settleMu sync.Mutex
	adopted  bool
	settling chan struct{}

	mu      sync.Mutex // serializes Stop
	stopped bool
}

// newBox starts watching the VM. exited, if not nil, is closed when our
// own child QEMU has been reaped; otherwise (a VM adopted after a restart)
// its process is watched through a pidfd.
func newBox(d *Driver, data boxData, exited <-chan struct{}) *box {
	b := &box{d: d, data: data, dead: make(chan struct{})}
	b.watch = procwatch.Watch(data.process(), procwatch.Options{Exited: exited, OnEnd: b.markDead})
	return b
}

func (b *box) markDead() { b.deadOnce.Do(func() { close(b.dead) }) }

// stopWatch stops watching QEMU; the box counts as dead from then on.
func (b *box) stopWatch() {
	if b.watch != nil {
		b.watch.Stop()
	}
	b.markDead()
}

// process is the QEMU process of the box.
func (data boxData) process() procwatch.Process {
	return procwatch.Process{Pid: data.Pid, StartTime: data.StartTime}
}

// session returns the yamux client session on the agent's chardev socket,
// connecting anew when there is none or it died (after a daemon restart, or
// when the guest reset its end).
func (b *box) session(ctx context.Context) (*yamux.Session, error) {
	b.sessMu.Lock()
	defer b.sessMu.Unlock()
	if b.sess != nil && !b.sess.IsClosed() {
		return b.sess, nil
	}
	c, err := dialUnix(ctx, filepath.Join(b.data.Dir, "agent.sock"))
	if err != nil {
		return nil, err
	}
	cfg := vminit.YamuxConfig()
	// The host learns of a dead VM from its pid; a guest still booting
	// must not be taken for a dead peer.
	cfg.EnableKeepAlive = false
	sess, err := yamux.Client(c, cfg)
	if err != nil {
		c.Close()
		return nil, err
	}
	b.sess = sess
	return sess, nil
}

// resetSession drops sess if it is still the current session.
func (b *box) resetSession(sess *yamux.Session) {
	b.sessMu.Lock()
	defer b.sessMu.Unlock()
	if b.sess == sess && sess != nil {
		sess.Close()
		b.sess = nil
	}
}

// DialAgent opens a new yamux stream to the agent over the virtio-serial
// channel.
func (b *box) DialAgent(ctx context.Context) (net.Conn, error) {
	if err := b.settle(ctx); err != nil {
		return nil, err
	}
	return b.dial(ctx)
}

// settle makes the guest of an adopted VM drop the session of the daemon
// before and waits until the agent answers on a new one. A request sent
// before that could wait forever: TestFork saw an adopted VM's agent
// leave its first request unanswered for 20 s.
func (b *box) settle(ctx context.Context) error {
	for {
		b.settleMu.Lock()
		if !b.adopted {
			b.settleMu.Unlock()
			return nil
		}
		if ch := b.settling; ch != nil {
			// Another call settles: wait for it, as long as ctx lets.
			b.settleMu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return fmt.Errorf("box %s: agent of an adopted VM: %w", b.data.ID, ctx.Err())
			}
		}
		ch := make(chan struct{})
		b.settling = ch
		b.settleMu.Unlock()

		b.resetSession(b.currentSession())
		kickGuestSession(ctx, b.data.Dir)
		err := b.waitAgentEvery(ctx, 2*time.Second)
		b.settleMu.Lock()
		b.settling = nil
		if err == nil {
			b.adopted = false
		}
		b.settleMu.Unlock()
		close(ch)
		if err != nil {
			return fmt.Errorf("box %s: agent of an adopted VM: %w", b.data.ID, err)
		}
		return nil
	}
}

// dial is DialAgent without settle.
func (b *box) dial(ctx context.Context) (net.Conn, error) {
	select {
	case <-b.dead:
		return nil, fmt.Errorf("box %s: not running", b.data.ID)
	default:
	}
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		sess, err := b.session(ctx)
		if err != nil {
			return nil, fmt.Errorf("box %s: dial agent: %w", b.data.ID, err)
		}
		st, err := sess.OpenStream()
		if err == nil {
			return st, nil
		}
		lastErr = err
		b.resetSession(sess)
	}
	return nil, fmt.Errorf("box %s: dial agent: %w", b.data.ID, lastErr)
}

// waitAgent waits until the agent answers GET /health over the channel, the
// VM dies, or ctx ends. A stream opened before the guest listens is not
// lost: its bytes wait in QEMU until the guest opens the port. When an
// attempt times out anyway, the session is reset and tried again.
func (b *box) waitAgent(ctx context.Context) error {
	return b.waitAgentEvery(ctx, 60*time.Second)
}

// waitAgentEvery is waitAgent with each attempt bounded by probe. A
// resumed guest listens already, but its end of the channel may still
// hold the session of the host before the pause: a short probe resets
// ours, which makes the guest start a fresh one.
func (b *box) waitAgentEvery(ctx context.Context, probe time.Duration) error {
	var last error
	for {
		last = b.probe(ctx, probe)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not ready: %w (last: %v)", ctx.Err(), last)
		case <-b.dead:
			return fmt.Errorf("qemu exited before the agent answered (last: %v)", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// probe sends one GET /health and waits for a response for up to timeout.
func (b *box) probe(ctx context.Context, timeout time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := b.dial(pctx)
	if err != nil {
		return err
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		if _, err := c.Write([]byte("GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")); err != nil {
			done <- err
			return
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "HTTP/1.1 2") {
			err = fmt.Errorf("agent health: %q", strings.TrimSpace(line))
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-b.dead:
		return errors.New("qemu exited")
	case <-pctx.Done():
		c.Close()
		b.sessMu.Lock()
		sess := b.sess
		b.sessMu.Unlock()
		b.resetSession(sess)
		return fmt.Errorf("no answer from the agent in %s", timeout)
	}
}

// State returns the versioned handle Adopt takes.
func (b *box) State() driver.State {
	return stateOf(b.d, b.data)
}

// Wait returns a channel closed when QEMU has exited.
func (b *box) Wait() <-chan struct{} { return b.dead }

// quitGrace is how long Stop lets QEMU end after QMP "quit" before it
// sends SIGKILL. A variable so that a test can make it long enough that
// waiting it out cannot pass for the kill path.
var quitGrace = 5 * time.Second

// Stop ends the VM and removes its directory (overlay, sockets, logs). The
// guest is not shut down gracefully: its disk is discarded anyway, so QMP
// "quit" ends QEMU at once, and SIGKILL follows if it does not. It is safe
// to call more than once and after the VM died; teardown is not cut short
// by ctx's cancellation.
func (b *box) Stop(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	b.resetSession(b.currentSession())
	var errs []error
	if running(b.data.Pid, b.data.StartTime) {
		qctx, qcancel := context.WithTimeout(ctx, 3*time.Second)
		qerr := qmpCommand(qctx, filepath.Join(b.data.Dir, "qmp.sock"), "quit")
		qcancel()
		wait := quitGrace
		if qerr != nil {
			// No QMP yet (a VM stopped in its first moments) or none
			// any more: nothing will end QEMU but the signal.
			wait = 0
		}
		select {
		case <-b.dead:
		case <-time.After(wait):
			_ = unix.Kill(b.data.Pid, unix.SIGKILL)
		}
		if !waitGone(b.data.Pid, b.data.StartTime, 10*time.Second) {
			errs = append(errs, fmt.Errorf("qemu pid %d still alive after SIGKILL", b.data.Pid))
		}
	}
	b.stopWatch()
	if len(errs) == 0 {
		if err := os.RemoveAll(b.data.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	b.markDead()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop %s: %w", b.data.ID, err)
	}
	b.stopped = true
	return nil
}

func (b *box) currentSession() *yamux.Session {
	b.sessMu.Lock()
	defer b.sessMu.Unlock()
	return b.sess
}

// Adopt re-attaches to a VM from its State. When QEMU is no longer running,
// Adopt still returns a Box — with Wait already closed — so the caller can
// Stop it to free its directory; an error means the state itself is
// unusable (Cleanup then removes what is left). The agent channel is
// reconnected lazily by the first DialAgent.
func (d *Driver) Adopt(ctx context.Context, st driver.State) (driver.Box, error) {
	data, err := d.decode(st)
	if err != nil {
		return nil, fmt.Errorf("adopt: %w", err)
	}
	if data.Paused || !running(data.Pid, data.StartTime) || !cmdlineHas(data.Pid, data.Dir) {
		b := &box{d: d, data: data, dead: make(chan struct{})}
		b.markDead()
		return b, nil
	}
	if len(data.Argv) > 0 {
		// Only a daemon that could pause can have left one half paused.
		// A thaw that fails (QMP slow on a loaded host) does not make a
		// running VM an orphan to kill: it is adopted all the same, and
		// a VM left frozen shows as one that does not answer.
		_ = thaw(ctx, data)
	}
	b := newBox(d, data, nil)
	b.adopted = true
	return b, nil
}

// cmdlineHas reports whether pid's command line mentions s (the box
// directory): the pid is QEMU of that box, not a stranger.
func cmdlineHas(pid int, s string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(data), s)
}
