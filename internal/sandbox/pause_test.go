package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// pausingDriver is the fake driver with pause: a paused box is an entry
// in saved (its "files"), and no live box.
type pausingDriver struct {
	*fakeDriver
	pmu        sync.Mutex
	saved      map[string]bool
	pauseErr   error         // Pause fails with this (the box runs on)
	resumeErr  error         // Resume fails with this
	pauseGate  chan struct{} // when set, Pause waits for it to close
	discarded  []string
	cannotHere error // CanPause answers this
}

func newPausingDriver(t *testing.T) *pausingDriver {
	return &pausingDriver{fakeDriver: newFakeDriver(t), saved: map[string]bool{}}
}

func (d *pausingDriver) CanPause(context.Context) error { return d.cannotHere }

func (d *pausingDriver) Pause(ctx context.Context, b driver.Box) (driver.Paused, error) {
	fb := b.(*fakeBox)
	if d.pauseGate != nil {
		<-d.pauseGate
	}
	if d.pauseErr != nil {
		return driver.Paused{}, d.pauseErr
	}
	if err := fb.Stop(ctx); err != nil {
		return driver.Paused{}, err
	}
	// As a real backend's: the box has ended a moment before Pause
	// returns (its watcher must not take it for dead).
	time.Sleep(20 * time.Millisecond)
	d.pmu.Lock()
	d.saved[fb.id] = true
	d.pmu.Unlock()
	data, _ := json.Marshal(fb.id)
	return driver.Paused{State: driver.State{Version: 1, Driver: "gvisor", Data: data}, Bytes: 4096}, nil
}

func (d *pausingDriver) Resume(ctx context.Context, p driver.Paused) (driver.Box, error) {
	var id string
	if err := json.Unmarshal(p.State.Data, &id); err != nil {
		return nil, err
	}
	if d.resumeErr != nil {
		return nil, d.resumeErr
	}
	d.pmu.Lock()
	ok := d.saved[id]
	d.pmu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no saved box %s", id)
	}
	b, err := d.fakeDriver.Create(ctx, driver.Spec{ID: id})
	if err != nil {
		return nil, err
	}
	d.pmu.Lock()
	delete(d.saved, id)
	d.pmu.Unlock()
	return b, nil
}

func (d *pausingDriver) Discard(ctx context.Context, p driver.Paused) error {
	var id string
	if err := json.Unmarshal(p.State.Data, &id); err != nil {
		return err
	}
	d.pmu.Lock()
	defer d.pmu.Unlock()
	delete(d.saved, id)
	d.discarded = append(d.discarded, id)
	return nil
}

func (d *pausingDriver) Settle(ctx context.Context, st driver.State) (driver.Box, *driver.Paused, error) {
	var id string
	if err := json.Unmarshal(st.Data, &id); err != nil {
		return nil, nil, err
	}
	d.pmu.Lock()
	saved := d.saved[id]
	d.pmu.Unlock()
	if saved {
		return nil, &driver.Paused{State: st, Bytes: 8192}, nil
	}
	b, err := d.Adopt(ctx, st)
	if err != nil {
		return nil, nil, nil // gone
	}
	return b, nil, nil
}

func (d *pausingDriver) savedCount() int {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	return len(d.saved)
}

func newPauseManager(t *testing.T, d *pausingDriver, dataDir string, clock Clock) *Manager {
	t.Helper()
	m, err := New(context.Background(), Config{
		DataDir:        dataDir,
		Drivers:        map[string]driver.Driver{"gvisor": d},
		DefaultBackend: "auto",
		Images:         func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes:   2,
		IdleTimeout:    time.Minute,
		MaxLifetime:    time.Hour,
		ReapInterval:   time.Hour,
		Clock:          clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPauseResume follows one sandbox through pause and resume: a
// paused one holds no box and no slot, is not reachable, keeps its
// files, expires by the paused lifetime only, and gets the running time
// it had left back when it resumes.
func TestPauseResume(t *testing.T) {
	d := newPausingDriver(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &fakeClock{now: t0}
	m := newPauseManager(t, d, t.TempDir(), clock)
	defer m.Close()
	ctx := context.Background()
	a, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(10 * time.Minute)
	p, err := m.Pause(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != StatePaused || p.PausedBytes != 4096 || !p.PausedAt.Equal(clock.Now()) || !p.ExpiresAt.Equal(clock.Now().Add(DefaultPausedLifetime)) {
		t.Errorf("paused sandbox: %+v", p)
	}
	if d.live() != 0 || d.savedCount() != 1 {
		t.Errorf("paused: %d live boxes, %d saved; want 0 and 1", d.live(), d.savedCount())
	}
	if _, err := m.Agent(ctx, a.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("agent of a paused sandbox: %v, want a conflict", err)
	}
	// No slot: two more fit in a daemon of two.
	b, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatalf("create beside a paused sandbox: %v", err)
	}
	if _, err := m.Create(ctx, CreateRequest{}, true); err != nil {
		t.Fatalf("second create beside a paused sandbox: %v", err)
	}
	// Resuming needs a slot.
	if _, err := m.Resume(ctx, a.ID, 0); !errors.Is(err, errdefs.ErrCapacity) {
		t.Errorf("resume with no slot free: %v, want ErrCapacity", err)
	}
	if got, _ := m.Get(ctx, a.ID); got.State != StatePaused || d.savedCount() != 1 {
		t.Errorf("a refused resume changed the sandbox: %s, %d saved", got.State, d.savedCount())
	}
	if err := m.Destroy(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	// A day paused: neither idle nor the running lifetime count.
	clock.Advance(24 * time.Hour)
	m.Reap()
	if got, _ := m.Get(ctx, a.ID); got.State != StatePaused {
		t.Fatalf("a paused sandbox was reaped: %s", got.State)
	}
	r, err := m.Resume(ctx, a.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := clock.Now().Add(50 * time.Minute); r.State != StateRunning || !r.ExpiresAt.Equal(want) || r.PausedBytes != 0 || !r.PausedAt.IsZero() {
		t.Errorf("resumed: %+v, want running until %v (the 50 min it had left)", r, want)
	}
	if _, err := m.Agent(ctx, a.ID); err != nil {
		t.Errorf("agent after resume: %v", err)
	}
	// The resumed box is watched like any: its death is reaped.
	d.mu.Lock()
	box := d.boxes[a.ID]
	d.mu.Unlock()
	box.crash()
	waitState(t, m, a.ID, StateStopped)

	// A timeout given to resume wins.
	c, _ := m.Create(ctx, CreateRequest{}, true)
	if _, err := m.Pause(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := m.Resume(ctx, c.ID, 120); err != nil || !r.ExpiresAt.Equal(clock.Now().Add(2*time.Minute)) {
		t.Errorf("resume with a timeout: %+v %v", r, err)
	}
}

// TestPauseRefused checks that what cannot be paused or resumed is
// refused with the right error and changes nothing.
func TestPauseRefused(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Now()}
	t.Run("no pause in the backend", func(t *testing.T) {
		m := newTestManager(t, newFakeDriver(t), t.TempDir(), clock)
		defer m.Close()
		a, _ := m.Create(ctx, CreateRequest{}, true)
		if _, err := m.Pause(ctx, a.ID); !errors.Is(err, errdefs.ErrNotSupported) {
			t.Errorf("pause: %v, want ErrNotSupported", err)
		}
		if _, err := m.Create(ctx, CreateRequest{AutoPause: true}, true); !errors.Is(err, errdefs.ErrNotSupported) {
			t.Errorf("create with auto_pause: %v, want ErrNotSupported", err)
		}
		if got, _ := m.Get(ctx, a.ID); got.State != StateRunning {
			t.Errorf("state %s", got.State)
		}
	})
	d := newPausingDriver(t)
	m := newPauseManager(t, d, t.TempDir(), clock)
	defer m.Close()
	t.Run("not on this host", func(t *testing.T) {
		d.cannotHere = errors.New("runsc cannot checkpoint a host socket")
		defer func() { d.cannotHere = nil }()
		a, _ := m.Create(ctx, CreateRequest{}, true)
		defer m.Destroy(ctx, a.ID)
		_, err := m.Pause(ctx, a.ID)
		if !errors.Is(err, errdefs.ErrNotSupported) || !strings.Contains(err.Error(), "host socket") {
			t.Errorf("pause: %v, want ErrNotSupported with the reason", err)
		}
		for _, b := range m.Backends(ctx) {
			if b.Capabilities.Pause || !strings.Contains(b.Capabilities.PauseReason, "host socket") {
				t.Errorf("backend info %+v: want pause false with the reason", b)
			}
		}
	})
	t.Run("data directory full", func(t *testing.T) {
		a, _ := m.Create(ctx, CreateRequest{}, true)
		defer m.Destroy(ctx, a.ID)
		saved := d.savedCount()
		m.freeBytes = func(string) (int64, error) { return 200 << 20, nil } // under gvisor's 256 MiB
		defer func() { m.freeBytes = freeSpace }()
		_, err := m.Pause(ctx, a.ID)
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "data directory is full: 200 MiB free") {
			t.Errorf("pause on a full data directory: %v, want unavailable saying so", err)
		}
		if got, _ := m.Get(ctx, a.ID); got.State != StateRunning || d.savedCount() != saved {
			t.Errorf("the refused pause left the sandbox %s, %d saved (want running, %d)", got.State, d.savedCount(), saved)
		}
		if _, err := m.Agent(ctx, a.ID); err != nil {
			t.Errorf("the sandbox after a refused pause: %v", err)
		}
	})
	t.Run("resume on a full data directory", func(t *testing.T) {
		a, _ := m.Create(ctx, CreateRequest{}, true)
		defer m.Destroy(ctx, a.ID)
		if _, err := m.Pause(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		m.freeBytes = func(string) (int64, error) { return 10 << 20, nil }
		_, err := m.Resume(ctx, a.ID, 0)
		m.freeBytes = freeSpace
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "data directory is full: 10 MiB free") || !strings.Contains(err.Error(), "it stays paused") {
			t.Errorf("resume on a full data directory: %v, want unavailable saying so", err)
		}
		if got, _ := m.Get(ctx, a.ID); got.State != StatePaused {
			t.Errorf("the refused resume left the sandbox %s, want paused", got.State)
		}
		if _, err := m.Resume(ctx, a.ID, 0); err != nil {
			t.Errorf("resume with room, after the refused one: %v", err)
		}
	})
	a, _ := m.Create(ctx, CreateRequest{}, true)
	tests := []struct {
		name string
		do   func() error
		want error
	}{
		{"resume running", func() error { _, err := m.Resume(ctx, a.ID, 0); return err }, errdefs.ErrConflict},
		{"pause unknown", func() error { _, err := m.Pause(ctx, "nope"); return err }, errdefs.ErrNotFound},
		{"resume unknown", func() error { _, err := m.Resume(ctx, "nope", 0); return err }, errdefs.ErrNotFound},
		{"resume with a negative timeout", func() error { _, err := m.Resume(ctx, a.ID, -1); return err }, errdefs.ErrInvalid},
		{"pause, then pause again", func() error {
			if _, err := m.Pause(ctx, a.ID); err != nil {
				return err
			}
			_, err := m.Pause(ctx, a.ID)
			return err
		}, errdefs.ErrConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := m.Get(ctx, a.ID)
			saved := d.savedCount()
			if err := tt.do(); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			after, _ := m.Get(ctx, a.ID)
			if tt.name != "pause, then pause again" && (after.State != before.State || d.savedCount() != saved) {
				t.Errorf("refused call changed the sandbox: %s → %s, %d → %d saved", before.State, after.State, saved, d.savedCount())
			}
		})
	}
	if got, _ := m.Get(ctx, a.ID); got.State != StatePaused {
		t.Fatalf("state %s, want paused", got.State)
	}
	t.Run("stopped", func(t *testing.T) {
		if err := m.Destroy(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Resume(ctx, a.ID, 0); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("resume of a destroyed sandbox: %v", err)
		}
		if _, err := m.Pause(ctx, a.ID); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("pause of a destroyed sandbox: %v", err)
		}
	})
}

// TestPauseFailures checks the exits of a failed pause (the box runs
// on), a failed resume (the sandbox stays paused) and a resume that
// lost the saved state (the sandbox is destroyed, nothing left).
func TestPauseFailures(t *testing.T) {
	ctx := context.Background()
	d := newPausingDriver(t)
	m := newPauseManager(t, d, t.TempDir(), &fakeClock{now: time.Now()})
	defer m.Close()
	a, _ := m.Create(ctx, CreateRequest{}, true)
	d.pauseErr = errors.New("disk full")
	if _, err := m.Pause(ctx, a.ID); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("failed pause: %v", err)
	}
	if got, _ := m.Get(ctx, a.ID); got.State != StateRunning {
		t.Errorf("after a failed pause: %s, want running", got.State)
	}
	if _, err := m.Agent(ctx, a.ID); err != nil {
		t.Errorf("agent after a failed pause: %v", err)
	}
	d.pauseErr = nil
	if _, err := m.Pause(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	d.resumeErr = errors.New("qemu exited while loading the saved memory")
	if _, err := m.Resume(ctx, a.ID, 0); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "still paused") {
		t.Errorf("failed resume: %v", err)
	}
	if got, _ := m.Get(ctx, a.ID); got.State != StatePaused || d.savedCount() != 1 {
		t.Errorf("after a failed resume: %s, %d saved; want paused, 1", got.State, d.savedCount())
	}
	d.resumeErr = fmt.Errorf("agent silent: %w", driver.ErrResumeLost)
	if _, err := m.Resume(ctx, a.ID, 0); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Errorf("lost resume: %v", err)
	}
	if got, _ := m.Get(ctx, a.ID); got.State != StateStopped || !strings.Contains(got.Error, "resume") || d.savedCount() != 0 {
		t.Errorf("after a lost resume: %+v, %d saved; want stopped with the reason, nothing saved", got, d.savedCount())
	}
}

// TestDestroyWhilePausing checks that a destroy during a pause waits for
// it and frees what it made: no saved box is left.
func TestDestroyWhilePausing(t *testing.T) {
	ctx := context.Background()
	d := newPausingDriver(t)
	m := newPauseManager(t, d, t.TempDir(), &fakeClock{now: time.Now()})
	defer m.Close()
	a, _ := m.Create(ctx, CreateRequest{}, true)
	d.pauseGate = make(chan struct{})
	paused := make(chan error, 1)
	go func() { _, err := m.Pause(ctx, a.ID); paused <- err }()
	waitState(t, m, a.ID, StatePausing)
	destroyed := make(chan error, 1)
	go func() { destroyed <- m.Destroy(ctx, a.ID) }()
	time.Sleep(50 * time.Millisecond)
	close(d.pauseGate)
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
	if err := <-paused; !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("pause cut by a destroy: %v, want a conflict", err)
	}
	if got, _ := m.Get(ctx, a.ID); got.State != StateStopped || d.savedCount() != 0 || d.live() != 0 {
		t.Errorf("after destroy during pause: %s, %d saved, %d live", got.State, d.savedCount(), d.live())
	}
}

// TestPausedReaping checks the lifetimes: a paused sandbox is never idle,
// is destroyed (its saved box discarded) at the paused lifetime, and an
// auto_pause sandbox pauses at its own timeout instead of dying, and
// gets a whole lifetime again when it resumes.
func TestPausedReaping(t *testing.T) {
	ctx := context.Background()
	d := newPausingDriver(t)
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m := newPauseManager(t, d, t.TempDir(), clock)
	defer m.Close()
	a, _ := m.Create(ctx, CreateRequest{}, true)
	if _, err := m.Pause(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	auto, err := m.Create(ctx, CreateRequest{AutoPause: true}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !auto.AutoPause {
		t.Error("the sandbox does not show auto_pause")
	}
	clock.Advance(2 * time.Minute) // past the idle timeout
	m.Reap()
	waitState(t, m, auto.ID, StatePaused)
	clock.Advance(DefaultPausedLifetime - 3*time.Minute)
	m.Reap()
	if got, _ := m.Get(ctx, a.ID); got.State != StatePaused {
		t.Fatalf("paused sandbox reaped before its paused lifetime: %s", got.State)
	}
	r, err := m.Resume(ctx, auto.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := clock.Now().Add(58 * time.Minute); !r.ExpiresAt.Equal(want) {
		t.Errorf("auto-paused sandbox resumed until %v, want %v (what it had left)", r.ExpiresAt, want)
	}
	clock.Advance(time.Hour + time.Minute) // a past its paused lifetime, auto past its lifetime
	m.Reap()
	waitState(t, m, a.ID, StateStopped)
	waitState(t, m, auto.ID, StatePaused)
	d.pmu.Lock()
	discarded := append([]string(nil), d.discarded...)
	d.pmu.Unlock()
	if len(discarded) != 1 || discarded[0] != a.ID {
		t.Errorf("discarded %v, want [%s]", discarded, a.ID)
	}
	if r, err := m.Resume(ctx, auto.ID, 0); err != nil || !r.ExpiresAt.Equal(clock.Now().Add(time.Hour)) {
		t.Errorf("auto-paused at its lifetime, resumed: %+v %v; want a whole hour again", r, err)
	}
}

// TestPausedSurvivesRestart checks recovery: a paused sandbox is kept as
// paused (its saved box not cleaned as an orphan) and resumes; one the
// daemon left resuming is resumed again; one left pausing whose box
// runs on is running.
func TestPausedSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	d := newPausingDriver(t)
	dataDir := t.TempDir()
	clock := &fakeClock{now: time.Now()}
	m := newPauseManager(t, d, dataDir, clock)
	a, _ := m.Create(ctx, CreateRequest{}, true)
	b, _ := m.Create(ctx, CreateRequest{}, true)
	if _, err := m.Pause(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Pause(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	c, _ := m.Create(ctx, CreateRequest{}, true)
	e, _ := m.Create(ctx, CreateRequest{}, true)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// The daemon died resuming b, pausing c (its box runs on), and
	// pausing e, whose box was saved all the same (a checkpoint goes on
	// without the daemon).
	d.mu.Lock()
	ebox := d.boxes[e.ID]
	d.mu.Unlock()
	ebox.Stop(ctx)
	d.pmu.Lock()
	d.saved[e.ID] = true
	d.pmu.Unlock()
	st, err := openStore(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.all()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if state, ok := map[string]State{b.ID: StateResuming, c.ID: StatePausing, e.ID: StatePausing}[r.Sandbox.ID]; ok {
			r.Sandbox.State = state
			if err := st.put(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	st.close()

	m2 := newPauseManager(t, d, dataDir, clock)
	defer m2.Close()
	if got, _ := m2.Get(ctx, a.ID); got.State != StatePaused || got.PausedBytes != 4096 {
		t.Errorf("a after restart: %+v, want paused", got)
	}
	waitState(t, m2, b.ID, StateRunning)
	if got, _ := m2.Get(ctx, c.ID); got.State != StateRunning {
		t.Errorf("c, left pausing with its box running: %s, want running", got.State)
	}
	if got, _ := m2.Get(ctx, e.ID); got.State != StatePaused || got.PausedBytes != 8192 || got.ExpiresAt.IsZero() {
		t.Errorf("e, left pausing with its box saved: %+v, want paused", got)
	}
	if _, err := m2.Resume(ctx, a.ID, 0); !errors.Is(err, errdefs.ErrCapacity) {
		t.Errorf("resume of a with b and c running in a daemon of 2: %v, want ErrCapacity", err)
	}
	if err := m2.Destroy(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Resume(ctx, a.ID, 0); err != nil {
		t.Fatalf("resume after restart: %v", err)
	}
	if _, err := m2.Agent(ctx, a.ID); err != nil {
		t.Errorf("agent of a resumed after restart: %v", err)
	}
}

// TestAutoPauseOfPaused checks that an auto-pause finding its sandbox
// paused by someone else meanwhile leaves it paused: the reaper's
// fallback (destroy) is only for a sandbox that could not pause.
func TestAutoPauseOfPaused(t *testing.T) {
	ctx := context.Background()
	d := newPausingDriver(t)
	m := newPauseManager(t, d, t.TempDir(), &fakeClock{now: time.Now()})
	defer m.Close()
	a, err := m.Create(ctx, CreateRequest{AutoPause: true}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Pause(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	e, _ := m.entry(a.ID)
	if !m.autoPause(e, "expired") {
		t.Error("autoPause of a paused sandbox reported failure: the reaper would destroy it")
	}
	if got, _ := m.Get(ctx, a.ID); got.State != StatePaused || d.savedCount() != 1 {
		t.Errorf("after the auto-pause: %s, %d saved; want paused, 1", got.State, d.savedCount())
	}
}
