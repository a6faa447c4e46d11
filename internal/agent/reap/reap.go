// Package reap is the agent's single owner of child-process exit statuses.
//
// The agent runs as PID 1 inside the sandbox, so every orphan in the sandbox
// becomes its child and must be waited for, or it stays a zombie forever.
// Waiting for "any child" (wait4(-1)) and waiting for one specific child
// (os/exec's Cmd.Wait) cannot be mixed: whichever runs first steals the other's
// status. So the agent never calls Cmd.Wait; every child is started through
// Reaper.Spawn and its status is delivered by the one reaper goroutine, which
// also collects the orphans nobody started.
//
// Only the agent's own packages (process, session) import it. Once a Reaper
// in mode All runs, no other code in the process may wait for children.
package reap

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Mode says which children a Reaper waits for.
type Mode int

const (
	// All reaps every child, including orphans re-parented to this process.
	// It is the agent's mode (PID 1 or child subreaper).
	All Mode = iota
	// Own waits only for children started through Spawn and leaves every
	// other child alone, so code using os/exec can share the process
	// (tests of packages that also shell out).
	Own
)

// Status is how a child ended.
type Status struct {
	Pid  int
	Wait syscall.WaitStatus
}

// ExitCode is the exit code, or -1 when the child was killed by a signal
// (the convention of os.ProcessState.ExitCode).
func (s Status) ExitCode() int {
	if s.Wait.Exited() {
		return s.Wait.ExitStatus()
	}
	return -1
}

// Exited reports whether the child called exit (rather than dying of a signal).
func (s Status) Exited() bool { return s.Wait.Exited() }

// String describes the status the way os.ProcessState.String does
// ("exit status 1", "signal: killed"), which is what envd reports.
func (s Status) String() string {
	w := s.Wait
	switch {
	case w.Exited():
		return fmt.Sprintf("exit status %d", w.ExitStatus())
	case w.Signaled():
		str := "signal: " + w.Signal().String()
		if w.CoreDump() {
			str += " (core dumped)"
		}
		return str
	default:
		return fmt.Sprintf("wait status %#x", uint32(w))
	}
}

// Reaper collects the exit statuses of children and hands each to whoever
// spawned it. Create it with Start; stop it with Stop.
type Reaper struct {
	mode Mode
	log  *slog.Logger

	// mu is held while forking and registering a child and while reaping,
	// so the reaper can never collect a child before its waiter exists.
	mu      sync.Mutex
	waiters map[int]chan Status

	// waitAny is wait4(-1, WNOHANG); tests replace it.
	waitAny func(*syscall.WaitStatus) (int, error)

	sigs chan os.Signal
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// reapBatch is how many children one hold of mu reaps at most. A fork
// bomb's orphans can end as fast as the agent reaps them, so "until none
// is left" may never come: a reap that held mu until then kept Spawn, and
// so every exec in the sandbox, waiting for as long as the bomb ran (a CI
// run's exec in a bombed runc sandbox waited 3 min). Between batches a
// waiting Spawn gets mu: sync.Mutex hands it to a waiter that has waited
// over a millisecond.
const reapBatch = 64

// Start makes this process a child subreaper (so orphans of its descendants
// come back to it even when it is not PID 1) and starts the reaper goroutine.
func Start(mode Mode, log *slog.Logger) (*Reaper, error) {
	if log == nil {
		log = slog.Default()
	}
	if mode == All && os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("set child subreaper: %w", err)
		}
	}
	r := &Reaper{
		mode:    mode,
		log:     log,
		waiters: make(map[int]chan Status),
		waitAny: waitAny,
		sigs:    make(chan os.Signal, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	go r.loop()
	return r, nil
}

// Stop stops the reaper goroutine. Children still running are not touched
// and their waiters never receive a status. It is safe to call more than once.
func (r *Reaper) Stop() {
	r.once.Do(func() {
		signal.Stop(r.sigs)
		close(r.stop)
	})
	<-r.done
}

func (r *Reaper) loop() {
	defer close(r.done)
	// The ticker is a safety net: SIGCHLD is coalesced, and a child could
	// in theory exit between the last wait and a lost notification.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-r.sigs:
		case <-tick.C:
		}
		r.reap()
	}
}

// waitAny collects any one child that has ended, without blocking.
func waitAny(ws *syscall.WaitStatus) (int, error) {
	return syscall.Wait4(-1, ws, syscall.WNOHANG, nil)
}

// reap collects every child that has ended, in batches (reapBatch), until
// none is left or the reaper is stopped.
func (r *Reaper) reap() {
	for !r.reapSome() {
		select {
		case <-r.stop:
			return
		default:
		}
	}
}

// reapSome reaps up to reapBatch children under mu. It reports whether
// none that has ended is left.
func (r *Reaper) reapSome() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mode == Own {
		for pid, ch := range r.waiters {
			var ws syscall.WaitStatus
			got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			if got == pid && (ws.Exited() || ws.Signaled()) {
				ch <- Status{Pid: pid, Wait: ws}
				delete(r.waiters, pid)
			} else if errors.Is(err, syscall.ECHILD) {
				// Someone else waited for it; report an unknown end.
				ch <- Status{Pid: pid, Wait: syscall.WaitStatus(0xff00)}
				delete(r.waiters, pid)
			}
		}
		return true
	}
	for range reapBatch {
		var ws syscall.WaitStatus
		pid, err := r.waitAny(&ws)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return true
		}
		if !ws.Exited() && !ws.Signaled() {
			continue // stopped/continued; we did not ask for those
		}
		if ch, ok := r.waiters[pid]; ok {
			ch <- Status{Pid: pid, Wait: ws}
			delete(r.waiters, pid)
		} else {
			r.log.Debug("reaped orphan", "pid", pid, "status", Status{Pid: pid, Wait: ws}.String())
		}
	}
	return false
}

// Spawn runs fork, which must start exactly one child and return its pid,
// with the reaper locked, and registers the child. The returned channel
// receives the child's status exactly once. fork should be quick
// (syscall.ForkExec); it must not wait for anything.
func (r *Reaper) Spawn(fork func() (int, error)) (int, <-chan Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.stop:
		return 0, nil, errors.New("reaper stopped")
	default:
	}
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan Status, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}
