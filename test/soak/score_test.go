package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// apiErr is an answer of cubicled as the SDK returns it.
func apiErr(status int, code, msg string) error {
	return &client.APIError{Status: status, Code: code, Message: msg}
}

var (
	errNoAnswer   = fmt.Errorf("post: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	errDiskFull   = apiErr(503, "unavailable", "cubicled's data directory is full; no sandbox can be made until space is freed")
	errNoAddress  = apiErr(503, "capacity_exhausted", "create sandbox: no free address in 10.89.77.0/28")
	errStartFail  = apiErr(503, "unavailable", "create sandbox: desktop not ready in time")
	errInternal   = apiErr(500, "internal", "internal error")
	errRestarting = apiErr(503, "unavailable", "the desktop is restarting")
	errAgentGone  = apiErr(503, "unavailable", "the sandbox's agent went away during the request; retry")
	errEnded      = apiErr(409, "conflict", "sandbox killed stopped while the request ran (it is stopped)")
	errTimeout    = apiErr(504, "timeout", "the sandbox did not answer in time")
)

func TestExplain(t *testing.T) {
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	// One fault of each kind, each at its own time: [start, end) in
	// seconds from t0; the runtime kill never ends.
	f := &faultLog{recovery: time.Minute}
	for _, w := range []window{
		{kind: faultDaemonKill, start: at(100), end: at(110)},
		{kind: faultDiskFull, start: at(200), end: at(205)},
		{kind: faultPoolEmpty, start: at(300), end: at(320)},
		{kind: faultKillInside, target: "inside", start: at(400), end: at(460)},
		{kind: faultRuntimeKill, target: "killed", start: at(500)},
		{kind: "client gone mid-exec", target: "victim", start: at(600), end: at(601)},
	} {
		f.windows = append(f.windows, &w)
	}
	tests := []struct {
		name   string
		create bool   // a create (else a request on sandbox id)
		id     string // the request's sandbox
		from   int    // seconds from t0, the request's start and end
		to     int
		err    error
		want   string // the fault that explains it; "" a problem
	}{
		{"create, no fault", true, "", 10, 15, errStartFail, ""},
		{"create without an answer, no fault", true, "", 10, 15, errNoAnswer, ""},
		{"create cut by the daemon's kill", true, "", 95, 101, errNoAnswer, faultDaemonKill},
		{"create while the daemon restarts", true, "", 105, 106, errNoAnswer, faultDaemonKill},
		{"create failing as the daemon comes back", true, "", 109, 112, errRestarting, faultDaemonKill},
		{"create failing inside, while the daemon restarts", true, "", 105, 106, errInternal, ""},
		{"create on a full disk", true, "", 199, 203, errDiskFull, faultDiskFull},
		{"create failing otherwise on a full disk", true, "", 199, 203, errStartFail, ""},
		{"create saying the disk is full, when it is not", true, "", 250, 251, errDiskFull, ""},
		{"create on an empty pool", true, "", 310, 312, errNoAddress, faultPoolEmpty},
		{"create on an empty pool, failing otherwise", true, "", 310, 312, errInternal, ""},
		{"create without an address, pool not emptied", true, "", 330, 331, errNoAddress, ""},
		{"create during a sandbox's fault", true, "", 410, 420, errStartFail, ""},
		{"request, no fault", false, "any", 10, 11, errInternal, ""},
		{"request without an answer, no fault", false, "any", 10, 11, errNoAnswer, ""},
		{"request cut by the daemon's kill", false, "any", 99, 100, errNoAnswer, faultDaemonKill},
		{"request failing inside, while the daemon restarts", false, "any", 105, 106, errInternal, ""},
		{"request on a full disk", false, "any", 201, 202, errInternal, ""},
		{"request on its desktop being killed", false, "inside", 430, 431, errRestarting, faultKillInside},
		{"request on its desktop, after the recovery time", false, "inside", 470, 471, errRestarting, ""},
		{"request on another sandbox while one's desktop is killed", false, "other", 430, 431, errRestarting, ""},
		{"request on a killed sandbox, ended", false, "killed", 900, 901, errEnded, faultRuntimeKill},
		{"request on a killed sandbox, its agent gone", false, "killed", 500, 501, errAgentGone, faultRuntimeKill},
		{"request on a sandbox before its kill", false, "killed", 490, 491, errEnded, ""},
		// A fault forgives the errors it causes, never a 500: that is
		// the daemon failing, whatever the sandbox went through.
		{"a 500 on a killed sandbox", false, "killed", 900, 901, errInternal, ""},
		{"a 500 on a sandbox whose desktop is killed", false, "inside", 430, 431, errInternal, ""},
		{"a timeout on a sandbox whose desktop is killed", false, "inside", 430, 431, errTimeout, ""},
		{"no answer on a sandbox whose desktop is killed", false, "inside", 430, 431, errNoAnswer, ""},
		{"a 500 while the daemon restarts", false, "any", 105, 106, apiErr(500, "internal", "internal error"), ""},
		{"a 500 just after the daemon came back", false, "any", 111, 112, errInternal, ""},
		// A wrong answer or one without an API code is an answer:
		// a daemon's kill forgives only its absence.
		{"a 500 without a code while the daemon restarts", false, "any", 105, 106, &client.APIError{Status: 500}, ""},
		{"a wrong answer while the daemon restarts", false, "any", 105, 106, errors.New("screenshot is not a PNG"), ""},
		{"a create with a wrong answer while the daemon restarts", true, "", 105, 106, errors.New("create: sandbox is starting, want running"), ""},
		// A desktop being killed explains its "restarting", no other 503.
		{"its agent gone on a sandbox whose desktop is killed", false, "inside", 430, 431, errAgentGone, ""},
		{"request on the sandbox of a client gone mid-exec", false, "victim", 600, 601, errInternal, ""},
	}
	// Only the kill of its own runtime explains a sandbox's end.
	for id, want := range map[string]bool{"killed": true, "inside": false, "victim": false, "any": false} {
		if got := f.killed(id); got != want {
			t.Errorf("killed(%s) = %v, want %v", id, got, want)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got string
			if tt.create {
				got = f.explainCreate(at(tt.from), at(tt.to), tt.err)
			} else {
				got = f.explainRequest(tt.id, at(tt.from), at(tt.to), tt.err)
			}
			if got != tt.want {
				t.Errorf("explained by %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRateProblem(t *testing.T) {
	tests := []struct {
		actions int
		inUse   time.Duration
		floor   float64
		problem string // in the problem; "" none
	}{
		{120, time.Minute, 1, ""},
		{60, time.Minute, 1, ""},
		{59, time.Minute, 1, "0.98 screenshot+click per second"},
		{600, 10 * time.Minute, 1.5, "1.00 screenshot+click per second while it had a sandbox, below the floor of 1.50 Hz"},
		{0, 0, 1, "never had a running sandbox"},
	}
	for _, tt := range tests {
		got := rateProblem(3, tt.actions, tt.inUse, tt.floor)
		if tt.problem == "" && got != "" || tt.problem != "" && !strings.Contains(got, tt.problem) {
			t.Errorf("%d actions in %v, floor %.2f Hz: problem %q, want %q", tt.actions, tt.inUse, tt.floor, got, tt.problem)
		}
	}
}

// TestExplainPause: a full data dir explains a pause refused for want of
// room, and one that met the disk filling midway and failed (the sandbox
// runs on); it never explains the sandbox ending: only a kill -9 of its
// own runtime may end a sandbox, so one that a full disk (or anything
// else) ended is a problem, and so is every later error on it. Outside
// the window, or failing otherwise, nothing explains a pause's error.
func TestExplainPause(t *testing.T) {
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	f := &faultLog{}
	f.windows = append(f.windows, &window{kind: faultDiskFull, start: at(200), end: at(210)},
		&window{kind: faultDaemonKill, start: at(400), end: at(410)})
	foundPaused := apiErr(409, "conflict", "sandbox x is paused, not running")
	noRoom := apiErr(503, "unavailable", "cubicled's data directory is full: 3 MiB free, and pausing sandbox x may take 256 MiB; it runs on")
	ended := apiErr(409, "conflict", "sandbox x stopped while the request ran (it is stopping)")
	failed := apiErr(503, "unavailable", "pause sandbox x: runsc checkpoint: write urpc: no space left on device")
	for _, tt := range []struct {
		name     string
		id       string
		from, to int
		err      error
		want     string
		lost     bool // killed(id): a loss of the sandbox is explained
	}{
		{"refused on a full disk", "a", 199, 201, noRoom, faultDiskFull, false},
		{"refused for room, the disk not full", "b", 250, 251, noRoom, "", false},
		{"ended by the disk filling midway", "c", 205, 209, ended, "", false},
		{"failed for the disk filling midway", "d", 209, 212, failed, faultDiskFull, false},
		{"ended with no full disk", "e", 300, 301, ended, "", false},
		{"failed otherwise on a full disk", "f", 201, 202, errInternal, "", false},
		{"found paused after a kill of cubicled", "g", 405, 406, foundPaused, faultDaemonKill, false},
		{"found paused, no kill", "h", 500, 501, foundPaused, "", false},
		{"ended after a kill of cubicled", "i", 405, 406, ended, "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := f.explainPause(tt.id, at(tt.from), at(tt.to), tt.err); got != tt.want {
				t.Errorf("explainPause = %q, want %q", got, tt.want)
			}
			if got := f.killed(tt.id); got != tt.lost {
				t.Errorf("killed(%s) = %v, want %v", tt.id, got, tt.lost)
			}
		})
	}
	// The sandbox the full disk ended stays a problem: what it answers
	// afterwards is no fault's.
	t.Run("request on the sandbox a full disk ended, later", func(t *testing.T) {
		if got := f.explainRequest("c", at(300), at(301), ended); got != "" {
			t.Errorf("explainRequest = %q, want none", got)
		}
	})
}
