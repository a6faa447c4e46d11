package oci

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// fakeSlowRuntime writes a FAKE wrapper around the real runtime at real: it
// passes every call through, except `state` while the file it returns holds
// "slow" (the call hangs, as a runtime stuck on a lock does) or "fail" (it
// fails with an error that is not "does not exist"). It stands in for what
// cannot be had on demand here: a runtime too loaded to answer.
func fakeSlowRuntime(t *testing.T, real string) (wrapper, mode string) {
	t.Helper()
	dir := t.TempDir()
	wrapper, mode = filepath.Join(dir, "fake-slow-runtime"), filepath.Join(dir, "mode")
	script := fmt.Sprintf(`#!/bin/sh
# FAKE runtime wrapper (a test of internal/driver/oci): the real runtime,
# but "state" hangs or fails while %[1]s says so.
for a in "$@"; do
	if [ "$a" = state ]; then
		case "$(cat %[1]s 2>/dev/null)" in
		slow) exec sleep 3600 ;;
		fail) echo 'fake runtime: state: resource temporarily unavailable' >&2; exit 1 ;;
		esac
	fi
done
exec %[2]s "$@"
`, mode, real)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper, mode
}

func setMode(t *testing.T, path, mode string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(mode), 0o644); err != nil {
		t.Fatal(err)
	}
}

// isDead reports whether b's Wait is closed within d.
func isDead(b driver.Box, d time.Duration) bool {
	select {
	case <-b.Wait():
		return true
	default:
	}
	select {
	case <-b.Wait():
		return true
	case <-time.After(d):
		return false
	}
}

// suffix tells the boxes of the two runtimes apart.
var suffix = map[string]string{"runsc": "g", "runc": "r"}

// uniqueID returns prefix and a part that differs from run to run: runsc
// names a sandbox's control socket after its ID host-wide, so a box left by
// another run (in another state directory) must not share it.
func uniqueID(prefix string) string {
	return fmt.Sprintf("%s%d", prefix, time.Now().UnixNano()%1e6)
}

// TestAdoptSurvivesASlowRuntime: a daemon restarting while the runtime
// fails or hangs on `state` must not take its running boxes for dead (the
// manager would destroy them): the box is adopted, answers, and is watched
// once the runtime answers again; a box the runtime says is gone is dead.
func TestAdoptSurvivesASlowRuntime(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			wrapper, mode := fakeSlowRuntime(t, d.cfg.RuntimePath)
			// The restarted daemon's driver: same state, runtime behind
			// the fake wrapper, short bounds.
			restarted := New(Config{Runtime: rt, RuntimePath: wrapper, StateDir: d.cfg.StateDir, AgentBinary: d.cfg.AgentBinary, DiskMB: d.cfg.DiskMB})
			restarted.adoptProbe, restarted.adoptRetry = 2*time.Second, 200*time.Millisecond

			for _, tt := range []struct {
				mode    string
				maxWait time.Duration // for Adopt to return
			}{
				{"fail", 10 * time.Second},
				{"slow", 15 * time.Second},
			} {
				t.Run(tt.mode, func(t *testing.T) {
					id := uniqueID("tslow" + tt.mode + suffix[rt])
					b, err := d.Create(ctx, driver.Spec{ID: id, Shape: driver.Shape{Image: image}, Session: driver.Session{Token: "tok" + tt.mode}})
					if err != nil {
						t.Fatal(err)
					}
					pid := b.(*box).data.Pid
					b.(*box).stopWatch() // the old daemon is gone
					setMode(t, mode, tt.mode)

					start := time.Now()
					adopted, err := restarted.Adopt(ctx, b.State())
					took := time.Since(start)
					if err != nil {
						t.Fatalf("Adopt with the runtime %s: %v", tt.mode, err)
					}
					t.Logf("Adopt with the runtime %s returned after %v", tt.mode, took.Round(time.Millisecond))
					if took > tt.maxWait {
						t.Errorf("Adopt took %v with the runtime %s, want at most %v", took, tt.mode, tt.maxWait)
					}
					if isDead(adopted, 3*time.Second) {
						t.Fatalf("runtime %s on state: the healthy box was taken for dead", tt.mode)
					}
					if got := get(t, adopted, "/"); got != "ok tok"+tt.mode {
						t.Errorf("adopted box: GET / = %q", got)
					}
					if cs, err := d.state(ctx, id); err != nil || cs.Status != "running" {
						t.Errorf("the real runtime says %+v, %v; want running", cs, err)
					}

					// The runtime answers again: the box is watched, so
					// its death is noticed.
					setMode(t, mode, "")
					time.Sleep(2 * time.Second) // a retry or two
					if isDead(adopted, 0) {
						t.Fatal("box dead once the runtime answered")
					}
					if _, err := d.output(ctx, "kill", id, "KILL"); err != nil {
						t.Fatal(err)
					}
					if !isDead(adopted, 30*time.Second) {
						t.Fatal("Wait not closed 30 s after the container was killed")
					}
					if err := adopted.Stop(ctx); err != nil {
						t.Fatal(err)
					}
					assertGone(t, d, id, pid)
				})
			}

			// While the runtime fails, a box that is gone is not known to
			// be gone; once the runtime says so, it is dead.
			t.Run("gone", func(t *testing.T) {
				id := uniqueID("tslowgone" + suffix[rt])
				b, err := d.Create(ctx, driver.Spec{ID: id, Shape: driver.Shape{Image: image}, Session: driver.Session{Token: "x"}})
				if err != nil {
					t.Fatal(err)
				}
				st := b.State()
				pid := b.(*box).data.Pid
				if err := d.deleteContainer(ctx, id); err != nil {
					t.Fatal(err)
				}
				setMode(t, mode, "fail")
				adopted, err := restarted.Adopt(ctx, st)
				if err != nil {
					t.Fatal(err)
				}
				if isDead(adopted, time.Second) {
					t.Fatal("dead while the runtime could not say")
				}
				setMode(t, mode, "")
				if !isDead(adopted, 10*time.Second) {
					t.Fatal("Wait not closed 10 s after the runtime could say the container does not exist")
				}
				b.(*box).stopWatch()
				if err := adopted.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				assertGone(t, d, id, pid)
			})
		})
	}
}

// TestAdoptStopWhileUnsure: stopping a box whose runtime has not answered
// ends the background asking (no goroutine left behind).
func TestAdoptStopWhileUnsure(t *testing.T) {
	dir := t.TempDir()
	// No runtime binary at all: the call fails before any runtime runs,
	// which says nothing about the box.
	d := New(Config{Runtime: "runc", RuntimePath: filepath.Join(dir, "no-such-runc"), StateDir: dir})
	d.adoptProbe, d.adoptRetry = time.Second, 50*time.Millisecond
	data, _ := json.Marshal(boxData{ID: "tunsure", Runtime: "runc", Pid: 1, Dir: d.boxDir("tunsure")})
	b, err := d.Adopt(context.Background(), driver.State{Version: stateVersion, Driver: "runc", Data: data})
	if err != nil {
		t.Fatal(err)
	}
	if isDead(b, 500*time.Millisecond) {
		t.Fatal(`a runtime that cannot be run ("executable file not found") was taken to say the box is dead`)
	}
	u, ok := b.(*unsureBox)
	if !ok {
		t.Fatalf("Adopt gave a %T, want the box of an unsure adoption", b)
	}
	done := make(chan struct{})
	go func() { u.stopAsking(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stopAsking did not end the asking within 5 s")
	}
	if !isDead(b, 0) {
		t.Error("Wait open after stopAsking")
	}
	// Stop after that frees what is there (nothing: no runtime, no
	// directory) and may be repeated.
	for range 2 {
		if err := b.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}
}

// TestProbeVerdicts: what each answer of the real runtime means.
func TestProbeVerdicts(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, _ := newTestDriver(t, rt)
			if err := os.MkdirAll(d.runtimeRoot(), 0o700); err != nil {
				t.Fatal(err)
			}
			// The runtime runs and says the container does not exist.
			if _, v, err := d.probe(context.Background(), "tnosuchbox"); v != verdictGone {
				t.Errorf("unknown container: verdict %d (%v), want gone", v, err)
			}
			// The runtime is stuck: no answer is not "gone".
			wrapper, mode := fakeSlowRuntime(t, d.cfg.RuntimePath)
			setMode(t, mode, "slow")
			slow := New(Config{Runtime: rt, RuntimePath: wrapper, StateDir: d.cfg.StateDir})
			slow.adoptProbe = time.Second
			start := time.Now()
			_, v, err := slow.probe(context.Background(), "tnosuchbox")
			if v != verdictUnknown {
				t.Errorf("stuck runtime: verdict %d (%v), want unknown", v, err)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("probe of a stuck runtime took %v, want about its 1 s bound", took)
			}
			if !strings.Contains(fmt.Sprint(err), "state") {
				t.Errorf("error %v does not name the call", err)
			}
		})
	}
}
