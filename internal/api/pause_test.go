package api

import (
	"strings"
	"testing"

	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// TestPauseResumeAPI checks the wire side of pause and resume: the
// bodies each takes (none or {} for pause; an optional timeout_seconds
// for resume), what a refused call answers, and the paused state in the
// list filter. The manager's own rules are sandbox's tests'.
func TestPauseResumeAPI(t *testing.T) {
	e := newTestEnv(t, Config{CreateRate: rate.Inf})
	for _, tt := range []struct {
		name, method, path, body string
		status                   int
		code                     string
		state                    sandbox.State // of runningID afterwards
	}{
		{"pause with a member", "POST", "/v1/sandboxes/" + runningID + "/pause", `{"memory":true}`, 400, codeInvalid, sandbox.StateRunning},
		{"pause with a non-object", "POST", "/v1/sandboxes/" + runningID + "/pause", `[]`, 400, codeInvalid, sandbox.StateRunning},
		{"pause of a stopped sandbox", "POST", "/v1/sandboxes/" + stoppedID + "/pause", ``, 409, codeConflict, sandbox.StateRunning},
		{"pause of an unknown sandbox", "POST", "/v1/sandboxes/nope/pause", ``, 404, codeNotFound, sandbox.StateRunning},
		{"resume of a running sandbox", "POST", "/v1/sandboxes/" + runningID + "/resume", ``, 409, codeConflict, sandbox.StateRunning},
		{"pause", "POST", "/v1/sandboxes/" + runningID + "/pause", `{}`, 200, "", sandbox.StatePaused},
		{"resume with a negative timeout", "POST", "/v1/sandboxes/" + runningID + "/resume", `{"timeout_seconds":-5}`, 400, codeInvalid, sandbox.StatePaused},
		{"resume with an unknown member", "POST", "/v1/sandboxes/" + runningID + "/resume", `{"timeout":5}`, 400, codeInvalid, sandbox.StatePaused},
		{"resume", "POST", "/v1/sandboxes/" + runningID + "/resume", `{"timeout_seconds":60}`, 200, "", sandbox.StateRunning},
		{"pause, no body", "POST", "/v1/sandboxes/" + runningID + "/pause", ``, 200, "", sandbox.StatePaused},
		{"resume, no body", "POST", "/v1/sandboxes/" + runningID + "/resume", ``, 200, "", sandbox.StateRunning},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := e.do(tt.method, tt.path, strings.NewReader(tt.body))
			if tt.status == 200 {
				sb := decode[sandbox.Sandbox](t, w, 200)
				if sb.State != tt.state {
					t.Errorf("answered %s, want %s", sb.State, tt.state)
				}
			} else {
				wantError(t, w, tt.status, tt.code)
			}
			e.mgr.mu.Lock()
			got := e.mgr.sandboxes[runningID].State
			e.mgr.mu.Unlock()
			if got != tt.state {
				t.Errorf("sandbox is %s afterwards, want %s", got, tt.state)
			}
		})
	}
	if _, err := e.mgr.Pause(t.Context(), runningID); err != nil {
		t.Fatal(err)
	}
	list := decode[struct{ Sandboxes []sandbox.Sandbox }](t, e.do("GET", "/v1/sandboxes?state=paused", nil), 200)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != runningID {
		t.Errorf("?state=paused lists %+v", list.Sandboxes)
	}
	for _, st := range []string{"pausing", "resuming"} {
		decode[struct{ Sandboxes []sandbox.Sandbox }](t, e.do("GET", "/v1/sandboxes?state="+st, nil), 200)
	}
}

// TestForkAPI checks the wire side of fork: the count it takes (default
// 1, 1..10), what a refused call answers and that it makes nothing.
func TestForkAPI(t *testing.T) {
	e := newTestEnv(t, Config{CreateRate: rate.Inf})
	count := func() int {
		e.mgr.mu.Lock()
		defer e.mgr.mu.Unlock()
		return len(e.mgr.sandboxes)
	}
	before := count()
	for _, tt := range []struct {
		name, path, body string
		status           int
		code             string
		made             int
	}{
		{"count 0", "/v1/sandboxes/" + runningID + "/fork", `{"count":0}`, 400, codeInvalid, 0},
		{"count 11", "/v1/sandboxes/" + runningID + "/fork", `{"count":11}`, 400, codeInvalid, 0},
		{"count a string", "/v1/sandboxes/" + runningID + "/fork", `{"count":"2"}`, 400, codeInvalid, 0},
		{"count fractional", "/v1/sandboxes/" + runningID + "/fork", `{"count":1.5}`, 400, codeInvalid, 0},
		{"unknown member", "/v1/sandboxes/" + runningID + "/fork", `{"copies":2}`, 400, codeInvalid, 0},
		{"not an object", "/v1/sandboxes/" + runningID + "/fork", `[2]`, 400, codeInvalid, 0},
		{"unknown sandbox", "/v1/sandboxes/nope/fork", `{}`, 404, codeNotFound, 0},
		{"stopped sandbox", "/v1/sandboxes/" + stoppedID + "/fork", `{}`, 409, codeConflict, 0},
		{"default count", "/v1/sandboxes/" + runningID + "/fork", ``, 201, "", 1},
		{"three", "/v1/sandboxes/" + runningID + "/fork", `{"count":3}`, 201, "", 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := e.do("POST", tt.path, strings.NewReader(tt.body))
			if tt.status == 201 {
				resp := decode[struct{ Sandboxes []sandbox.Sandbox }](t, w, 201)
				if len(resp.Sandboxes) != tt.made {
					t.Errorf("answered %d forks, want %d", len(resp.Sandboxes), tt.made)
				}
			} else {
				wantError(t, w, tt.status, tt.code)
			}
			if got := count(); got != before+tt.made {
				t.Errorf("%d sandboxes afterwards, want %d", got, before+tt.made)
			}
			before = count()
		})
	}
}

// TestFailedResumeAnswersItsCause: a resume that fails leaves the sandbox
// paused, and its answer is the manager's (503 and why, "it is still
// paused"), not "stopped while the request ran", which a request that met
// a sandbox ending gets: a paused sandbox is where a failed resume leaves
// it. (The soak met it as a resume on a full disk.)
func TestFailedResumeAnswersItsCause(t *testing.T) {
	e := newTestEnv(t, Config{CreateRate: rate.Inf})
	if _, err := e.mgr.Pause(t.Context(), runningID); err != nil {
		t.Fatal(err)
	}
	const why = "resume sandbox " + runningID + ": runsc restore: no space left on device; it is still paused"
	e.mgr.mu.Lock()
	e.mgr.resumeErr = errdefs.New(errdefs.ErrUnavailable, why)
	e.mgr.mu.Unlock()
	got := wantError(t, e.do("POST", "/v1/sandboxes/"+runningID+"/resume", nil), 503, codeUnavailable)
	if got.Message != why {
		t.Errorf("message %q, want %q", got.Message, why)
	}
}
