package session

import (
	"sync"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/reap"
)

// demand is the state of one on-demand program: how many connections use
// it and when the last one ended. wake tells runDemand that users went
// above zero.
type demand struct {
	idle time.Duration
	wake chan struct{}

	mu       sync.Mutex
	users    int
	lastUser time.Time // when users last fell to zero
}

func newDemand(d *OnDemand) *demand {
	idle := time.Duration(d.IdleSeconds) * time.Second
	if d.IdleSeconds == 0 {
		idle = DefaultIdleSeconds * time.Second
	}
	return &demand{idle: idle, wake: make(chan struct{}, 1)}
}

func (d *demand) acquire() {
	d.mu.Lock()
	d.users++
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *demand) release() {
	d.mu.Lock()
	d.users--
	if d.users == 0 {
		d.lastUser = time.Now()
	}
	d.mu.Unlock()
}

// wanted reports whether the program should run at now: it has users, or
// its last one left less than idle ago.
func (d *demand) wanted(now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.users > 0 || (!d.lastUser.IsZero() && now.Sub(d.lastUser) < d.idle)
}

// demandCheck is how often a running on-demand program is checked for
// having outlived its last user.
const demandCheck = time.Second

// Acquire marks the on-demand program serving port as in use, starting it
// if it is not running, and returns the function that ends the use; ok is
// false (and release a no-op) when no on-demand program serves port. The
// program may not listen yet when Acquire returns: the caller retries its
// connection for as long as it is willing to wait.
func (s *Supervisor) Acquire(port int) (release func(), ok bool) {
	s.mu.Lock()
	d := s.demands[port]
	s.mu.Unlock()
	if d == nil {
		return func() {}, false
	}
	d.acquire()
	var once sync.Once
	return func() { once.Do(d.release) }, true
}

// runDemand runs an on-demand program while it is wanted: it starts it
// when a user arrives, restarts it (with backoff) if it exits while still
// wanted, and stops its process group once it has been unused for its idle
// time.
func (s *Supervisor) runDemand(p Program, d *demand) {
	bo := backoff{min: s.opts.MinBackoff, max: s.opts.MaxBackoff, stable: s.opts.StableAfter}
	for {
		for !d.wanted(time.Now()) {
			select {
			case <-d.wake:
			case <-s.ctx.Done():
				return
			}
		}
		select {
		case <-s.displayUp():
		case <-s.ctx.Done():
			return
		}
		began := time.Now()
		pid, status, err := s.spawn(p.Name, p.Argv, p.User, p.Env)
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.log.Error("session: cannot start program", "program", p.Name, "err", err)
		} else {
			st, stopped := s.untilUnwanted(d, pid, status)
			s.exited(p.Name, st, time.Since(began))
			if stopped {
				s.log.Info("session: stopped, unused", "program", p.Name, "idle", d.idle)
				bo.cur = 0
				continue
			}
		}
		if s.ctx.Err() != nil {
			return
		}
		delay := bo.next(time.Since(began))
		s.log.Info("session: restarting", "program", p.Name, "in", delay)
		if !s.sleep(delay) {
			return
		}
	}
}

// untilUnwanted waits for the program pid to exit, ending it (SIGTERM to
// its process group, SIGKILL after the grace period) once it is no longer
// wanted; stopped reports that it was ended for that reason. When the
// session stops, Stop signals it and this goes on waiting for the exit.
func (s *Supervisor) untilUnwanted(d *demand, pid int, status <-chan reap.Status) (st reap.Status, stopped bool) {
	tick := time.NewTicker(demandCheck)
	defer tick.Stop()
	var kill <-chan time.Time
	for {
		select {
		case st = <-status:
			return st, stopped
		case <-kill:
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			kill = nil
		case now := <-tick.C:
			if stopped || s.ctx.Err() != nil || d.wanted(now) {
				continue
			}
			stopped = true
			_ = syscall.Kill(-pid, syscall.SIGTERM)
			t := time.NewTimer(s.opts.Grace)
			defer t.Stop()
			kill = t.C
		}
	}
}
