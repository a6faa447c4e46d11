package sandbox

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

func TestRecordingRequestNormalize(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    RecordingRequest
		want  RecordingRequest
		field string // "" = valid
	}{
		{"defaults", RecordingRequest{}, RecordingRequest{FPS: 5, Scale: 1, Format: "webm"}, ""},
		{"all set", RecordingRequest{FPS: 30, Scale: 0.1, Format: "mp4"}, RecordingRequest{FPS: 30, Scale: 0.1, Format: "mp4"}, ""},
		{"one fps", RecordingRequest{FPS: 1}, RecordingRequest{FPS: 1, Scale: 1, Format: "webm"}, ""},
		{"fps above 30", RecordingRequest{FPS: 31}, RecordingRequest{}, "fps"},
		{"negative fps", RecordingRequest{FPS: -5}, RecordingRequest{}, "fps"},
		{"scale above 1", RecordingRequest{Scale: 1.01}, RecordingRequest{}, "scale"},
		{"scale below 0.1", RecordingRequest{Scale: 0.09}, RecordingRequest{}, "scale"},
		{"negative scale", RecordingRequest{Scale: -1}, RecordingRequest{}, "scale"},
		{"NaN scale", RecordingRequest{Scale: math.NaN()}, RecordingRequest{}, "scale"},
		{"infinite scale", RecordingRequest{Scale: math.Inf(1)}, RecordingRequest{}, "scale"},
		{"unknown format", RecordingRequest{Format: "gif"}, RecordingRequest{}, "format"},
		{"format in capitals", RecordingRequest{Format: "WEBM"}, RecordingRequest{}, "format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.Normalize()
			if tc.field == "" {
				if err != nil || got != tc.want {
					t.Errorf("Normalize(%+v) = %+v, %v; want %+v", tc.in, got, err, tc.want)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Normalize(%+v) error %v; want an invalid %s", tc.in, err, tc.field)
			}
		})
	}
}

func TestEvenScaled(t *testing.T) {
	for _, tc := range []struct {
		n     int
		scale float64
		want  int
	}{{1024, 1, 1024}, {1024, 0.5, 512}, {768, 0.33, 252}, {1023, 1, 1022}, {10, 0.1, 2}, {3, 0.1, 2}} {
		if got := evenScaled(tc.n, tc.scale); got != tc.want {
			t.Errorf("evenScaled(%d, %v) = %d, want %d", tc.n, tc.scale, got, tc.want)
		}
	}
}

// TestRecordingsRestartAndRetention: recordings are listed again after a
// restart; one the daemon's death cut off is failed, with its file kept;
// a file no recording names is removed; the reaper deletes recordings and
// files once their retention has passed, and not before.
func TestRecordingsRestartAndRetention(t *testing.T) {
	dir := t.TempDir()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m := newTestManager(t, newFakeDriver(t), dir, clock)
	start := clock.Now()
	stopped := start.Add(time.Minute)
	expires := stopped.Add(DefaultRecordingRetention)
	done := Recording{ID: newID(), SandboxID: "sb1", State: RecordingStopped, Format: "webm", FPS: 5, Scale: 1,
		StartedAt: start, StoppedAt: &stopped, ExpiresAt: &expires, DurationMS: 60000, Frames: 7, SizeBytes: 5}
	cut := Recording{ID: newID(), SandboxID: "sb2", State: RecordingActive, Format: "mp4", FPS: 5, Scale: 1, StartedAt: start}
	for _, r := range []Recording{done, cut} {
		if err := m.store.putRecording(&r, "owner"); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	rdir := filepath.Join(dir, "recordings")
	os.MkdirAll(rdir, 0o700)
	for _, f := range []string{done.ID + ".webm", cut.ID + ".mp4", "orphan.webm"} {
		if err := os.WriteFile(filepath.Join(rdir, f), []byte("video"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(2 * time.Minute)

	m = newTestManager(t, newFakeDriver(t), dir, clock)
	defer m.Close()
	ctx := context.Background()
	list := m.ListRecordings(ctx, "owner", "")
	if len(list) != 2 {
		t.Fatalf("after restart: %+v, want 2 recordings", list)
	}
	got, err := m.GetRecording(ctx, "owner", cut.ID)
	if err != nil || got.State != RecordingFailed || got.StopReason != StopDaemon || got.Error == "" || got.SizeBytes != 5 || got.ExpiresAt == nil {
		t.Errorf("cut-off recording after restart: %+v %v; want failed, daemon_stopped, with its file", got, err)
	}
	if _, err := m.GetRecording(ctx, "someone else", done.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another owner's get: %v, want not found", err)
	}
	if _, err := os.Stat(filepath.Join(rdir, "orphan.webm")); !os.IsNotExist(err) {
		t.Errorf("orphan file: %v, want removed", err)
	}

	clock.Advance(DefaultRecordingRetention - time.Minute) // done expires now, cut not yet
	m.Reap()
	if _, err := m.GetRecording(ctx, "owner", done.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("expired recording: %v, want not found", err)
	}
	if _, err := os.Stat(filepath.Join(rdir, done.ID+".webm")); !os.IsNotExist(err) {
		t.Errorf("expired recording's file: %v, want removed", err)
	}
	if _, err := m.GetRecording(ctx, "owner", cut.ID); err != nil {
		t.Errorf("recording within its retention: %v", err)
	}
	clock.Advance(2 * time.Minute)
	m.Reap()
	if l := m.ListRecordings(ctx, "owner", ""); len(l) != 0 {
		t.Errorf("after every retention: %+v, want none", l)
	}
	if recs, err := m.store.allRecordings(); err != nil || len(recs) != 0 {
		t.Errorf("store after every retention: %d %v, want empty", len(recs), err)
	}
}
