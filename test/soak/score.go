package main

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// The soak scores what a user would call a problem. Every failed create
// and every failed request on a running sandbox is a problem unless a
// fault explains it: a fault aimed at that sandbox (or, for daemon-wide
// faults, at every one) was in effect while the request ran, and the error
// is what that fault causes. Faults that must not be felt by anyone else
// (a client that goes away mid-exec or mid-upload, slow clients) explain
// nothing.

// Fault kinds that explain errors.
const (
	faultDaemonKill  = "kill -9 of cubicled"
	faultRuntimeKill = "kill -9 of a sandbox's runtime"
	faultKillInside  = "agent's processes killed inside the sandbox"
	faultDiskFull    = "data dir full"
	faultPoolEmpty   = "address pool exhausted"
	// faultLostPausing is no fault of its own: a sandbox whose pause met
	// the full data dir and ended (runsc ends a sandbox whose checkpoint
	// fails; cubicled refuses a pause on a full disk, but the disk can
	// fill while the checkpoint runs).
	faultLostPausing = "data dir full during a pause"
	// faultKillPausing is no fault of its own either: a sandbox that a
	// kill of cubicled cut in its pause and that did not survive (runsc's
	// checkpoint, the daemon's child, died with it and took the sandbox;
	// the crash test allows "gone without a trace").
	faultKillPausing = "kill -9 of cubicled during a pause"
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
		if lostTo(w.kind) {
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
// connection was refused or cut.
func noAnswer(err error) bool { return client.ErrorCode(err) == "" }

// status is the HTTP status of an API error, 0 for none.
func status(err error) int {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// explainCreate says which fault explains a create that failed with err
// after running from t0 to t1, or "" when none does.
func (f *faultLog) explainCreate(t0, t1 time.Time, err error) string {
	for _, w := range f.overlapping("", t0, t1) {
		switch {
		case w.kind == faultDaemonKill && (noAnswer(err) || client.ErrorCode(err) == "unavailable"):
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

// explainRequest says which fault explains a request on sandbox id that
// failed with err after running from t0 to t1, or "" when none does.
func (f *faultLog) explainRequest(id string, t0, t1 time.Time, err error) string {
	for _, w := range f.overlapping(id, t0, t1) {
		switch {
		case w.kind == faultDaemonKill && (noAnswer(err) || client.ErrorCode(err) == "unavailable"):
			return w.kind
		case lostTo(w.kind), w.kind == faultKillInside:
			// Aimed at this sandbox: whatever it answers while it dies
			// or while its desktop comes back.
			return w.kind
		}
	}
	return ""
}

// explainPause says which fault explains a pause or resume of sandbox
// id that failed with err after running from t0 to t1, beyond what
// explainRequest explains, or "". A full data dir explains a pause
// refused for want of room, and one that met the full disk midway; the
// sandbox that ended of the latter is marked lost to it (killed). A kill
// of cubicled explains the sandbox being found paused, pausing or
// resuming by the restarted daemon.
func (f *faultLog) explainPause(id string, t0, t1 time.Time, err error) string {
	for _, w := range f.overlapping(id, t0, t1) {
		msg := err.Error()
		if w.kind == faultDaemonKill && client.IsConflict(err) &&
			(strings.Contains(msg, "is paused, not running") || strings.Contains(msg, "is pausing") || strings.Contains(msg, "is resuming")) {
			return w.kind
		}
		if w.kind != faultDiskFull {
			continue
		}
		switch {
		case status(err) == http.StatusServiceUnavailable && strings.Contains(msg, "data directory is full"):
			return w.kind
		case strings.Contains(msg, "no space left on device"), client.IsConflict(err) && strings.Contains(msg, "stopped while the request ran"):
			f.lose(id, faultLostPausing)
			return faultLostPausing
		}
	}
	return ""
}

// lostTo reports whether a sandbox a window of kind is aimed at is lost
// for good.
func lostTo(kind string) bool {
	return kind == faultRuntimeKill || kind == faultLostPausing || kind == faultKillPausing
}

// lose records sandbox id as lost to kind, a fault's outcome (killed).
func (f *faultLog) lose(id, kind string) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.windows = append(f.windows, &window{kind: kind, target: id, start: now, end: now})
}

// killed reports whether a fault killed sandbox id's runtime.
func (f *faultLog) killed(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.windows {
		if lostTo(w.kind) && w.target == id {
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
