package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/recording"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// Recording states.
const (
	RecordingActive  = "recording"
	RecordingStopped = "stopped" // the file is complete
	RecordingFailed  = "failed"  // see Error; a file may remain, cut short
)

// Why a recording stopped (Recording.StopReason).
const (
	StopRequested     = "requested"       // POST …/stop, or DELETE
	StopSandboxEnded  = "sandbox_stopped" // destroyed, reaped, died or paused
	StopDaemon        = "daemon_stopped"  // cubicled shut down
	StopMaxDuration   = "max_duration"    // Config.MaxRecordingDuration ran out
	StopMaxSize       = "max_size"        // the file reached MaxRecordingBytes
	StopDiskFull      = "disk_full"       // the data directory ran low (minRecordingFree)
	StopEncoderFailed = "encoder_failed"  // ffmpeg failed, or a frame was refused
)

// Defaults of the recording settings in Config.
const (
	DefaultRecordingRetention    = 24 * time.Hour
	DefaultMaxRecordingsPerOwner = 64
	DefaultMaxRecordingDuration  = 4 * time.Hour
	DefaultRecordingFPS          = 5
	MaxRecordingFPS              = 30
	// MaxRecordingBytes caps one recording's file: it stops (max_size)
	// a little before, and ffmpeg's -fs holds it at the cap regardless.
	MaxRecordingBytes = 2 << 30
)

// minRecordingFree is the free space the data directory must keep for a
// recording to start or go on: a recording is not worth filling the disk
// the sandboxes' own state lives on.
const minRecordingFree = 512 << 20

// recordingDiskCheck is how often a recording checks its file's size and
// the data directory's free space: at the bitrate caps (4 Mb/s) a file
// grows by some 5 MB in between.
var recordingDiskCheck = 10 * time.Second

// Recording is the API view of a recording of a sandbox's screen (API.md
// "Recordings"). It belongs to the API key that started it and outlives
// its sandbox until ExpiresAt.
type Recording struct {
	ID        string  `json:"id"`
	SandboxID string  `json:"sandbox_id"`
	State     string  `json:"state"`
	Format    string  `json:"format"`
	FPS       int     `json:"fps"`
	Scale     float64 `json:"scale"`
	// Width and Height are the video's size: the screen's, scaled.
	Width     int        `json:"width"`
	Height    int        `json:"height"`
	StartedAt time.Time  `json:"started_at"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// DurationMS is the video's length: the time from start to stop
	// (so far, while recording).
	DurationMS int64 `json:"duration_ms"`
	// Frames counts the frames sent to the encoder: one per change of
	// the screen (at most FPS a second), and a last one at the stop.
	Frames     int    `json:"frames"`
	SizeBytes  int64  `json:"size_bytes"`
	StopReason string `json:"stop_reason,omitempty"`
	Error      string `json:"error,omitempty"`
	// ExpiresAt is when a stopped or failed recording and its file are
	// deleted; unset while recording.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// RecordingRequest is what a recording is started with; zero values get
// the defaults.
type RecordingRequest struct {
	FPS    int     `json:"fps"`    // 1..30, default 5: the most frames a second
	Scale  float64 `json:"scale"`  // 0.1..1, default 1
	Format string  `json:"format"` // webm (default) or mp4
}

// Normalize fills in the defaults and checks r.
func (r RecordingRequest) Normalize() (RecordingRequest, error) {
	if r.FPS == 0 {
		r.FPS = DefaultRecordingFPS
	}
	if r.FPS < 1 || r.FPS > MaxRecordingFPS {
		return r, fieldErr("fps", " %d is out of range: want 1 to %d", r.FPS, MaxRecordingFPS)
	}
	if r.Scale == 0 {
		r.Scale = 1
	}
	if !(r.Scale >= 0.1 && r.Scale <= 1) { // NaN fails too
		return r, fieldErr("scale", " %v is out of range: want 0.1 to 1", r.Scale)
	}
	switch r.Format {
	case "":
		r.Format = recording.FormatWebM
	case recording.FormatWebM, recording.FormatMP4:
	default:
		return r, fieldErr("format", " %q is not a recording format: want webm or mp4", truncate(r.Format, 16))
	}
	return r, nil
}

// recordingID is the form of recording IDs (newID).
var recordingID = regexp.MustCompile(`^[a-z2-7]{26}$`)

// ValidRecordingID reports whether id can be a recording's ID.
func ValidRecordingID(id string) bool { return recordingID.MatchString(id) }

// evenScaled is n scaled and rounded down to even, at least 2.
func evenScaled(n int, scale float64) int {
	return max(2, int(float64(n)*scale)&^1)
}

// recorder is the manager's record of one recording.
type recorder struct {
	Recording
	Owner string

	stop     chan struct{} // closed to end the recording
	stopOnce sync.Once
	reason   string        // why stop was closed; guarded by m.mu
	done     chan struct{} // closed when the file is final and the record stored
	deleting bool
	enc      *recording.Encoder
}

// requestStop ends r's recording for reason; only the first reason counts.
// The caller holds m.mu.
func (r *recorder) requestStopLocked(reason string) {
	r.stopOnce.Do(func() {
		r.reason = reason
		close(r.stop)
	})
}

// recordingPath is where recording id's file lives.
func (m *Manager) recordingPath(id, format string) string {
	return filepath.Join(m.cfg.DataDir, "recordings", id+"."+format)
}

// view is the API view of r at now; the caller holds m.mu.
func (m *Manager) recordingView(r *recorder, now time.Time) Recording {
	v := r.Recording
	if v.State == RecordingActive {
		v.DurationMS = now.Sub(v.StartedAt).Milliseconds()
		if fi, err := os.Stat(m.recordingPath(v.ID, v.Format)); err == nil {
			v.SizeBytes = fi.Size()
		}
	}
	return v
}

// StartRecording starts recording the screen of the running sandbox id
// for owner. It captures the first frame before it returns, so a sandbox
// whose screen cannot be captured fails here. One recording per sandbox
// runs at a time.
func (m *Manager) StartRecording(ctx context.Context, id, owner string, req RecordingRequest) (Recording, error) {
	req, err := req.Normalize()
	if err != nil {
		return Recording{}, err
	}
	// Another key's sandbox is not found, as an unknown one (as Logs).
	m.mu.Lock()
	e, ok := m.entries[id]
	found := ok && (owner == "" || e.rec.Request.Owner == owner)
	m.mu.Unlock()
	if !found {
		return Recording{}, errdefs.NotFound("sandbox %s not found", id)
	}
	client, _, err := m.Watch(ctx, id)
	if err != nil {
		return Recording{}, err
	}
	if free, err := m.freeBytes(m.cfg.DataDir); err == nil && free < minRecordingFree {
		return Recording{}, errdefs.New(errdefs.ErrUnavailable, "cubicled's data directory is full: %d MiB free, and a recording needs %d MiB", free>>20, minRecordingFree>>20)
	}
	m.mu.Lock()
	if e.rec.Sandbox.Desktop != nil && !*e.rec.Sandbox.Desktop {
		m.mu.Unlock()
		return Recording{}, errdefs.New(errdefs.ErrNoDesktop, "sandbox %s has no desktop to record: its image has no X server", id)
	}
	n := 0
	for _, r := range m.recs {
		if r.SandboxID == id && r.State == RecordingActive {
			m.mu.Unlock()
			if r.Owner != owner {
				// Another key's recording: its ID is none of this key's business.
				return Recording{}, errdefs.Conflict("sandbox %s is being recorded already", id)
			}
			return Recording{}, errdefs.Conflict("sandbox %s is being recorded already (recording %s); stop that one first", id, r.ID)
		}
		if r.Owner == owner && !r.deleting {
			n++
		}
	}
	if n >= m.cfg.MaxRecordingsPerOwner {
		m.mu.Unlock()
		return Recording{}, errdefs.New(errdefs.ErrQuota, "this API key already has %d recordings, its limit; delete one first", n)
	}
	if m.closing {
		m.mu.Unlock()
		return Recording{}, errdefs.New(errdefs.ErrUnavailable, "cubicled is shutting down")
	}
	// Held as active from here, so a second start is refused while this
	// one captures its first frame.
	r := &recorder{
		Recording: Recording{ID: newID(), SandboxID: id, State: RecordingActive, Format: req.Format, FPS: req.FPS, Scale: req.Scale},
		Owner:     owner,
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	m.recs[r.ID] = r
	m.mu.Unlock()
	fail := func(err error) (Recording, error) {
		m.mu.Lock()
		delete(m.recs, r.ID)
		m.mu.Unlock()
		close(r.done)
		return Recording{}, err
	}
	if err := os.MkdirAll(filepath.Join(m.cfg.DataDir, "recordings"), 0o700); err != nil {
		return fail(fmt.Errorf("create recordings directory: %w", err))
	}
	start := time.Now()
	shot, err := captureFrame(ctx, client.Desktop)
	if err != nil {
		return fail(errdefs.New(errdefs.ErrConflict, "capture the screen of sandbox %s: %v", id, err))
	}
	// The sandbox says how large its screen is. That may differ from the
	// size it was created with (E2B's Desktop.create resizes it), so the
	// recording takes the first frame's size, no larger than the
	// encoder's cap; every later frame is held to it, header checked
	// (recording.Encoder.Frame), so a hostile agent cannot grow what
	// ffmpeg decodes.
	sw, sh := int(shot.Width), int(shot.Height)
	if sw <= 0 || sh <= 0 || sw > recording.MaxSide || sh > recording.MaxSide {
		return fail(errdefs.Conflict("the screen of sandbox %s is %dx%d; recordings take screens up to %dx%d", id, sw, sh, recording.MaxSide, recording.MaxSide))
	}
	width, height := evenScaled(sw, req.Scale), evenScaled(sh, req.Scale)
	path := m.recordingPath(r.ID, r.Format)
	enc, err := recording.Start(recording.Options{FFmpeg: m.cfg.FFmpeg, Path: path, Format: r.Format, FPS: r.FPS,
		Width: width, Height: height, SrcWidth: sw, SrcHeight: sh, MaxBytes: MaxRecordingBytes})
	if err != nil {
		return fail(errdefs.New(errdefs.ErrUnavailable, "start the encoder: %v", m.hideDataDir(err.Error())))
	}
	r.enc = enc
	// The first frame is the screen at the start: stamped 0.
	if err := enc.Frame(0, shot.Data); err != nil {
		_ = enc.Finish(context.WithoutCancel(ctx))
		os.Remove(path)
		return fail(errdefs.New(errdefs.ErrUnavailable, "encode the first frame: %v", m.hideDataDir(err.Error())))
	}
	m.mu.Lock()
	// Listed from here on (recLocked hides a recording without a start).
	r.Width, r.Height, r.Frames = width, height, 1
	r.StartedAt = m.cfg.Clock.Now().UTC()
	c := r.Recording
	m.mu.Unlock()
	if err := m.store.putRecording(&c, owner); err != nil {
		_ = enc.Finish(context.WithoutCancel(ctx))
		os.Remove(path)
		return fail(fmt.Errorf("persist recording: %w", err))
	}
	m.mu.Lock()
	if m.closing {
		// Close began while the first frame was taken: its wait on
		// m.wg may have passed, so no recorder may start now. The file
		// is final, with its one frame; the record says why it stopped.
		m.mu.Unlock()
		_ = enc.Finish(context.WithoutCancel(ctx))
		m.finishRecording(r, StopDaemon, 0, errors.New("cubicled shut down as the recording started"))
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.recordingView(r, m.cfg.Clock.Now()), nil
	}
	// Added under m.mu, with closing false: Close sets closing under
	// it before it waits, so it waits for this recorder too.
	m.wg.Add(1)
	m.m.RecordingsActive.Inc()
	go m.record(r, start, shot.Data)
	m.log.Info("recording started", "sandbox", id, "recording", r.ID, "fps", r.FPS, "format", r.Format, "size", fmt.Sprintf("%dx%d", r.Width, r.Height))
	defer m.mu.Unlock()
	return m.recordingView(r, m.cfg.Clock.Now()), nil
}

// captureBound bounds one frame's capture: a sandbox too busy to answer
// in it gets its next chance at the next tick.
const captureBound = 5 * time.Second

// frameClient is the part of the agent client a recorder uses.
type frameClient interface {
	Screenshot(context.Context, *connect.Request[desktoppb.ScreenshotRequest]) (*connect.Response[desktoppb.ScreenshotResponse], error)
}

// captureFrame takes one full-screen PNG. The agent answers a screen
// without damage since its last capture from its cache, without capturing
// or encoding again: that is what makes a still screen cheap to record.
func captureFrame(ctx context.Context, c frameClient) (*desktoppb.ScreenshotResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, captureBound)
	defer cancel()
	resp, err := c.Screenshot(ctx, connect.NewRequest(&desktoppb.ScreenshotRequest{Format: "png"}))
	if err != nil {
		return nil, err
	}
	if resp.Msg.Width <= 0 || resp.Msg.Height <= 0 || len(resp.Msg.Data) == 0 {
		return nil, errors.New("the agent sent an empty screenshot")
	}
	return resp.Msg, nil
}

// record runs recording r until it is asked to stop, its sandbox ends,
// MaxRecordingDuration runs out, its file or the disk fill up, or the
// daemon closes: it polls the screen FPS times a second and sends a frame
// only when the screen changed, then repeats the last frame at the stop
// so the video lasts as long as the recording did, finishes the file and
// stores the outcome.
func (m *Manager) record(r *recorder, start time.Time, last []byte) {
	defer m.wg.Done()
	defer m.m.RecordingsActive.Dec()
	log := m.log.With("sandbox", r.SandboxID, "recording", r.ID)
	interval := time.Second / time.Duration(r.FPS)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	disk := time.NewTicker(recordingDiskCheck)
	defer disk.Stop()
	limit := time.NewTimer(m.cfg.MaxRecordingDuration)
	defer limit.Stop()
	var lastAt time.Duration
	reason, encErr := "", error(nil)
	for reason == "" {
		select {
		case <-m.ctx.Done():
			reason = StopDaemon
		case <-r.stop:
			m.mu.Lock()
			reason = r.reason
			m.mu.Unlock()
		case <-limit.C:
			reason = StopMaxDuration
		case <-disk.C:
			reason = m.recordingRoom(r)
		case <-tick.C:
			client, ending, err := m.Watch(m.ctx, r.SandboxID)
			if err != nil || isClosed(ending) {
				reason = StopSandboxEnded
				break
			}
			shot, err := captureFrame(m.ctx, client.Desktop)
			if err != nil {
				// A busy or restarting desktop: the video holds the
				// last frame until a capture works again.
				log.Debug("capture a frame", "err", err)
				continue
			}
			if bytes.Equal(shot.Data, last) {
				continue
			}
			at := time.Since(start)
			// The encoder checks the frame's own header against the
			// recording's size: shot.Width and Height are the
			// sandbox's word, not taken.
			if err := r.enc.Frame(at, shot.Data); err != nil {
				reason, encErr = StopEncoderFailed, err
				break
			}
			last, lastAt = shot.Data, at
			m.mu.Lock()
			r.Frames++
			m.mu.Unlock()
		}
	}
	end := time.Since(start)
	if encErr == nil {
		// The last frame again, ending at the stop.
		at := max(lastAt+time.Millisecond, end-interval)
		if err := r.enc.Last(at, end-at, last); err != nil {
			encErr = err
		} else {
			m.mu.Lock()
			r.Frames++
			m.mu.Unlock()
		}
	}
	ferr := r.enc.Finish(context.WithoutCancel(m.ctx))
	m.finishRecording(r, reason, end, errors.Join(encErr, ferr))
}

// recordingRoom is why recording r must stop for lack of room, or "":
// its file is close to MaxRecordingBytes, or the data directory to full.
func (m *Manager) recordingRoom(r *recorder) string {
	if fi, err := os.Stat(m.recordingPath(r.ID, r.Format)); err == nil && fi.Size() >= MaxRecordingBytes/100*98 {
		return StopMaxSize
	}
	if free, err := m.freeBytes(m.cfg.DataDir); err == nil && free < minRecordingFree {
		return StopDiskFull
	}
	return ""
}

// finishRecording stores the outcome of recording r, whose file is final:
// it stopped for reason after dur, failed if err. It closes r.done.
func (m *Manager) finishRecording(r *recorder, reason string, dur time.Duration, err error) {
	defer close(r.done)
	now := m.cfg.Clock.Now().UTC()
	expires := now.Add(m.cfg.RecordingRetention)
	m.mu.Lock()
	r.State, r.StopReason = RecordingStopped, reason
	r.StoppedAt, r.ExpiresAt = &now, &expires
	r.DurationMS = dur.Milliseconds()
	if err != nil {
		r.State, r.Error = RecordingFailed, "encode: "+m.hideDataDir(err.Error())
	} else if reason == StopDiskFull {
		// The file is complete, but shorter than asked: say why.
		r.State, r.Error = RecordingFailed, "cubicled's data directory ran low on space; the recording was stopped"
	}
	if fi, err := os.Stat(m.recordingPath(r.ID, r.Format)); err == nil {
		r.SizeBytes = fi.Size()
	}
	c := r.Recording
	m.mu.Unlock()
	log := m.log.With("sandbox", r.SandboxID, "recording", r.ID)
	if err := m.store.putRecording(&c, r.Owner); err != nil {
		log.Warn("persist stopped recording", "err", err)
	}
	m.m.Recordings.WithLabelValues(c.State).Inc()
	log.Info("recording stopped", "state", c.State, "reason", reason, "ms", c.DurationMS, "frames", c.Frames, "bytes", c.SizeBytes, "err", c.Error)
}

// hideDataDir replaces the daemon's data directory in msg (ffmpeg names
// its files) with "…", as the logs do: a key sees its recording's error,
// not the host's layout.
func (m *Manager) hideDataDir(msg string) string {
	dirs := []string{m.cfg.DataDir}
	if real, err := filepath.EvalSymlinks(m.cfg.DataDir); err == nil && real != m.cfg.DataDir {
		dirs = append(dirs, real)
	}
	for _, d := range dirs {
		if d != "" {
			msg = strings.ReplaceAll(msg, d, "…")
		}
	}
	return msg
}

// stopRecordingsOf ends the recording of sandbox id, if one runs, and
// waits until its file is final: a sandbox going away takes its last
// frames with it, but not its recording.
func (m *Manager) stopRecordingsOf(id string) {
	var wait []chan struct{}
	m.mu.Lock()
	for _, r := range m.recs {
		if r.SandboxID == id && r.State == RecordingActive {
			r.requestStopLocked(StopSandboxEnded)
			wait = append(wait, r.done)
		}
	}
	m.mu.Unlock()
	for _, d := range wait {
		<-d
	}
}

// recLocked finds owner's recording id; another key's is not found.
func (m *Manager) recLocked(owner, id string) (*recorder, error) {
	r, ok := m.recs[id]
	if !ok || r.Owner != owner || r.deleting || r.StartedAt.IsZero() {
		return nil, errdefs.NotFound("recording %s not found", truncate(id, 64))
	}
	return r, nil
}

// StopRecording ends one of owner's recordings and returns it once its
// file is complete. Stopping a stopped recording returns it as it is.
// With sandboxID, the recording must be of that sandbox.
func (m *Manager) StopRecording(ctx context.Context, owner, sandboxID, id string) (Recording, error) {
	m.mu.Lock()
	r, err := m.recLocked(owner, id)
	if err == nil && sandboxID != "" && r.SandboxID != sandboxID {
		err = errdefs.NotFound("recording %s not found", id)
	}
	if err != nil {
		m.mu.Unlock()
		return Recording{}, err
	}
	r.requestStopLocked(StopRequested)
	m.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
		return Recording{}, fmt.Errorf("stop recording %s: %w", id, ctx.Err())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recordingView(r, m.cfg.Clock.Now()), nil
}

// ListRecordings returns owner's recordings, oldest first; with
// sandboxID, only those of that sandbox.
func (m *Manager) ListRecordings(ctx context.Context, owner, sandboxID string) []Recording {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Clock.Now()
	var out []Recording
	for _, r := range m.recs {
		if r.Owner == owner && !r.deleting && !r.StartedAt.IsZero() && (sandboxID == "" || r.SandboxID == sandboxID) {
			out = append(out, m.recordingView(r, now))
		}
	}
	slices.SortFunc(out, func(a, b Recording) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// GetRecording returns one of owner's recordings.
func (m *Manager) GetRecording(ctx context.Context, owner, id string) (Recording, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.recLocked(owner, id)
	if err != nil {
		return Recording{}, err
	}
	return m.recordingView(r, m.cfg.Clock.Now()), nil
}

// OpenRecording opens the file of one of owner's recordings for reading.
// A recording still in progress has no complete file yet: ErrConflict.
// The caller closes the file.
func (m *Manager) OpenRecording(ctx context.Context, owner, id string) (Recording, *os.File, error) {
	m.mu.Lock()
	r, err := m.recLocked(owner, id)
	if err != nil {
		m.mu.Unlock()
		return Recording{}, nil, err
	}
	v := m.recordingView(r, m.cfg.Clock.Now())
	m.mu.Unlock()
	if v.State == RecordingActive {
		return v, nil, errdefs.Conflict("recording %s is in progress; stop it first (POST /v1/sandboxes/%s/recordings/%s/stop)", id, v.SandboxID, id)
	}
	f, err := os.Open(m.recordingPath(v.ID, v.Format))
	if errors.Is(err, os.ErrNotExist) {
		return v, nil, errdefs.NotFound("recording %s has no file: %s", id, v.Error)
	}
	if err != nil {
		return v, nil, fmt.Errorf("open recording %s: %w", id, err)
	}
	return v, f, nil
}

// DeleteRecording removes one of owner's recordings and its file; one in
// progress is stopped first.
func (m *Manager) DeleteRecording(ctx context.Context, owner, id string) error {
	m.mu.Lock()
	r, err := m.recLocked(owner, id)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	r.requestStopLocked(StopRequested)
	r.deleting = true
	m.mu.Unlock()
	select {
	case <-r.done:
		return m.removeRecording(r)
	case <-ctx.Done():
		// The recording stops and goes all the same, once its file is
		// final: the caller asked for that, only stopped waiting.
		go func() {
			<-r.done
			if err := m.removeRecording(r); err != nil {
				m.log.Warn("delete a recording", "recording", r.ID, "err", err)
			}
		}()
		return fmt.Errorf("delete recording %s: %w", id, ctx.Err())
	}
}

// removeRecording deletes r's record, then its file.
func (m *Manager) removeRecording(r *recorder) error {
	if err := m.store.deleteRecording(r.ID); err != nil {
		m.mu.Lock()
		r.deleting = false
		m.mu.Unlock()
		return fmt.Errorf("delete recording %s: %w", r.ID, err)
	}
	// Gone from the store, the recording is gone: a file that cannot be
	// removed now is swept at the next start (loadRecordings).
	if err := os.Remove(m.recordingPath(r.ID, r.Format)); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("remove a deleted recording's file", "recording", r.ID, "err", err)
	}
	m.mu.Lock()
	delete(m.recs, r.ID)
	m.mu.Unlock()
	return nil
}

// reapRecordings deletes the recordings past their ExpiresAt.
func (m *Manager) reapRecordings(now time.Time) {
	var old []*recorder
	m.mu.Lock()
	for _, r := range m.recs {
		if r.State != RecordingActive && !r.deleting && r.ExpiresAt != nil && !now.Before(*r.ExpiresAt) {
			r.deleting = true
			old = append(old, r)
		}
	}
	m.mu.Unlock()
	for _, r := range old {
		if err := m.removeRecording(r); err != nil {
			m.log.Warn("delete an expired recording", "recording", r.ID, "err", err)
			continue
		}
		m.log.Info("recording expired", "recording", r.ID)
	}
}

// loadRecordings reads the stored recordings at start. One stored as
// recording was cut off by the daemon's death: its ffmpeg ended the file
// when it lost the daemon (SIGTERM), so it is kept, as failed, with what
// it holds. Files no record names are removed.
func (m *Manager) loadRecordings() error {
	recs, err := m.store.allRecordings()
	if err != nil {
		return err
	}
	now := m.cfg.Clock.Now().UTC()
	for _, r := range recs {
		if r.State == RecordingActive {
			expires := now.Add(m.cfg.RecordingRetention)
			r.State, r.StopReason = RecordingFailed, StopDaemon
			r.Error = "cubicled stopped without ending the recording; the file ends where it did and may not play"
			// The file ends where ffmpeg last wrote it, not at this
			// restart, however long the daemon was down.
			stopped := r.StartedAt
			if fi, err := os.Stat(m.recordingPath(r.ID, r.Format)); err == nil {
				r.SizeBytes = fi.Size()
				if mt := fi.ModTime().UTC(); mt.After(stopped) {
					stopped = mt
				}
			}
			r.StoppedAt, r.ExpiresAt = &stopped, &expires
			r.DurationMS = stopped.Sub(r.StartedAt).Milliseconds()
			if err := m.store.putRecording(&r.Recording, r.Owner); err != nil {
				return err
			}
		}
		r.stop, r.done = make(chan struct{}), closedChan()
		r.stopOnce.Do(func() { close(r.stop) })
		m.recs[r.ID] = r
	}
	files, _ := filepath.Glob(filepath.Join(m.cfg.DataDir, "recordings", "*"))
	for _, f := range files {
		id, _, _ := strings.Cut(filepath.Base(f), ".")
		if r, ok := m.recs[id]; ok && f == m.recordingPath(id, r.Format) {
			continue
		}
		if err := os.Remove(f); err != nil {
			m.log.Warn("remove orphan recording file", "file", f, "err", err)
		}
	}
	return nil
}
