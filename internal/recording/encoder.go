// Package recording turns a sandbox's screen into a video file: it runs
// one ffmpeg per recording and feeds it PNG frames with the time each was
// captured, so that a frame is sent (and encoded) only when the screen
// changed. The sandbox manager (internal/sandbox) owns recordings; this
// package knows only ffmpeg and the pipe to it, and may be imported by the
// daemon's side only.
package recording

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Formats are the container formats a recording can have.
const (
	FormatWebM = "webm" // VP8 (libvpx), which every browser plays
	FormatMP4  = "mp4"  // H.264 (libx264)
)

// ContentType is the media type of a recording file of format.
func ContentType(format string) string {
	if format == FormatMP4 {
		return "video/mp4"
	}
	return "video/webm"
}

// Options describe one encoding.
type Options struct {
	// FFmpeg is the ffmpeg program; "" means "ffmpeg" on PATH.
	FFmpeg string
	// Path is the output file, written by ffmpeg.
	Path string
	// Format is FormatWebM or FormatMP4.
	Format string
	// FPS caps the frame rate; it sets the keyframe interval.
	FPS int
	// Width and Height are the output size, both even (4:2:0 chroma
	// needs it); frames of another size are scaled to it.
	Width, Height int
}

// Encoder is one running ffmpeg. Frame and Finish are called from one
// goroutine.
type Encoder struct {
	opts   Options
	cmd    *exec.Cmd
	in     io.WriteCloser
	stderr *limitedBuffer
	header bool // the stream header has been written
	done   chan struct{}
	err    error // ffmpeg's exit, set before done closes
}

// finishGrace bounds how long ffmpeg may take to encode what it was sent
// and write the file's index after its input ends; it is then killed.
const finishGrace = 30 * time.Second

// args is ffmpeg's command line for o.
func (o Options) args() []string {
	a := []string{
		"-hide_banner", "-loglevel", "error", "-nostdin",
		"-f", "matroska", "-i", "pipe:0",
		"-an",
		// Every frame is kept at its own time: no frames are made up
		// for a still screen, none dropped for a busy one (the daemon
		// sends at most FPS a second).
		"-fps_mode", "passthrough",
		"-vf", fmt.Sprintf("scale=%d:%d:flags=bilinear,format=yuv420p", o.Width, o.Height),
		"-threads", "1",
		"-g", strconv.Itoa(max(1, o.FPS) * 10),
	}
	switch o.Format {
	case FormatMP4:
		a = append(a, "-c:v", "libx264", "-preset", "veryfast", "-tune", "stillimage", "-crf", "23",
			"-movflags", "+faststart", "-f", "mp4")
	default:
		// Realtime deadline, fastest speed, no lookahead: the encoder
		// keeps up on one thread and holds no frames back.
		a = append(a, "-c:v", "libvpx", "-deadline", "realtime", "-cpu-used", "8",
			"-lag-in-frames", "0", "-auto-alt-ref", "0", "-crf", "10", "-b:v", "2M", "-f", "webm")
	}
	return append(a, "-y", o.Path)
}

// Start starts ffmpeg for o. The caller must call Finish, which ends it.
func Start(o Options) (*Encoder, error) {
	if o.Width <= 0 || o.Height <= 0 || o.Width%2 != 0 || o.Height%2 != 0 {
		return nil, fmt.Errorf("recording size %dx%d: want even, positive sides", o.Width, o.Height)
	}
	bin := o.FFmpeg
	if bin == "" {
		bin = "ffmpeg"
	}
	cmd := exec.Command(bin, o.args()...) //depcheck:runs ffmpeg
	// If the daemon dies without stopping the recording, ffmpeg gets
	// SIGTERM, on which it ends the file properly: no orphan runs on,
	// and the file up to then plays.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("ffmpeg stdin: %w", err)
	}
	e := &Encoder{opts: o, cmd: cmd, in: in, stderr: &limitedBuffer{max: 4096}, done: make(chan struct{})}
	cmd.Stderr = e.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start ffmpeg: %w", err)
	}
	go func() {
		// Ends when ffmpeg does; Finish makes sure it does.
		err := cmd.Wait()
		if err != nil {
			if msg := bytes.TrimSpace(e.stderr.Bytes()); len(msg) > 0 {
				err = fmt.Errorf("%w: %s", err, msg)
			}
		}
		e.err = err
		close(e.done)
	}()
	return e, nil
}

// Pid is ffmpeg's process ID.
func (e *Encoder) Pid() int { return e.cmd.Process.Pid }

// Frame sends one PNG frame of width × height, shown from at (since the
// start of the recording) until the next frame. Times must not go
// backwards.
func (e *Encoder) Frame(at time.Duration, width, height int, png []byte) error {
	return e.frame(at, width, height, png, 0)
}

// Last sends the recording's last frame: shown from at for dur, when the
// recording ends. Nothing may be sent after it.
func (e *Encoder) Last(at, dur time.Duration, width, height int, png []byte) error {
	return e.frame(at, width, height, png, uint64(max(1, dur.Milliseconds())))
}

func (e *Encoder) frame(at time.Duration, width, height int, png []byte, dur uint64) error {
	select {
	case <-e.done:
		return fmt.Errorf("ffmpeg exited: %v", e.err)
	default:
	}
	if !e.header {
		if _, err := e.in.Write(mkvHeader(width, height)); err != nil {
			return e.writeErr(err)
		}
		e.header = true
	}
	if err := writeFrame(e.in, uint64(max(0, at.Milliseconds())), png, dur); err != nil {
		return e.writeErr(err)
	}
	return nil
}

// writeErr explains a failed write to ffmpeg by its exit when it has one.
func (e *Encoder) writeErr(err error) error {
	select {
	case <-e.done:
		return fmt.Errorf("ffmpeg exited: %v", e.err)
	case <-time.After(100 * time.Millisecond):
		return fmt.Errorf("write frame to ffmpeg: %w", err)
	}
}

// Finish ends the input and waits for ffmpeg to write the file out; after
// finishGrace, or when ctx ends, ffmpeg is killed and the file is removed
// as unusable. It always leaves no process behind. A recording that got
// no frame at all is an error: there is no video.
func (e *Encoder) Finish(ctx context.Context) error {
	e.in.Close()
	t := time.NewTimer(finishGrace)
	defer t.Stop()
	select {
	case <-e.done:
	case <-t.C:
	case <-ctx.Done():
	}
	select {
	case <-e.done:
	default:
		_ = e.cmd.Process.Kill()
		<-e.done
		os.Remove(e.opts.Path)
		return errors.New("ffmpeg did not finish the file in time; it was stopped")
	}
	if !e.header {
		os.Remove(e.opts.Path)
		return errors.New("no frame was captured")
	}
	if e.err != nil {
		return fmt.Errorf("ffmpeg: %w", e.err)
	}
	return nil
}

// limitedBuffer keeps the first max bytes written to it: enough of
// ffmpeg's error output to say why it failed.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Bytes returns a copy of what was kept.
func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
