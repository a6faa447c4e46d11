package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// reapLoop runs Reap every ReapInterval until the manager closes.
func (m *Manager) reapLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			m.Reap()
		}
	}
}

// Reap runs one reaper pass: sandboxes past their lifetime or idle timeout are
// destroyed, stopped and failed records older than the retention are dropped,
// activity times are persisted, and sandboxes whose stop could not free
// everything are stopped again, so the host and the store agree again
// within a pass of the cause going away. Dead boxes are reaped by their watchers
// as soon as they die, not here. Reap is exported for tests with a fake clock.
func (m *Manager) Reap() {
	now := m.cfg.Clock.Now()
	type victim struct {
		e      *entry
		reason string
	}
	var victims []victim
	var purge []string
	var dirty []*record
	var retry []*entry
	m.mu.Lock()
	for id, e := range m.entries {
		sb := &e.rec.Sandbox
		switch sb.State {
		case StateRunning:
			switch {
			case !sb.ExpiresAt.IsZero() && !now.Before(sb.ExpiresAt):
				victims = append(victims, victim{e, "expired"})
			case e.rec.IdleTimeout > 0 && now.Sub(e.lastActive) >= e.rec.IdleTimeout:
				victims = append(victims, victim{e, "idle"})
				e.lastActive = now // an auto-pause that fails is not retried every pass
			case !e.lastActive.Equal(sb.LastActiveAt) && now.Sub(sb.LastActiveAt) > 10*time.Second:
				// Activity is kept in memory on the hot path and written
				// out here, at most every few seconds per sandbox.
				sb.LastActiveAt = e.lastActive
				r := *e.rec
				dirty = append(dirty, &r)
			}
		case StatePaused:
			// Never idle: a paused sandbox has its own lifetime.
			if !sb.ExpiresAt.IsZero() && !now.Before(sb.ExpiresAt) {
				victims = append(victims, victim{e, "paused_expired"})
			}
		case StateStopped, StateFailed:
			if e.stopFailed && !e.retrying {
				e.retrying = true
				retry = append(retry, e)
				continue
			}
			if now.Sub(e.rec.StoppedAt) >= m.cfg.Retention && !e.stopFailed {
				purge = append(purge, id)
				delete(m.entries, id)
			}
		}
	}
	m.mu.Unlock()
	m.reapRecordings(now)
	for _, r := range dirty {
		if err := m.store.put(r); err != nil {
			m.log.Warn("persist activity", "sandbox", r.Sandbox.ID, "err", err)
		}
	}
	for _, id := range purge {
		if err := m.store.delete(id); err != nil {
			m.log.Warn("purge record", "sandbox", id, "err", err)
		}
	}
	for _, e := range retry {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.retryStop(e)
		}()
	}
	for _, v := range victims {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if v.reason != "paused_expired" && v.e.rec.Request.AutoPause {
				if m.autoPause(v.e, v.reason) {
					return
				}
			}
			m.teardown(v.e, v.reason)
		}()
	}
}

// retryStop frees what a failed teardown left (the box's processes, mounts
// and directory, its network), and records the sandbox as stopped once
// everything is gone.
func (m *Manager) retryStop(e *entry) {
	id := e.rec.Sandbox.ID
	ctx := context.WithoutCancel(m.ctx)
	e.op.Lock()
	err := m.freeBox(e)
	e.op.Unlock()
	if m.cfg.Network != nil {
		if derr := m.cfg.Network.Detach(ctx, id); derr != nil {
			err = errors.Join(err, fmt.Errorf("detach network: %w", derr))
		}
		m.updateNetGauge()
	}
	m.mu.Lock()
	e.retrying = false
	if err != nil {
		e.rec.Sandbox.Error = "stop: " + err.Error()
		m.mu.Unlock()
		m.log.Warn("stop sandbox again", "sandbox", id, "err", err)
		return
	}
	e.stopFailed = false
	_ = m.transitionLocked(e, StateStopped) // failed → stopped
	e.rec.Sandbox.Error = ""
	m.mu.Unlock()
	if err := m.persist(e); err != nil {
		m.log.Warn("persist stopped", "sandbox", id, "err", err)
	}
	m.releaseVolumes(id)
	m.log.Info("sandbox stopped on a later try; everything it held is freed", "sandbox", id)
}

// autoPause pauses a sandbox created with auto_pause whose lifetime or
// idle timer ran out, and reports whether it did; when it cannot (its
// backend cannot pause, or the pause failed), the reaper destroys it as
// it would any other.
func (m *Manager) autoPause(e *entry, reason string) bool {
	id := e.rec.Sandbox.ID
	if _, err := m.Pause(m.ctx, id); err != nil {
		m.mu.Lock()
		st := e.rec.Sandbox.State
		m.mu.Unlock()
		if st != StateRunning {
			// Paused (or being paused, resumed or destroyed) by another
			// path meanwhile: nothing of it is the reaper's to end.
			return true
		}
		m.log.Warn("auto-pause failed; the sandbox is destroyed", "sandbox", id, "reason", reason, "err", err)
		return false
	}
	m.m.Reaped.WithLabelValues("paused_" + reason).Inc()
	m.log.Info("sandbox auto-paused", "sandbox", id, "reason", reason)
	return true
}
