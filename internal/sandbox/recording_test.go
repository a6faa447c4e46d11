package sandbox

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/png"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/needs"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
	"github.com/cubicle-dev/cubicle/proto/desktop/desktopconnect"
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
	// The cut-off file was last written 30 s in; the daemon restarts
	// two minutes in.
	cutEnd := start.Add(30 * time.Second)
	if err := os.Chtimes(filepath.Join(rdir, cut.ID+".mp4"), cutEnd, cutEnd); err != nil {
		t.Fatal(err)
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
	if got.DurationMS != 30000 || got.StoppedAt == nil || !got.StoppedAt.Equal(cutEnd) {
		t.Errorf("cut-off recording: %d ms, stopped %v; want 30 s, stopped at its file's last write %v", got.DurationMS, got.StoppedAt, cutEnd)
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

// screenDriver is a fakeDriver whose boxes' agents answer Screenshot with
// whatever the test puts in shot: a sandbox's screen, as it chooses to
// describe it.
type screenDriver struct {
	*fakeDriver
	shot *atomic.Pointer[desktoppb.ScreenshotResponse]
}

type screenAgent struct {
	readyAgent
	shot *atomic.Pointer[desktoppb.ScreenshotResponse]
}

func (a screenAgent) Screenshot(context.Context, *connect.Request[desktoppb.ScreenshotRequest]) (*connect.Response[desktoppb.ScreenshotResponse], error) {
	return connect.NewResponse(a.shot.Load()), nil
}

// screenBox is a fake box whose agent is a screenAgent.
type screenBox struct {
	*fakeBox
	sock string
}

func (b screenBox) DialAgent(ctx context.Context) (net.Conn, error) {
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", b.sock)
}

func (d screenDriver) Create(ctx context.Context, spec driver.Spec) (driver.Box, error) {
	b, err := d.fakeDriver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(d.dir, spec.ID+".screen.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(desktopconnect.NewDesktopHandler(screenAgent{readyAgent{shutdowns: &d.shutdowns, d: d.fakeDriver, id: spec.ID}, d.shot}))
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	d.t.Cleanup(func() { srv.Close() })
	return screenBox{fakeBox: b.(*fakeBox), sock: sock}, nil
}

// shotOf is a screenshot answer: a w × h PNG of one grey, described as
// dw × dh.
func shotOf(t *testing.T, w, h, dw, dh int, grey uint8) *desktoppb.ScreenshotResponse {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = grey
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return &desktoppb.ScreenshotResponse{Width: int32(dw), Height: int32(dh), Data: b.Bytes()}
}

// newScreenManager is a manager of screenDriver boxes, and a running
// sandbox of owner with a 1024x768 screen.
func newScreenManager(t *testing.T, owner string) (*Manager, *atomic.Pointer[desktoppb.ScreenshotResponse], Sandbox) {
	t.Helper()
	needs.Command(t, "ffmpeg")
	shot := &atomic.Pointer[desktoppb.ScreenshotResponse]{}
	shot.Store(shotOf(t, 1024, 768, 1024, 768, 0))
	d := screenDriver{newFakeDriver(t), shot}
	m, err := New(context.Background(), Config{
		DataDir: t.TempDir(), Drivers: map[string]driver.Driver{"gvisor": d}, DefaultBackend: "gvisor",
		Images:       func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes: 2, MaxLifetime: time.Hour, ReapInterval: time.Hour,
		Clock: &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	sb, err := m.Create(context.Background(), CreateRequest{Owner: owner, Resolution: Resolution{Width: 1024, Height: 768}}, true)
	if err != nil {
		t.Fatal(err)
	}
	return m, shot, sb
}

// waitStopped waits for recording id of owner to end.
func waitStopped(t *testing.T, m *Manager, owner, id string, within time.Duration) Recording {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r, err := m.GetRecording(context.Background(), owner, id)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != RecordingActive {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("recording %+v still active after %v", r, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRecordingRefusesOtherFrameSize: the sandbox makes the frames and
// says their size. A first frame beyond the encoder's cap is refused (one
// of another size than the sandbox was made with is taken: E2B's
// Desktop.create resizes the screen); a later one whose PNG is another size than the recording's
// (whatever the agent claims) fails the recording, which keeps its file
// and leaves no ffmpeg running.
func TestRecordingRefusesOtherFrameSize(t *testing.T) {
	alice := KeyOwner("alice-key")
	m, shot, sb := newScreenManager(t, alice)
	ctx := context.Background()

	shot.Store(shotOf(t, 4100, 16, 4100, 16, 0))
	if _, err := m.StartRecording(ctx, sb.ID, alice, RecordingRequest{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("start with a screen wider than the cap: %v, want a conflict", err)
	}
	shot.Store(shotOf(t, 1280, 800, 1280, 800, 0))
	resized, err := m.StartRecording(ctx, sb.ID, alice, RecordingRequest{})
	if err != nil || resized.Width != 1280 || resized.Height != 800 {
		t.Fatalf("start on a resized screen: %+v, %v; want a 1280x800 recording", resized, err)
	}
	if _, err := m.StopRecording(ctx, alice, sb.ID, resized.ID); err != nil {
		t.Fatal(err)
	}

	shot.Store(shotOf(t, 1024, 768, 1024, 768, 0))
	r, err := m.StartRecording(ctx, sb.ID, alice, RecordingRequest{FPS: 10})
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	pid := m.recs[r.ID].enc.Pid()
	m.mu.Unlock()
	time.Sleep(300 * time.Millisecond)
	shot.Store(shotOf(t, 1920, 1080, 1024, 768, 0)) // a larger PNG, said to be the screen's size
	got := waitStopped(t, m, alice, r.ID, 10*time.Second)
	t.Logf("recording: %+v", got)
	if got.State != RecordingFailed || got.StopReason != StopEncoderFailed || !strings.Contains(got.Error, "frame 1920x1080 does not match the recording's 1024x768") {
		t.Errorf("recording after a frame of another size: %+v; want failed, encoder_failed, saying the sizes", got)
	}
	if got.SizeBytes == 0 {
		t.Error("the failed recording kept no file")
	}
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Errorf("ffmpeg %d: %v, want gone", pid, err)
	}
}

// TestRecordingOwnership: another key's sandbox cannot be recorded (it
// is not found, as an unknown one); with auth off everyone may, and a
// second recording's conflict does not name another key's recording.
func TestRecordingOwnership(t *testing.T) {
	alice, bob := KeyOwner("alice-key"), KeyOwner("bob-key")
	m, _, sb := newScreenManager(t, alice)
	ctx := context.Background()
	if _, err := m.StartRecording(ctx, sb.ID, bob, RecordingRequest{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob records alice's sandbox: %v, want not found", err)
	}
	r, err := m.StartRecording(ctx, sb.ID, alice, RecordingRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.StartRecording(ctx, sb.ID, "", RecordingRequest{})
	if !errors.Is(err, errdefs.ErrConflict) || strings.Contains(err.Error(), r.ID) {
		t.Errorf("second recording, by another: %v; want a conflict not naming %s", err, r.ID)
	}
	_, err = m.StartRecording(ctx, sb.ID, alice, RecordingRequest{})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), r.ID) {
		t.Errorf("second recording, by its owner: %v; want a conflict naming %s", err, r.ID)
	}
	if _, err := m.StopRecording(ctx, alice, sb.ID, r.ID); err != nil {
		t.Fatal(err)
	}
}

// TestRecordingDiskFull: a recording does not start on a nearly full
// disk, and one running stops, with its file kept, when the disk runs
// low.
func TestRecordingDiskFull(t *testing.T) {
	alice := KeyOwner("alice-key")
	m, _, sb := newScreenManager(t, alice)
	ctx := context.Background()
	old := recordingDiskCheck
	recordingDiskCheck = 100 * time.Millisecond
	defer func() { recordingDiskCheck = old }()
	var free atomic.Int64
	free.Store(minRecordingFree - 1)
	m.freeBytes = func(string) (int64, error) { return free.Load(), nil }
	if _, err := m.StartRecording(ctx, sb.ID, alice, RecordingRequest{}); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "full") {
		t.Errorf("start on a full disk: %v, want unavailable: full", err)
	}
	free.Store(10 << 30)
	r, err := m.StartRecording(ctx, sb.ID, alice, RecordingRequest{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	free.Store(1 << 20)
	got := waitStopped(t, m, alice, r.ID, 5*time.Second)
	if got.StopReason != StopDiskFull || got.State != RecordingFailed || got.SizeBytes == 0 {
		t.Errorf("recording as the disk ran low: %+v; want failed, disk_full, with its file", got)
	}
}

// TestRecordingErrorHidesDataDir: an error naming a file of the data
// directory shows "…" for it.
func TestRecordingErrorHidesDataDir(t *testing.T) {
	m := &Manager{cfg: Config{DataDir: "/var/lib/cubicle"}}
	if got := m.hideDataDir("ffmpeg: /var/lib/cubicle/recordings/x.webm: No space left"); got != "ffmpeg: …/recordings/x.webm: No space left" {
		t.Errorf("hideDataDir: %q", got)
	}
}

// TestDeleteRecordingHonoursCtx: a delete whose caller has given up
// returns at once rather than wait for the file to be finished (ffmpeg
// takes its time), and the recording still goes.
func TestDeleteRecordingHonoursCtx(t *testing.T) {
	alice := KeyOwner("alice-key")
	m, _, sb := newScreenManager(t, alice)
	r, err := m.StartRecording(context.Background(), sb.ID, alice, RecordingRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.DeleteRecording(ctx, alice, r.ID); !errors.Is(err, context.Canceled) {
		t.Errorf("delete given up: %v, want canceled", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		m.mu.Lock()
		_, ok := m.recs[r.ID]
		m.mu.Unlock()
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the recording was not deleted after its delete gave up waiting")
		}
	}
	if _, err := os.Stat(m.recordingPath(r.ID, r.Format)); !os.IsNotExist(err) {
		t.Errorf("deleted recording's file: %v, want removed", err)
	}
}
