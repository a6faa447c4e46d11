package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// wrongAnswer is a step's call that was answered, but not with what was
// asked: a screenshot that does not decode, a command's wrong output.
// It is never retried away: a wrong answer is a failure.
type wrongAnswer struct{ msg string }

func (e *wrongAnswer) Error() string { return e.msg }

func wrongf(format string, args ...any) error {
	return &wrongAnswer{msg: fmt.Sprintf(format, args...)}
}

// agentStep is one step of an agent loop: look (a screenshot that
// decodes whole, of the desktop's size), act (a click) and check (a
// command whose output is the step's number and where the click put the
// pointer, so that it ran in that very sandbox after that very click).
// A call that got no good answer returns its error; a call answered with
// the wrong thing returns a *wrongAnswer.
func agentStep(ctx context.Context, c *client.Client, id string, step int) error {
	shot, err := c.Screenshot(ctx, id, client.ScreenshotOptions{Format: "png"})
	if err != nil {
		return fmt.Errorf("screenshot: %w", err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		return wrongf("screenshot of %d bytes does not decode: %v", len(shot), err)
	}
	if b := img.Bounds(); b.Dx() != 1024 || b.Dy() != 768 {
		return wrongf("screenshot is %dx%d, want 1024x768", b.Dx(), b.Dy())
	}
	x, y := 100+step%200, 300
	if _, err := c.Actions(ctx, id, client.ClickAt(x, y)); err != nil {
		return fmt.Errorf("click: %w", err)
	}
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: fmt.Sprintf("echo step %d; xdotool getmouselocation --shell | head -2 | tr '\\n' ' '", step)})
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if want := fmt.Sprintf("step %d\nX=%d Y=%d ", step, x, y); res.ExitCode != 0 || res.Stdout != want {
		return wrongf("exec exited %d printing %q (stderr %q), want 0 and %q", res.ExitCode, res.Stdout, res.Stderr, want)
	}
	return nil
}

// stepVerdict is what one step's outcome means for the rolling upgrade.
type stepVerdict int

const (
	stepDone    stepVerdict = iota
	stepRetried             // a retryable error while a node restarted: the loop tries the same step on the next node
	stepFailed              // a wrong answer, or an error no restart explains
)

// judgeStep says what err, a step's outcome, means; duringRestart is
// whether the step overlapped a node's restart. Only a call that got no
// answer (refused, cut, timed out), a 502/503/504 (the answering node
// could not reach the sandbox's, the SDK's own retryable statuses), or a
// 409 saying the sandbox is lost (its node's lease ran out while it was
// down) is retryable, and only during a restart. A wrong answer, or any
// other error, fails the test.
func judgeStep(err error, duringRestart bool) stepVerdict {
	if err == nil {
		return stepDone
	}
	var wa *wrongAnswer
	if errors.As(err, &wa) || !duringRestart {
		return stepFailed
	}
	if harness.NoAnswer(err) {
		return stepRetried // no answer from the node
	}
	var ae *client.APIError
	if !errors.As(err, &ae) {
		return stepFailed // an answer that did not decode
	}
	switch ae.Status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return stepRetried
	case http.StatusConflict:
		if strings.Contains(ae.Message, " is lost: ") {
			return stepRetried
		}
	}
	return stepFailed
}

// restartWindows are the spans during which a node was restarting, each
// from just before its stop to a grace after the others saw it back.
type restartWindows struct {
	mu    sync.Mutex
	spans [][2]time.Time // [from, to]; a zero to: still under way
}

func (w *restartWindows) begin() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.spans = append(w.spans, [2]time.Time{time.Now()})
	return len(w.spans) - 1
}

func (w *restartWindows) end(i int, grace time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.spans[i][1] = time.Now().Add(grace)
}

// overlaps reports whether [from, to] met a restart.
func (w *restartWindows) overlaps(from, to time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.spans {
		if !s[0].After(to) && (s[1].IsZero() || !from.After(s[1])) {
			return true
		}
	}
	return false
}

// TestClusterAgentStepVerdicts checks, against a fake node, that the
// rolling upgrade's step fails on a wrong answer even while a node
// restarts (the old loop counted a wrong exec output as a failed step
// retried on another node, and passed), and retries only what a restart
// explains.
func TestClusterAgentStepVerdicts(t *testing.T) {
	var (
		mode   string // what the fake answers wrong
		mu     sync.Mutex
		clickX int
	)
	var shot bytes.Buffer
	if err := png.Encode(&shot, image.NewGray(image.Rect(0, 0, 1024, 768))); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fail := func(status int, code, msg string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
		}
		switch {
		case mode == "502":
			fail(http.StatusBadGateway, "unavailable", "node b, which holds this sandbox, did not answer; retry")
		case mode == "lost":
			fail(http.StatusConflict, "conflict", "sandbox s is lost: node b, which holds this sandbox, has not renewed its cluster membership within 4s; the sandbox is lost until the node is back")
		case mode == "not-running":
			fail(http.StatusConflict, "conflict", "sandbox s is not running")
		case mode == "404":
			fail(http.StatusNotFound, "not_found", "sandbox s not found")
		case strings.HasSuffix(r.URL.Path, "/screenshot"):
			w.Header().Set("Content-Type", "image/png")
			b := shot.Bytes()
			if mode == "truncated-png" {
				b = b[:len(b)/2]
			}
			w.Write(b)
		case strings.HasSuffix(r.URL.Path, "/actions"):
			var body struct {
				Actions []struct{ X int } `json:"actions"`
			}
			json.NewDecoder(r.Body).Decode(&body)
			if mode != "click-lost" && len(body.Actions) == 1 {
				clickX = body.Actions[0].X
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"results":[{"type":"click"}]}`))
		case strings.HasSuffix(r.URL.Path, "/exec"):
			var req client.ExecRequest
			json.NewDecoder(r.Body).Decode(&req)
			var step int
			fmt.Sscanf(req.Command, "echo step %d;", &step)
			if mode == "wrong-output" {
				step++ // another step's answer
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(client.ExecResult{Stdout: fmt.Sprintf("step %d\nX=%d Y=300 ", step, clickX)})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // a node that is down: connection refused

	for _, tc := range []struct {
		mode, url              string
		during, outside, wrong bool // want retried during a restart, retried outside one, a wrong answer
	}{
		{mode: "ok"},
		{mode: "wrong-output", wrong: true},
		{mode: "truncated-png", wrong: true},
		{mode: "click-lost", wrong: true},
		{mode: "502", during: true},
		{mode: "lost", during: true},
		{mode: "down", url: closed.URL, during: true},
		{mode: "not-running"},
		{mode: "404"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			mu.Lock()
			mode, clickX = tc.mode, 0
			mu.Unlock()
			u := srv.URL
			if tc.url != "" {
				u = tc.url
			}
			c := client.New(u, client.WithAPIKey("k"), client.WithRetry(0, 0), client.WithTimeout(5*time.Second))
			err := agentStep(context.Background(), c, "s", 7)
			var wa *wrongAnswer
			if got := errors.As(err, &wa); got != tc.wrong {
				t.Errorf("step: %v; a wrong answer: %v, want %v", err, got, tc.wrong)
			}
			want := func(retried bool) stepVerdict {
				switch {
				case tc.mode == "ok":
					return stepDone
				case retried:
					return stepRetried
				}
				return stepFailed
			}
			if got := judgeStep(err, true); got != want(tc.during) {
				t.Errorf("during a restart, %v is judged %d, want %d", err, got, want(tc.during))
			}
			if got := judgeStep(err, false); got != want(tc.outside) {
				t.Errorf("outside a restart, %v is judged %d, want %d", err, got, want(tc.outside))
			}
		})
	}

	var w restartWindows
	t0 := time.Now()
	i := w.begin()
	if !w.overlaps(t0.Add(-time.Second), t0.Add(time.Millisecond)) {
		t.Error("a step ending inside an open restart does not overlap it")
	}
	w.end(i, time.Second)
	if !w.overlaps(time.Now().Add(500*time.Millisecond), time.Now().Add(2*time.Second)) {
		t.Error("a step starting in the grace does not overlap the restart")
	}
	if w.overlaps(time.Now().Add(2*time.Second), time.Now().Add(3*time.Second)) || w.overlaps(t0.Add(-3*time.Second), t0.Add(-time.Second)) {
		t.Error("a step before or after a restart overlaps it")
	}
}
