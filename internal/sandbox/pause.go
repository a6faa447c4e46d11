package sandbox

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// DefaultPausedLifetime is how long a paused sandbox is kept when
// Config.PausedLifetime is zero.
const DefaultPausedLifetime = 7 * 24 * time.Hour

// pauseBound bounds a pause or a resume in the driver: a VM's memory is
// written or read at disk speed, and under TCG a resumed guest takes a
// while to answer.
const pauseBound = 5 * time.Minute

// saveRoom is the free space on the data directory that saving rec's
// box to disk (a pause, a snapshot, a fork's image) may take: a VM's
// memory image is up to its memory, and so is a gVisor checkpoint (the
// Sentry's memory, uncompressed, the files the box wrote among it: about
// 200 MiB for an idle desktop). runc boxes are never saved.
func saveRoom(rec *record) int64 {
	if rec.Sandbox.Isolation == driver.IsolationNamespace {
		return 256 << 20
	}
	mb := int64(rec.Request.MemoryMB)
	if mb <= 0 {
		mb = 2048 // the largest of the VM backends' defaults
	}
	return (mb + 64) << 20
}

// resumeRoom is the free space a resume wants on the data directory:
// what the restored box and its runtime write at once, with room to run.
const resumeRoom = 64 << 20

// roomToSave refuses to save rec's box (what names the act) when the
// data directory has less free space than that may take. Running out
// midway is worse than not starting: the save fails after it has taken
// the disk's last bytes from every other sandbox (Debian's runsc of 2022
// also ended the sandbox; a soak lost 40 that way).
func (m *Manager) roomToSave(rec *record, what string) error {
	free, err := m.freeBytes(m.cfg.DataDir)
	if err != nil {
		return nil // the save itself will say
	}
	if need := saveRoom(rec); free < need {
		return errdefs.New(errdefs.ErrUnavailable, "cubicled's data directory is full: %d MiB free, and %s sandbox %s may take %d MiB; it runs on", free>>20, what, rec.Sandbox.ID, need>>20)
	}
	return nil
}

// freeSpace is what the filesystem holding dir has free for cubicled.
func freeSpace(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// pauser returns the Pauser of a sandbox's backend, or why there is none.
func (m *Manager) pauser(ctx context.Context, backend string) (driver.Pauser, error) {
	p, ok := m.cfg.Drivers[backend].(driver.Pauser)
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotSupported, "the %s backend cannot pause sandboxes", backend)
	}
	if err := p.CanPause(ctx); err != nil {
		return nil, errdefs.New(errdefs.ErrNotSupported, "the %s backend cannot pause sandboxes on this host: %v", backend, err)
	}
	return p, nil
}

// PauseInfo reports whether sandboxes of backend can pause here, and why
// not; GET /v1/info shows it.
func (m *Manager) PauseInfo(ctx context.Context, backend string) (bool, string) {
	if _, err := m.pauser(ctx, backend); err != nil {
		return false, errdefs.UserMessage(err)
	}
	return true, ""
}

// Pause saves a running sandbox to disk and ends its box: it holds no CPU
// and no memory (nor a slot) until Resume, only its files, whose size
// the sandbox reports. Its expiry becomes the paused lifetime; the
// running time it had left is given back on resume.
func (m *Manager) Pause(ctx context.Context, id string) (Sandbox, error) {
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	p, err := m.pauser(ctx, e.rec.Sandbox.Backend)
	if err != nil {
		return Sandbox{}, err
	}
	e.op.Lock()
	sb, dead, err := m.pauseLocked(ctx, e, p)
	e.op.Unlock()
	if dead {
		m.teardown(e, "dead")
	}
	return sb, err
}

// pauseLocked is Pause with e.op held; dead reports a box that died in
// a failed pause, which the caller tears down.
func (m *Manager) pauseLocked(ctx context.Context, e *entry, p driver.Pauser) (_ Sandbox, dead bool, _ error) {
	id := e.rec.Sandbox.ID
	m.mu.Lock()
	if s := e.rec.Sandbox.State; s != StateRunning {
		m.mu.Unlock()
		return Sandbox{}, false, errdefs.Conflict("sandbox %s is %s; only a running sandbox can be paused", id, s)
	}
	if err := m.roomToSave(e.rec, "pausing"); err != nil {
		m.mu.Unlock()
		return Sandbox{}, false, err
	}
	_ = m.transitionLocked(e, StatePausing) // running → pausing
	box := e.box
	m.mu.Unlock()
	if err := m.persist(e); err != nil {
		m.log.Warn("persist pausing", "sandbox", id, "err", err)
	}
	// A VM resumed begins its console log anew: read what it printed
	// before it goes.
	m.readConsole(e, false)
	t0 := time.Now()
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseBound)
	paused, perr := p.Pause(pctx, box)
	cancel()
	log := m.log.With("sandbox", id)
	now := m.cfg.Clock.Now()
	m.mu.Lock()
	if perr != nil {
		stillPausing := e.rec.Sandbox.State == StatePausing
		if stillPausing {
			_ = m.transitionLocked(e, StateRunning) // pausing → running: the box is as it was, or dead and reaped next
		}
		m.mu.Unlock()
		log.Error("pause failed", "err", perr)
		if stillPausing {
			if err := m.persist(e); err != nil {
				log.Warn("persist running", "err", err)
			}
		}
		if errors.Is(perr, driver.ErrNotPausableNow) {
			return Sandbox{}, false, errdefs.Conflict("sandbox %s cannot pause now; it runs on: %v", id, perr)
		}
		m.m.PauseFailures.WithLabelValues(e.rec.Sandbox.Backend).Inc()
		return Sandbox{}, isClosed(box.Wait()), errdefs.New(errdefs.ErrUnavailable, "pause sandbox %s: %v", id, perr)
	}
	if e.client != nil {
		e.client.Close()
	}
	e.box, e.client, e.paused = nil, nil, &paused
	m.savedAs(e.rec, paused, now)
	if e.rec.Sandbox.State != StatePausing {
		// Destroyed meanwhile: teardown, waiting for e.op, discards it.
		m.mu.Unlock()
		return Sandbox{}, false, errdefs.Conflict("sandbox %s was destroyed while it paused", id)
	}
	_ = m.transitionLocked(e, StatePaused) // pausing → paused
	sb := m.snapshotLocked(e)
	m.mu.Unlock()
	if err := m.persist(e); err != nil {
		log.Warn("persist paused", "err", err)
	}
	m.m.PauseDuration.WithLabelValues(sb.Backend).Observe(time.Since(t0).Seconds())
	log.Info("sandbox paused", "ms", time.Since(t0).Milliseconds(), "bytes", paused.Bytes)
	return sb, false, nil
}

// Resume brings a paused sandbox back as it was. Its expiry is
// timeoutSeconds from now when that is > 0, else the running time it
// had left when it paused (its whole lifetime again, when it paused
// because that ran out); never beyond the maximum lifetime. A resumed
// sandbox takes a slot again, so Resume is refused as a create would
// be when none is free.
func (m *Manager) Resume(ctx context.Context, id string, timeoutSeconds int) (Sandbox, error) {
	if timeoutSeconds < 0 {
		return Sandbox{}, errdefs.Invalid("timeout_seconds must be >= 0")
	}
	e, err := m.entry(id)
	if err != nil {
		return Sandbox{}, err
	}
	p, err := m.pauser(ctx, e.rec.Sandbox.Backend)
	if err != nil {
		return Sandbox{}, err
	}
	e.op.Lock()
	sb, lost, err := m.resumeLocked(ctx, e, p, timeoutSeconds)
	e.op.Unlock()
	if lost {
		m.teardown(e, "resume_failed")
	}
	return sb, err
}

// resumeLocked is Resume with e.op held; lost reports a sandbox whose
// saved state did not survive a failed resume, which the caller tears
// down.
func (m *Manager) resumeLocked(ctx context.Context, e *entry, p driver.Pauser, timeoutSeconds int) (_ Sandbox, lost bool, _ error) {
	id := e.rec.Sandbox.ID
	m.mu.Lock()
	if s := e.rec.Sandbox.State; s != StatePaused || e.paused == nil {
		m.mu.Unlock()
		return Sandbox{}, false, errdefs.Conflict("sandbox %s is %s; only a paused sandbox can be resumed", id, s)
	}
	if n := m.activeLocked(); n >= m.cfg.MaxSandboxes {
		m.mu.Unlock()
		return Sandbox{}, false, errdefs.New(errdefs.ErrCapacity, "all %d sandbox slots are in use; resume when one is free", m.cfg.MaxSandboxes)
	}
	if owner := e.rec.Request.Owner; owner != "" && m.cfg.MaxPerOwner > 0 && m.activeOfLocked(owner) >= m.cfg.MaxPerOwner {
		m.mu.Unlock()
		return Sandbox{}, false, errdefs.New(errdefs.ErrQuota, "this API key already has %d live sandboxes, its limit; resume when one has ended", m.cfg.MaxPerOwner)
	}
	if free, err := m.freeBytes(m.cfg.DataDir); err == nil && free < resumeRoom {
		// A restore writes (its pid file, the console, the box's own
		// writes to its disk) and fails without room: the soak met
		// "error writing PID file: no space left on device".
		m.mu.Unlock()
		return Sandbox{}, false, errdefs.New(errdefs.ErrUnavailable, "cubicled's data directory is full: %d MiB free, and resuming sandbox %s needs %d MiB; it stays paused", free>>20, id, resumeRoom>>20)
	}
	_ = m.transitionLocked(e, StateResuming) // paused → resuming
	saved := *e.paused
	m.mu.Unlock()
	if err := m.persist(e); err != nil {
		m.log.Warn("persist resuming", "sandbox", id, "err", err)
	}
	log := m.log.With("sandbox", id)
	t0 := time.Now()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseBound)
	defer cancel()
	box, rerr := p.Resume(rctx, saved)
	if rerr != nil {
		lost := errors.Is(rerr, driver.ErrResumeLost)
		log.Error("resume failed", "err", rerr, "lost", lost)
		m.m.PauseFailures.WithLabelValues(e.rec.Sandbox.Backend).Inc()
		m.mu.Lock()
		if e.rec.Sandbox.State == StateResuming {
			_ = m.transitionLocked(e, StatePaused) // resuming → paused: the saved state is kept (or lost: torn down next)
		}
		if lost {
			e.rec.Sandbox.Error = "resume: " + rerr.Error()
		}
		m.mu.Unlock()
		if err := m.persist(e); err != nil {
			log.Warn("persist paused", "err", err)
		}
		if lost {
			return Sandbox{}, true, errdefs.New(errdefs.ErrUnavailable, "resume sandbox %s failed and its saved state is lost; the sandbox is destroyed: %v", id, rerr)
		}
		return Sandbox{}, false, errdefs.New(errdefs.ErrUnavailable, "resume sandbox %s: %v; it is still paused", id, rerr)
	}
	client := agentclient.New(box.DialAgent, e.rec.Token)
	st := box.State()
	now := m.cfg.Clock.Now()
	m.mu.Lock()
	e.box, e.client, e.paused = box, client, nil
	e.rec.DriverState = &st
	e.rec.Sandbox.PausedBytes = 0
	e.rec.Sandbox.PausedAt = time.Time{}
	e.rec.Sandbox.ExpiresAt = m.resumedExpiry(e.rec, now, timeoutSeconds)
	e.lastActive = now
	if e.rec.Sandbox.State != StateResuming {
		// Destroyed meanwhile: teardown, waiting for e.op, stops it.
		m.mu.Unlock()
		return Sandbox{}, false, errdefs.Conflict("sandbox %s was destroyed while it resumed", id)
	}
	_ = m.transitionLocked(e, StateRunning) // resuming → running
	sb := m.snapshotLocked(e)
	m.mu.Unlock()
	if err := m.persist(e); err != nil {
		log.Warn("persist resumed", "err", err)
	}
	m.watch(e)
	m.m.ResumeDuration.WithLabelValues(sb.Backend).Observe(time.Since(t0).Seconds())
	log.Info("sandbox resumed", "ms", time.Since(t0).Milliseconds())
	if e.rec.Sandbox.Isolation == driver.IsolationVM {
		m.syncClock(e, client)
	}
	return sb, false, nil
}

// savedAs records in r that its box is saved as p since now: the
// running time it had left is kept for the resume, and it expires at the
// paused lifetime.
func (m *Manager) savedAs(r *record, p driver.Paused, now time.Time) {
	r.DriverState = &p.State
	r.Sandbox.PausedBytes, r.Sandbox.PausedAt = p.Bytes, now
	r.Life = -1
	if !r.Sandbox.ExpiresAt.IsZero() {
		r.Life = max(r.Sandbox.ExpiresAt.Sub(now), 0)
	}
	r.Sandbox.ExpiresAt = time.Time{}
	if life := m.cfg.PausedLifetime; life > 0 {
		r.Sandbox.ExpiresAt = now.Add(life)
	}
}

// resumedExpiry is when a sandbox resumed at now expires (zero: never).
func (m *Manager) resumedExpiry(r *record, now time.Time, timeoutSeconds int) time.Time {
	life := r.Life
	switch {
	case timeoutSeconds > 0:
		life = time.Duration(timeoutSeconds) * time.Second
	case life == 0:
		// It paused as its lifetime ran out (auto-pause): a new one.
		life = m.cfg.MaxLifetime
		if t := r.Request.TimeoutSeconds; t > 0 && (life < 0 || time.Duration(t)*time.Second < life) {
			life = time.Duration(t) * time.Second
		}
	}
	if max := m.cfg.MaxLifetime; max >= 0 && (life < 0 || life > max) {
		life = max
	}
	if life < 0 {
		return time.Time{}
	}
	return now.Add(life)
}

// syncClock sets a resumed VM's clock: its guest kernel counted no time
// while the VM was saved, and would run behind by the pause. A failure
// is logged: the sandbox works, with a clock behind.
func (m *Manager) syncClock(e *entry, c *agentclient.Client) {
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	now := time.Now()
	res, err := c.Exec(ctx, agentclient.ExecRequest{Argv: []string{"date", "-u", "-s", fmt.Sprintf("@%d.%09d", now.Unix(), now.Nanosecond())}}, nil)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("date: exit %d: %s", res.ExitCode, res.Stderr)
	}
	if err != nil {
		m.log.Warn("set the resumed guest's clock", "sandbox", e.rec.Sandbox.ID, "err", err)
	}
}
