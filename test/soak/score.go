package main

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// The soak scores what a user would call a problem. Every failed create
// and every failed request on a running sandbox is a problem unless a
// fault explains it: a fault aimed at that sandbox (or, for daemon-wide
// faults, at every one) was in effect while the request ran, and the error
// is the one that fault causes. No fault causes a 500: that is the daemon
// failing, whatever went on around it. Faults that must not be felt by
// anyone else (a client that goes away mid-exec or mid-upload, slow
// clients) explain nothing.
//
// A sandbox that ends is lost to its user. Only one fault ends a sandbox
// by definition: a kill -9 of its own runtime. A sandbox that ends under
// any other fault (a full data dir while it paused, a kill of cubicled
// while it paused, its desktop killed inside) is a problem: the product
// must leave it running (or paused, when its pause got far enough).

// Fault kinds that explain errors.
const (
	faultDaemonKill  = "kill -9 of cubicled"
	faultRuntimeKill = "kill -9 of a sandbox's runtime"
	faultKillInside  = "agent's processes killed inside the sandbox"
	faultDiskFull    = "data dir full"
	faultPoolEmpty   = "address pool exhausted"
)

// afterRestart is how long after cubicled answers again the requests that
// were cut by its kill may still come back failed (a client's retry, an
// agent connection being dialled again).
const afterRestart = 10 * time.Second

// window is the time a fault was in effect.
type window struct {
	kind   string
	target string    // the sandbox it was aimed at; "" for all
	start  time.Time //
	end    time.Time // zero while in effect
}

// faultLog records the faults' windows. It is safe for concurrent use.
type faultLog struct {
	mu      sync.Mutex
	windows []*window
	// recovery is how long a desktop may take to come back after its
	// processes were killed inside the sandbox.
	recovery time.Duration
}

// begin opens a window of kind aimed at target ("" for all) and returns
// the function that closes it, grace after the call.
func (f *faultLog) begin(kind, target string) (end func(grace time.Duration)) {
	w := &window{kind: kind, target: target, start: time.Now()}
	f.mu.Lock()
	f.windows = append(f.windows, w)
	f.mu.Unlock()
	return func(grace time.Duration) {
		f.mu.Lock()
		w.end = time.Now().Add(grace)
		f.mu.Unlock()
	}
}

// overlapping returns the windows in effect at some time in [t0, t1] that
// apply to sandbox id ("" matches only daemon-wide windows).
func (f *faultLog) overlapping(id string, t0, t1 time.Time) []window {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []window
	for _, w := range f.windows {
		if w.target != "" && w.target != id {
			continue
		}
		end := w.end
		if w.kind == faultRuntimeKill {
			end = time.Time{} // a killed sandbox stays dead
		}
		if w.start.After(t1) || (!end.IsZero() && end.Before(t0)) {
			continue
		}
		out = append(out, *w)
	}
	return out
}

// noAnswer reports an error that is not an answer of cubicled: the
// connection was refused or cut, or the call timed out. An answer without
// an API code (a plain-text 500) or a wrong one (the soak's own checks)
// is not "no answer", and no daemon kill forgives it.
func noAnswer(err error) bool { return harness.NoAnswer(err) }

// status is the HTTP status of an API error, 0 for none.
func status(err error) int {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// daemonDown reports err as what a kill of cubicled causes: no answer
// (the connection refused or cut) while it is down, or 503 unavailable
// while it comes back (an agent's connection being dialled again).
func daemonDown(err error) bool {
	return noAnswer(err) || status(err) == http.StatusServiceUnavailable && client.ErrorCode(err) == "unavailable"
}

// explainCreate says which fault explains a create that failed with err
// after running from t0 to t1, or "" when none does.
func (f *faultLog) explainCreate(t0, t1 time.Time, err error) string {
	for _, w := range f.overlapping("", t0, t1) {
		switch {
		case w.kind == faultDaemonKill && daemonDown(err):
			return w.kind
		case w.kind == faultDiskFull && status(err) == http.StatusServiceUnavailable &&
			client.ErrorCode(err) == "unavailable" && strings.Contains(err.Error(), "data directory is full"):
			return w.kind
		case w.kind == faultPoolEmpty && client.IsCapacityExhausted(err) && strings.Contains(err.Error(), "address"):
			return w.kind
		}
	}
	return ""
}

// sandboxEnded reports err as an answer about a sandbox that has ended
// or is ending under the request: 409 (it stopped while the request ran,
// it is not running), 404, or 503 unavailable (its agent went away).
func sandboxEnded(err error) bool {
	switch status(err) {
	case http.StatusConflict, http.StatusNotFound:
		return true
	case http.StatusServiceUnavailable:
		return client.ErrorCode(err) == "unavailable"
	}
	return false
}

// desktopRestarting reports err as the answer of an agent whose desktop
// is coming back: 503 unavailable (the desktop is restarting, the X
// display is not up).
func desktopRestarting(err error) bool {
	return status(err) == http.StatusServiceUnavailable && client.ErrorCode(err) == "unavailable" &&
		strings.Contains(err.Error(), "restarting")
}

// explainRequest says which fault explains a request on sandbox id that
// failed with err after running from t0 to t1, or "" when none does.
func (f *faultLog) explainRequest(id string, t0, t1 time.Time, err error) string {
	for _, w := range f.overlapping(id, t0, t1) {
		switch {
		case w.kind == faultDaemonKill && daemonDown(err):
			return w.kind
		case w.kind == faultRuntimeKill && w.target == id && sandboxEnded(err):
			// Its runtime was killed: it answers as a sandbox that ended.
			return w.kind
		case w.kind == faultKillInside && w.target == id && desktopRestarting(err):
			// Its desktop was killed: it answers "restarting" until the
			// desktop is back, within the recovery time.
			return w.kind
		}
	}
	return ""
}

// explainPause says which fault explains a pause or resume of sandbox
// id that failed with err after running from t0 to t1, beyond what
// explainRequest explains, or "". A full data dir explains a pause
// refused for want of room (503 "data directory is full"), and one that
// met the disk filling midway and failed ("no space left on device"):
// the sandbox must run on, and if it ended, that is a problem of its
// own (killed does not explain it). A kill of cubicled explains the
// sandbox being found paused, pausing or resuming by the restarted
// daemon.
func (f *faultLog) explainPause(id string, t0, t1 time.Time, err error) string {
	for _, w := range f.overlapping(id, t0, t1) {
		msg := err.Error()
		switch {
		case w.kind == faultDaemonKill && client.IsConflict(err) &&
			(strings.Contains(msg, "is paused, not running") || strings.Contains(msg, "is pausing") || strings.Contains(msg, "is resuming")):
			return w.kind
		case w.kind == faultDiskFull && status(err) == http.StatusServiceUnavailable &&
			(strings.Contains(msg, "data directory is full") || strings.Contains(msg, "no space left on device")):
			return w.kind
		}
	}
	return ""
}

// killed reports whether a kill -9 of sandbox id's own runtime hit it:
// the one fault that explains the sandbox ending.
func (f *faultLog) killed(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.windows {
		if w.kind == faultRuntimeKill && w.target == id {
			return true
		}
	}
	return false
}

// rateProblem is the problem of a loop slower than floor (Hz), or "".
func rateProblem(worker int, actions int, inUse time.Duration, floor float64) string {
	if inUse <= 0 {
		return fmt.Sprintf("loop %d never had a running sandbox", worker)
	}
	if rate := float64(actions) / inUse.Seconds(); rate < floor {
		return fmt.Sprintf("loop %d made %.2f screenshot+click per second while it had a sandbox, below the floor of %.2f Hz", worker, rate, floor)
	}
	return ""
}
