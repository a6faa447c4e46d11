package sandbox

import (
	"errors"
	"testing"
)

// TestTransitions checks the state machine's shape: every state is in it,
// each live state can be stopped, stopped is the end, and the moves of
// pause and resume are exactly those of the design.
func TestTransitions(t *testing.T) {
	all := []State{StateStarting, StateRunning, StatePausing, StatePaused, StateResuming, StateStopping, StateStopped, StateFailed}
	if len(transitions) != len(all) {
		t.Errorf("transitions has %d states, want %d", len(transitions), len(all))
	}
	for _, s := range all {
		if _, ok := transitions[s]; !ok {
			t.Errorf("state %s has no entry in transitions", s)
		}
		if s != StateStopped && s != StateFailed && s != StateStopping && !canTransition(s, StateStopping) {
			t.Errorf("a %s sandbox cannot be stopped", s)
		}
		for _, to := range transitions[s] {
			if _, ok := transitions[to]; !ok {
				t.Errorf("%s → %s: unknown target", s, to)
			}
		}
	}
	for _, tt := range []struct {
		from, to State
		ok       bool
	}{
		{StateStarting, StateRunning, true},
		{StateRunning, StatePausing, true},
		{StatePausing, StatePaused, true},
		{StatePaused, StateResuming, true},
		{StateResuming, StateRunning, true},
		{StateStopping, StateStopped, true},
		{StateFailed, StateStopped, true},
		{StatePaused, StatePaused, false},
		{StatePaused, StateRunning, false}, // only by resuming
		{StatePaused, StatePausing, false},
		{StateRunning, StateResuming, false},
		{StateRunning, StateStarting, false},
		{StateRunning, StateStopped, false}, // only by stopping
		{StateStopping, StatePausing, false},
		{StateStopping, StateRunning, false},
		{StateStopped, StateRunning, false},
		{StateStopped, StateStopping, false},
		{StateFailed, StateRunning, false},
	} {
		if got := canTransition(tt.from, tt.to); got != tt.ok {
			t.Errorf("canTransition(%s, %s) = %v, want %v", tt.from, tt.to, got, tt.ok)
		}
		r := &record{Sandbox: Sandbox{ID: "x", State: tt.from}}
		err := r.move(tt.to)
		var te *errTransition
		if tt.ok && (err != nil || r.Sandbox.State != tt.to) {
			t.Errorf("move %s → %s: %v, state %s", tt.from, tt.to, err, r.Sandbox.State)
		}
		if !tt.ok && (!errors.As(err, &te) || r.Sandbox.State != tt.from) {
			t.Errorf("move %s → %s: %v, state %s; want refused and unchanged", tt.from, tt.to, err, r.Sandbox.State)
		}
	}
	for s, want := range map[State]bool{StateStarting: true, StateRunning: true, StatePausing: true, StatePaused: false,
		StateResuming: true, StateStopping: true, StateStopped: false, StateFailed: false} {
		if s.holdsSlot() != want {
			t.Errorf("%s.holdsSlot() = %v, want %v", s, !want, want)
		}
	}
}
