package sandbox

import (
	"fmt"
	"slices"
)

// transitions are the legal moves of a sandbox's state, and the only ones
// the manager makes: every change goes through transitionLocked, so a
// state a caller must not see (a paused sandbox taken for running, a
// stopped one brought back) cannot be reached by a path somebody forgot.
//
//	starting → running → pausing → paused → resuming → running
//	any live state → stopping → stopped | failed
//
// and the exits of the failures: a start that fails ends failed at once
// (nothing of it is left); a pause or a resume that fails goes back to
// where it came from when the box is as it was, or fails; a teardown
// that could not free everything is failed until the reaper frees it on
// a later try (failed → stopped).
var transitions = map[State][]State{
	StateStarting: {StateRunning, StateStopping, StateFailed},
	StateRunning:  {StatePausing, StateStopping},
	StatePausing:  {StatePaused, StateRunning, StateStopping, StateFailed},
	StatePaused:   {StateResuming, StateStopping},
	StateResuming: {StateRunning, StatePaused, StateStopping, StateFailed},
	StateStopping: {StateStopped, StateFailed},
	StateFailed:   {StateStopped},
	StateStopped:  nil,
}

// canTransition reports whether a sandbox may go from one state to the other.
func canTransition(from, to State) bool {
	return slices.Contains(transitions[from], to)
}

// errTransition is an illegal move: a bug in the manager, never the
// caller's fault (requests are checked against the state first).
type errTransition struct {
	id       string
	from, to State
}

func (e *errTransition) Error() string {
	return fmt.Sprintf("sandbox %s: no transition from %s to %s", e.id, e.from, e.to)
}

// move changes r's state to to, if that is legal.
func (r *record) move(to State) error {
	from := r.Sandbox.State
	if !canTransition(from, to) {
		return &errTransition{id: r.Sandbox.ID, from: from, to: to}
	}
	r.Sandbox.State = to
	return nil
}

// transitionLocked moves e to state to, if that is legal, and updates the
// sandbox gauge. m.mu must be held; persisting the record is the caller's.
func (m *Manager) transitionLocked(e *entry, to State) error {
	if err := e.rec.move(to); err != nil {
		m.log.Error("illegal state change refused", "err", err)
		return err
	}
	if !to.live() {
		// A sandbox's figures go when it begins to stop (usage.go).
		m.usage.forget(e.rec.Sandbox.ID)
	}
	m.updateGaugesLocked()
	return nil
}

// holdsSlot reports whether a sandbox in state s takes one of the
// daemon's slots and counts against its owner's live sandboxes: whatever
// holds, or is about to hold, a box's CPU and memory. A paused sandbox
// holds only its files on disk.
func (s State) holdsSlot() bool {
	switch s {
	case StateStarting, StateRunning, StatePausing, StateResuming, StateStopping:
		return true
	}
	return false
}
