package sandbox

import (
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
// and activity times are persisted. Dead boxes are reaped by their watchers
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
			case !e.lastActive.Equal(sb.LastActiveAt) && now.Sub(sb.LastActiveAt) > 10*time.Second:
				// Activity is kept in memory on the hot path and written
				// out here, at most every few seconds per sandbox.
				sb.LastActiveAt = e.lastActive
				r := *e.rec
				dirty = append(dirty, &r)
			}
		case StateStopped, StateFailed:
			if now.Sub(e.rec.StoppedAt) >= m.cfg.Retention {
				purge = append(purge, id)
				delete(m.entries, id)
			}
		}
	}
	m.mu.Unlock()
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
	for _, v := range victims {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.teardown(v.e, v.reason)
		}()
	}
}
