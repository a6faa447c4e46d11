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
	"image/png"
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
	// needs it); frames are scaled to it.
	Width, Height int
	// SrcWidth and SrcHeight are the size of every frame (the screen's),
	// at most MaxSide each. The frames come from the sandbox: a PNG whose
	// header says another size is refused before ffmpeg sees it, so the
	// decoder and scaler (and their memory) are sized once, by the daemon.
	SrcWidth, SrcHeight int
	// MaxBytes caps the file (ffmpeg's -fs); 0 means no cap.
	MaxBytes int64
}

// MaxSide is the largest frame side an encoder takes: a 4096×4096 RGBA
// frame is 64 MiB decoded, which bounds what ffmpeg holds per frame.
const MaxSide = 4096

// The limits of the ffmpeg process. It decodes PNGs the sandbox made, so
// it runs as nobody, without the daemon's rights, and with a cap on its
// address space: a decoder bug or a bomb of a frame costs that process,
// not the host.
const (
	ffmpegUID      = 65534 // nobody
	ffmpegGID      = 65534 // nogroup
	ffmpegMaxBytes = 2 << 30
)

// frameWriteBound bounds one frame's write to ffmpeg: an encoder that
// takes no input for that long is stuck, and the recording fails rather
// than hang its recorder (and a stop or delete waiting on it). A variable
// for the tests.
var frameWriteBound = 10 * time.Second

// Encoder is one running ffmpeg. Frame and Finish are called from one
// goroutine.
type Encoder struct {
	opts   Options
	cmd    *exec.Cmd
	in     *os.File // the write end of ffmpeg's stdin, with deadlines
	stderr *limitedBuffer
	header bool  // the stream header has been written
	bad    error // set once the stream is unusable: no frame follows
	done   chan struct{}
	err    error // ffmpeg's exit, set before done closes
}

// finishGrace bounds how long ffmpeg may take to encode what it was sent
// and write the file's index after its input ends; it is then
// interrupted, and killed if it does not end within interruptGrace.
const (
	finishGrace    = 30 * time.Second
	interruptGrace = 5 * time.Second
)

// outputFD is the output file's descriptor in ffmpeg (its ExtraFiles[0]):
// the daemon opens the file, so ffmpeg, running as nobody, needs no
// access to the data directory.
const outputFD = 3

// args is ffmpeg's command line for o, writing to out.
func (o Options) args(out string) []string {
	a := []string{
		"-hide_banner", "-loglevel", "error", "-nostdin",
		// One decoder thread and one filter thread: a recording costs
		// about one core whatever the host has, and a sandbox cannot
		// make it take every core.
		"-filter_threads", "1",
		"-threads", "1", "-f", "matroska", "-i", "pipe:0",
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
		// Capped bitrate: a screen of noise cannot grow the file
		// faster than 4 Mb/s. Fragmented: every keyframe ends a
		// fragment the file can be played to, so a recording cut off
		// (the daemon killed, ffmpeg stuck at the stop) keeps what it
		// held, where +faststart would lose it all.
		a = append(a, "-c:v", "libx264", "-preset", "veryfast", "-tune", "stillimage", "-crf", "23",
			"-maxrate", "4M", "-bufsize", "8M",
			"-movflags", "+frag_keyframe+empty_moov+default_base_moof", "-f", "mp4")
	default:
		// Realtime deadline, fastest speed, no lookahead: the encoder
		// keeps up on one thread and holds no frames back.
		a = append(a, "-c:v", "libvpx", "-deadline", "realtime", "-cpu-used", "8",
			"-lag-in-frames", "0", "-auto-alt-ref", "0", "-crf", "10", "-b:v", "2M", "-f", "webm")
	}
	if o.MaxBytes > 0 {
		a = append(a, "-fs", strconv.FormatInt(o.MaxBytes, 10))
	}
	return append(a, "-y", out)
}

// Start starts ffmpeg for o. The caller must call Finish, which ends it.
// The daemon creates the output file; ffmpeg writes it through a
// descriptor it inherits, as nobody when the daemon is root.
func Start(o Options) (*Encoder, error) {
	if o.Width <= 0 || o.Height <= 0 || o.Width%2 != 0 || o.Height%2 != 0 {
		return nil, fmt.Errorf("recording size %dx%d: want even, positive sides", o.Width, o.Height)
	}
	if o.SrcWidth <= 0 || o.SrcHeight <= 0 || o.SrcWidth > MaxSide || o.SrcHeight > MaxSide {
		return nil, fmt.Errorf("screen size %dx%d: want sides of 1 to %d", o.SrcWidth, o.SrcHeight, MaxSide)
	}
	bin := o.FFmpeg
	if bin == "" {
		bin = "ffmpeg"
	}
	out, err := os.OpenFile(o.Path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create recording file: %w", err)
	}
	defer out.Close() // ffmpeg has its own copy once started
	// The address-space cap is set by a shell that then becomes ffmpeg:
	// prlimit(2) on the started child would need CAP_SYS_RESOURCE, which
	// a daemon in a container often lacks, and rlimits are process-wide,
	// so the daemon cannot set one on itself for the fork.
	limit := fmt.Sprintf(`ulimit -v %d && exec "$0" "$@"`, ffmpegMaxBytes>>10)
	cmd := exec.Command("/bin/sh", append([]string{"-c", limit, bin}, o.args(fmt.Sprintf("/proc/self/fd/%d", outputFD))...)...) //depcheck:runs ffmpeg
	cmd.ExtraFiles = []*os.File{out}
	// If the daemon dies without stopping the recording, ffmpeg gets
	// SIGTERM, on which it ends the file properly: no orphan runs on,
	// and the file up to then plays.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if os.Geteuid() == 0 {
		// ffmpeg reopens its output through /proc/self/fd, which checks
		// the file's own permissions: nobody must own it.
		if err := out.Chown(ffmpegUID, ffmpegGID); err != nil {
			return nil, fmt.Errorf("hand the recording file to nobody: %w", err)
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: ffmpegUID, Gid: ffmpegGID}
	}
	// An os.Pipe rather than cmd.StdinPipe: its write end takes
	// deadlines (frameWriteBound).
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("ffmpeg stdin: %w", err)
	}
	cmd.Stdin = r
	e := &Encoder{opts: o, cmd: cmd, in: w, stderr: &limitedBuffer{max: 4096}, done: make(chan struct{})}
	cmd.Stderr = e.stderr
	// Once ffmpeg has exited, a child of it still holding stderr must not
	// hold up Wait (and so Finish).
	cmd.WaitDelay = time.Second
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
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

// Frame sends one PNG frame, shown from at (since the start of the
// recording) until the next frame. Times must not go backwards. A frame
// whose header is not a PNG of the encoder's SrcWidth × SrcHeight is
// refused, with an error, and none is sent after it.
func (e *Encoder) Frame(at time.Duration, png []byte) error {
	return e.frame(at, png, 0)
}

// Last sends the recording's last frame: shown from at for dur, when the
// recording ends. Nothing may be sent after it.
func (e *Encoder) Last(at, dur time.Duration, png []byte) error {
	return e.frame(at, png, uint64(max(1, dur.Milliseconds())))
}

// FrameSizeError is the error of a frame whose PNG is not of the
// recording's size.
type FrameSizeError struct {
	Width, Height         int // the frame's, by its header
	WantWidth, WantHeight int // the recording's
}

func (e *FrameSizeError) Error() string {
	return fmt.Sprintf("frame %dx%d does not match the recording's %dx%d", e.Width, e.Height, e.WantWidth, e.WantHeight)
}

// checkFrame checks that data is a PNG of w × h, from its header alone:
// what ffmpeg would size its decoding by.
func checkFrame(data []byte, w, h int) error {
	c, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("frame is not a PNG: %w", err)
	}
	if c.Width != w || c.Height != h {
		return &FrameSizeError{Width: c.Width, Height: c.Height, WantWidth: w, WantHeight: h}
	}
	return nil
}

func (e *Encoder) frame(at time.Duration, data []byte, dur uint64) error {
	if e.bad != nil {
		return e.bad
	}
	select {
	case <-e.done:
		return fmt.Errorf("ffmpeg exited: %v", e.err)
	default:
	}
	if err := checkFrame(data, e.opts.SrcWidth, e.opts.SrcHeight); err != nil {
		e.bad = err
		return err
	}
	if !e.header {
		if err := e.write(mkvHeader(e.opts.SrcWidth, e.opts.SrcHeight)); err != nil {
			return e.writeErr(err)
		}
		e.header = true
	}
	var b bytes.Buffer
	_ = writeFrame(&b, uint64(max(0, at.Milliseconds())), data, dur)
	if err := e.write(b.Bytes()); err != nil {
		return e.writeErr(err)
	}
	return nil
}

// write writes p to ffmpeg within frameWriteBound.
func (e *Encoder) write(p []byte) error {
	if err := e.in.SetWriteDeadline(time.Now().Add(frameWriteBound)); err != nil {
		return err
	}
	_, err := e.in.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("ffmpeg took no input for %v", frameWriteBound)
	}
	if err != nil {
		// A frame cut in half leaves the stream unusable.
		e.bad = err
	}
	return err
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

// Finish ends the input and waits for ffmpeg to write the file out. After
// finishGrace, or when ctx ends, ffmpeg is interrupted, on which it ends
// the file where it is, and killed if it still does not exit; what it
// wrote is kept, but Finish fails. It always leaves no process behind. A
// recording that got no frame at all is an error, and leaves no file:
// there is no video.
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
		_ = e.cmd.Process.Signal(os.Interrupt)
		select {
		case <-e.done:
		case <-time.After(interruptGrace):
			_ = e.cmd.Process.Kill()
			<-e.done
		}
		return errors.New("ffmpeg did not finish the file in time; it was stopped, and the file may end early")
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
