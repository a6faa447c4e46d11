// Package procwatch tells when a host process ends: the runtime of a
// container, a QEMU or a Firecracker. Every driver needs this for its boxes'
// Wait, and for boxes it re-adopts after a daemon restart the process is not
// its child, so it cannot wait(2) for it. A pid alone is not enough either:
// after the process ends the kernel may give its pid to another, which a
// naive kill(pid, 0) would take for the box. So a process is named by its
// pid and its start time (field 22 of /proc/PID/stat), and watched through a
// pidfd, which refers to that one process whatever happens to its pid.
//
// Drivers import it; it imports nothing of the project.
package procwatch

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Process is one host process: a pid and the start time that tells it
// from a later process given the same pid.
type Process struct {
	Pid       int
	StartTime uint64 // clock ticks after boot, as /proc/PID/stat says
}

// Lookup returns the live (not zombie) process that has pid now.
func Lookup(pid int) (Process, error) {
	st, ok := startTime(pid)
	if !ok {
		return Process{}, fmt.Errorf("process %d: %w", pid, os.ErrProcessDone)
	}
	return Process{Pid: pid, StartTime: st}, nil
}

// Alive reports whether p is still running: its pid exists, is not a
// zombie, and (when p.StartTime is set) is the same process.
func (p Process) Alive() bool {
	st, ok := startTime(p.Pid)
	return ok && (p.StartTime == 0 || st == p.StartTime)
}

// startTime returns the start time of a live, non-zombie process.
func startTime(pid int) (uint64, bool) {
	if pid <= 0 {
		return 0, false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return parseStat(data)
}

// parseStat reads the state and start time out of /proc/PID/stat. The
// command name (field 2) is in parentheses and may hold anything, spaces and
// ")" included, so fields are counted after its last ")".
func parseStat(data []byte) (uint64, bool) {
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" || f[0] == "x" {
		return 0, false
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	return st, err == nil
}

// Options tune a Watcher. The zero value is fine.
type Options struct {
	// Exited, when not nil, is closed when the process has been waited
	// for by its parent (a child of this daemon that something else
	// reaps): the watcher then takes that as the end.
	Exited <-chan struct{}
	// Every, when set, is called about every Interval (to within a
	// quarter of a second) while the process runs, from the watcher's
	// goroutine (Firecracker bounds its console log so).
	Every    func()
	Interval time.Duration // default 5 s
	// OnEnd, when set, is called once from the watcher's goroutine when
	// the process ends (not when the watch is stopped), before Dead
	// closes: a box marks itself dead so.
	OnEnd func()
}

// Watcher closes Dead when its process ends. Create it with Watch; Stop
// ends the watching (not the process).
type Watcher struct {
	p    Process
	opts Options

	dead     chan struct{}
	deadOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// poll is how often the watcher wakes to see whether it was stopped.
const poll = 250 * time.Millisecond

// Watch starts watching p in a goroutine of its own, which ends when p
// ends or Stop is called.
func Watch(p Process, opts Options) *Watcher {
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	w := &Watcher{p: p, opts: opts, dead: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// Dead is closed once the process has ended.
func (w *Watcher) Dead() <-chan struct{} { return w.dead }

// Done is closed once the watcher has stopped watching: the process ended
// (Dead is closed too) or Stop was called.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Stop ends the watching and waits for the watcher's goroutine. It is safe
// to call more than once, and after the process ended.
func (w *Watcher) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

func (w *Watcher) markDead() {
	w.deadOnce.Do(func() {
		if w.opts.OnEnd != nil {
			w.opts.OnEnd()
		}
		close(w.dead)
	})
}

func (w *Watcher) run() {
	defer close(w.done)
	if w.opts.Exited != nil {
		last := time.Now()
		for {
			select {
			case <-w.opts.Exited:
				w.markDead()
				return
			case <-w.stop:
				return
			case <-time.After(poll):
			}
			if w.tick(&last) {
				return
			}
		}
	}
	fd, err := unix.PidfdOpen(w.p.Pid, 0)
	if err == nil && !w.p.Alive() {
		// The pidfd may name a successor that took the pid: the
		// process we were told of is gone.
		unix.Close(fd)
		w.markDead()
		return
	}
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			w.markDead()
			return
		}
		w.pollAlive() // no pidfds (old kernel, seccomp): poll
		return
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	last := time.Now()
	for {
		n, err := unix.Poll(fds, int(poll/time.Millisecond))
		if n > 0 {
			w.markDead()
			return
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			// Not an answer about the process: look at it instead.
			w.pollAlive()
			return
		}
		if w.tick(&last) {
			return
		}
	}
}

// pollAlive is run without a pidfd: it checks the process every poll.
func (w *Watcher) pollAlive() {
	last := time.Now()
	for {
		if !w.p.Alive() {
			w.markDead()
			return
		}
		select {
		case <-w.stop:
			return
		case <-time.After(poll):
		}
		if w.tick(&last) {
			return
		}
	}
}

// tick runs Every when it is due and reports whether the watcher was
// stopped.
func (w *Watcher) tick(last *time.Time) bool {
	select {
	case <-w.stop:
		return true
	default:
	}
	if w.opts.Every != nil && time.Since(*last) >= w.opts.Interval {
		w.opts.Every()
		*last = time.Now()
	}
	return false
}

// Find returns the live processes whose argument vector (/proc/PID/cmdline)
// match accepts. It is how a restarted daemon finds a runtime call its
// predecessor started and did not see finish: that process is not its
// child and its pid was never recorded, but its arguments name the box.
// Processes that end while being read are skipped; kernel threads (no
// arguments) are never offered to match.
func Find(match func(argv []string) bool) ([]Process, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("find processes: %w", err)
	}
	self := os.Getpid()
	var out []Process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(raw) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		if !match(argv) {
			continue
		}
		if p, err := Lookup(pid); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// RealUID returns the real user ID of p, from /proc/PID/status. A cleanup
// that kills what it finds by arguments checks it: anyone can start a
// process whose arguments name a box, but not one whose real user is the
// daemon's (root), set-user-ID programs included.
func (p Process) RealUID() (int, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", p.Pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			uid, err := strconv.Atoi(f[0])
			if err != nil {
				return 0, fmt.Errorf("process %d: uid %q: %w", p.Pid, f[0], err)
			}
			return uid, nil
		}
	}
	return 0, fmt.Errorf("process %d: no Uid line in its status", p.Pid)
}

// FindOwn is Find restricted to processes whose real user is this one's.
func FindOwn(match func(argv []string) bool) ([]Process, error) {
	ps, err := Find(match)
	if err != nil {
		return nil, err
	}
	me := os.Getuid()
	own := ps[:0]
	for _, p := range ps {
		if uid, err := p.RealUID(); err == nil && uid == me {
			own = append(own, p)
		}
	}
	return own, nil
}
