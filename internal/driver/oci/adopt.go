package oci

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// Adoption asks the runtime (`runsc state` / `runc state`) about each box
// a previous daemon left running. Only the runtime's own answer that the
// container is gone — it does not exist, or it is not running — makes a box
// dead, which the manager then destroys. A runtime that fails in another way
// or does not answer in time (a loaded host at restart, a lock held by a
// runtime call that is itself stuck) says nothing about the box, which is
// most likely still serving: it is adopted all the same, and asked about
// again in the background until the runtime answers.

// Defaults of Driver.adoptProbe and Driver.adoptRetry.
const (
	// defaultAdoptProbe bounds one runtime call of adoption. A runsc call
	// took over a second on a loaded host (the soak); far more than that
	// is a runtime that is stuck. The daemon's API is down until every
	// adoption has returned, and a call cut short costs only a later
	// answer (the box is adopted meanwhile), so the bound is short.
	defaultAdoptProbe = 10 * time.Second
	// defaultAdoptRetry is the first wait before asking again; each wait
	// doubles, up to maxAdoptRetry.
	defaultAdoptRetry = time.Second
	maxAdoptRetry     = 30 * time.Second
)

// verdict is what the runtime said about a container.
type verdict int

const (
	verdictRunning verdict = iota // running, with a pid
	verdictGone                   // does not exist, or exists but is not running
	verdictUnknown                // the call failed or timed out: nothing is known
)

// probe asks the runtime about container id, for at most the probe timeout.
// The error is the runtime call's, for verdictUnknown.
func (d *Driver) probe(ctx context.Context, id string) (containerState, verdict, error) {
	timeout := d.adoptProbe
	if timeout <= 0 {
		timeout = defaultAdoptProbe
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cs, err := d.state(pctx, id)
	var exit *exec.ExitError
	switch {
	case err == nil && cs.Status == "running" && cs.Pid > 0:
		return cs, verdictRunning, nil
	case err == nil:
		return cs, verdictGone, nil // stopped (or created, or frozen: not a serving box; Adopt resumes a frozen gVisor box)
	case pctx.Err() == nil && errors.As(err, &exit) && isNotExist(err):
		// The runtime ran to its end and said so: not a runtime that
		// could not be started ("executable file not found").
		return cs, verdictGone, nil
	}
	return cs, verdictUnknown, err
}

// unsureBox is the Box of a container the runtime could not tell about at
// adoption. Its Wait stays open while the runtime is asked again, with
// backoff; once the runtime answers, the container is watched as any
// other box (inner), or the box is dead if the runtime says the container
// is gone. Its agent may be dialled meanwhile.
type unsureBox struct {
	d    *Driver
	data boxData

	dead     chan struct{} // closed when the container is known gone, or the box stopped
	deadOnce sync.Once
	stop     chan struct{} // closed to end the asking (stopAsking)
	stopOnce sync.Once
	done     chan struct{} // closed when the asking goroutine has ended

	mu      sync.Mutex
	inner   *box // the watched box, once the runtime said it runs
	stopped bool // a Stop freed everything
}

var _ driver.Box = (*unsureBox)(nil)

// adoptUnsure returns the box of container data.ID, whose runtime did not
// answer, and starts asking it again.
func (d *Driver) adoptUnsure(data boxData) *unsureBox {
	u := &unsureBox{d: d, data: data, dead: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go u.ask()
	return u
}

func (u *unsureBox) markDead() { u.deadOnce.Do(func() { close(u.dead) }) }

// ask asks the runtime about the container until it answers or the box
// is stopped; after an answer of "running" it passes the watched box's
// death on.
func (u *unsureBox) ask() {
	defer close(u.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // a stop also cuts short a runtime call in progress
		select {
		case <-u.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	delay := u.d.adoptRetry
	if delay <= 0 {
		delay = defaultAdoptRetry
	}
	for {
		select {
		case <-u.stop:
			return
		case <-time.After(delay):
		}
		cs, v, _ := u.d.probe(ctx, u.data.ID)
		switch v {
		case verdictGone:
			u.markDead()
			return
		case verdictRunning:
			data := u.data
			data.Pid = cs.Pid
			inner := newBox(u.d, data)
			u.mu.Lock()
			u.inner = inner
			u.mu.Unlock()
			select {
			case <-inner.Wait():
				u.markDead()
			case <-u.stop:
			}
			return
		}
		delay = min(2*delay, maxAdoptRetry)
	}
}

// stopAsking ends the asking and the watching without touching the
// container (a daemon exiting, or a test forgetting the box as a crashed
// daemon would). The box counts as dead from then on.
func (u *unsureBox) stopAsking() {
	u.stopOnce.Do(func() { close(u.stop) })
	<-u.done
	u.mu.Lock()
	inner := u.inner
	u.mu.Unlock()
	if inner != nil {
		inner.stopWatch()
	}
	u.markDead()
}

// view is a box for the calls that only need the box's data and its Wait
// channel; it watches nothing.
func (u *unsureBox) view() *box { return &box{d: u.d, data: u.data, dead: u.dead} }

// DialAgent opens a connection to the agent's socket, as box.DialAgent.
func (u *unsureBox) DialAgent(ctx context.Context) (net.Conn, error) { return u.view().DialAgent(ctx) }

// State returns the handle Adopt takes, as box.State.
func (u *unsureBox) State() driver.State { return u.view().State() }

// Wait returns a channel closed once the runtime has said the container is
// gone, the watched container has died, or the box was stopped.
func (u *unsureBox) Wait() <-chan struct{} { return u.dead }

// Stop ends the asking, then stops the container and frees everything, as
// box.Stop does. It is safe to call more than once.
func (u *unsureBox) Stop(ctx context.Context) error {
	u.stopOnce.Do(func() { close(u.stop) })
	<-u.done
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stopped {
		return nil
	}
	b := u.inner
	if b == nil {
		b = deadBox(u.d, u.data)
	}
	err := b.Stop(ctx)
	u.markDead()
	if err == nil {
		u.stopped = true
	}
	return err
}
