package recording

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

func pngOf(t *testing.T, w, h int, c color.RGBA) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, c.A
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// probe returns the file's duration in seconds and its frame count.
func probe(t *testing.T, path string) (float64, int) {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0",
		"-show_entries", "format=duration:stream=nb_read_frames", "-of", "json", path).Output()
	if err != nil {
		t.Fatalf("ffprobe %s: %v", path, err)
	}
	var p struct {
		Format struct {
			Duration string `json:"duration"`
		} `json:"format"`
		Streams []struct {
			Frames string `json:"nb_read_frames"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(out, &p); err != nil || len(p.Streams) != 1 {
		t.Fatalf("ffprobe output %s: %v", out, err)
	}
	d, _ := strconv.ParseFloat(p.Format.Duration, 64)
	n, _ := strconv.Atoi(p.Streams[0].Frames)
	return d, n
}

// TestEncoderVariableFrames sends frames only at changes, as the
// recorder does, and checks that the file has the wall-clock length and
// the colours where they were sent.
func TestEncoderVariableFrames(t *testing.T) {
	needs.Command(t, "ffmpeg", "ffprobe")
	red, blue := color.RGBA{255, 0, 0, 255}, color.RGBA{0, 0, 255, 255}
	for _, format := range []string{FormatWebM, FormatMP4} {
		t.Run(format, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r."+format)
			e, err := Start(Options{Path: path, Format: format, FPS: 5, Width: 160, Height: 120, SrcWidth: 320, SrcHeight: 240})
			if err != nil {
				t.Fatal(err)
			}
			frames := []struct {
				at time.Duration
				c  color.RGBA
			}{{0, red}, {3 * time.Second, blue}, {5800 * time.Millisecond, blue}} // the last repeats at stop, for one frame
			for i, f := range frames {
				var err error
				if i < len(frames)-1 {
					err = e.Frame(f.at, pngOf(t, 320, 240, f.c))
				} else {
					err = e.Last(f.at, 200*time.Millisecond, pngOf(t, 320, 240, f.c))
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Finish(context.Background()); err != nil {
				t.Fatal(err)
			}
			d, n := probe(t, path)
			t.Logf("duration %.3fs, %d frames", d, n)
			if d < 5.4 || d > 6.6 {
				t.Errorf("duration %.3fs, want 6s ±10%%", d)
			}
			if n != len(frames) {
				t.Errorf("%d frames, want %d (one per change, none made up)", n, len(frames))
			}
			// One frame a second, decoded to RGB: red before 3 s, blue after.
			raw, err := exec.Command("ffmpeg", "-v", "error", "-i", path, "-vf", "fps=1,scale=8:6",
				"-f", "rawvideo", "-pix_fmt", "rgb24", "-").Output()
			if err != nil {
				t.Fatal(err)
			}
			const fsize = 8 * 6 * 3
			if len(raw) < 5*fsize {
				t.Fatalf("%d bytes of frames, want at least 5 frames", len(raw))
			}
			at := func(i int) [3]byte { o := i*fsize + fsize/2; return [3]byte{raw[o], raw[o+1], raw[o+2]} }
			if c := at(1); c[0] < 200 || c[2] > 60 {
				t.Errorf("frame at 1s %v, want red", c)
			}
			if c := at(len(raw)/fsize - 1); c[2] < 200 || c[0] > 60 {
				t.Errorf("last frame %v, want blue", c)
			}
		})
	}
}

// TestEncoderNoFrame: a recording stopped before its first frame leaves
// no file and says why.
func TestEncoderNoFrame(t *testing.T) {
	needs.Command(t, "ffmpeg")
	path := filepath.Join(t.TempDir(), "r.webm")
	e, err := Start(Options{Path: path, Format: FormatWebM, FPS: 5, Width: 160, Height: 120, SrcWidth: 320, SrcHeight: 240})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Finish(context.Background()); err == nil {
		t.Fatal("Finish without frames: no error")
	}
}

func TestStartRejectsOddSize(t *testing.T) {
	for _, s := range [][2]int{{0, 2}, {3, 2}, {2, 5}, {-2, 2}} {
		if _, err := Start(Options{Path: "/nonexistent", Width: s[0], Height: s[1], SrcWidth: 64, SrcHeight: 64}); err == nil {
			t.Errorf("size %v: no error", s)
		}
	}
	for _, s := range [][2]int{{0, 64}, {64, -1}, {MaxSide + 1, 64}, {64, MaxSide + 1}} {
		if _, err := Start(Options{Path: "/nonexistent", Width: 64, Height: 64, SrcWidth: s[0], SrcHeight: s[1]}); err == nil {
			t.Errorf("screen size %v: no error", s)
		}
	}
}

// gone reports whether process pid has exited and been reaped.
func gone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

// TestEncoderRefusesOtherFrameSize: the sandbox makes the frames; one
// whose PNG header says another size than the recording's (or that is
// no PNG) never reaches ffmpeg, fails, and so does every frame after it.
// The file keeps what came before, and no ffmpeg is left.
func TestEncoderRefusesOtherFrameSize(t *testing.T) {
	needs.Command(t, "ffmpeg", "ffprobe")
	red := color.RGBA{255, 0, 0, 255}
	for name, bad := range map[string][]byte{
		"larger":    pngOf(t, 640, 480, red),
		"not a png": []byte("GIF89a not a png at all"),
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.webm")
			e, err := Start(Options{Path: path, Format: FormatWebM, FPS: 5, Width: 160, Height: 120, SrcWidth: 320, SrcHeight: 240})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Frame(0, pngOf(t, 320, 240, red)); err != nil {
				t.Fatal(err)
			}
			err = e.Frame(time.Second, bad)
			if err == nil {
				t.Fatal("a frame of another size: no error")
			}
			t.Logf("refused: %v", err)
			var fe *FrameSizeError
			if name == "larger" && !errors.As(err, &fe) {
				t.Errorf("error %v, want a FrameSizeError", err)
			}
			if err := e.Frame(2*time.Second, pngOf(t, 320, 240, red)); err == nil {
				t.Error("a frame after the refused one: no error")
			}
			if err := e.Finish(context.Background()); err != nil {
				t.Fatalf("Finish: %v", err)
			}
			if !gone(e.Pid()) {
				t.Errorf("ffmpeg %d still runs", e.Pid())
			}
			if _, n := probe(t, path); n != 1 {
				t.Errorf("%d frames in the file, want the 1 before the refused one", n)
			}
		})
	}
}

// TestEncoderFinishInterrupts: an ffmpeg that does not end its file in
// time is interrupted, not killed outright, and the file it wrote is kept
// for the user. The stand-in ffmpeg ignores the end of its input, and on
// SIGINT writes its "trailer" and exits.
func TestEncoderFinishInterrupts(t *testing.T) {
	dir := t.TempDir()
	// Readable by nobody, whom the encoder runs as under root.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fake := filepath.Join(dir, "ffmpeg")
	script := "#!/bin/sh\nfor a; do out=$a; done\ntrap 'kill $!; echo trailer >>$out; exit 255' INT\ncat >/dev/null\nsleep 60 &\nwait\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "r.mp4")
	e, err := Start(Options{FFmpeg: fake, Path: path, Format: FormatMP4, FPS: 5, Width: 160, Height: 120, SrcWidth: 320, SrcHeight: 240})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Frame(0, pngOf(t, 320, 240, color.RGBA{255, 0, 0, 255})); err != nil {
		t.Fatal(err)
	}
	// As if finishGrace had run out at once.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	began := time.Now()
	if err := e.Finish(ctx); err == nil {
		t.Error("Finish cut short: no error")
	} else {
		t.Logf("Finish: %v", err)
	}
	if d := time.Since(began); d > interruptGrace {
		t.Errorf("Finish took %v: ffmpeg was killed, not interrupted", d)
	}
	if !gone(e.Pid()) {
		t.Errorf("ffmpeg %d still runs", e.Pid())
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "trailer\n" {
		t.Errorf("file %q %v: want kept, with what ffmpeg wrote at the interrupt", b, err)
	}
}

// TestEncoderUnprivileged: run as root, ffmpeg runs as nobody, under an
// address-space cap, and the file it writes through its descriptor is
// still complete (webm's cues and duration are written by seeking back).
func TestEncoderUnprivileged(t *testing.T) {
	needs.Command(t, "ffmpeg")
	needs.Root(t) // to drop to nobody
	path := filepath.Join(t.TempDir(), "r.webm")
	e, err := Start(Options{Path: path, Format: FormatWebM, FPS: 5, Width: 160, Height: 120, SrcWidth: 320, SrcHeight: 240})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Finish(context.Background())
	// The limit is set by the shell that then becomes ffmpeg.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", e.Pid()))
		if string(comm) == "ffmpeg\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d is %q, not ffmpeg", e.Pid(), comm)
		}
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^Uid:\s+65534\s`).Match(st) {
		t.Errorf("ffmpeg's status: %s; want uid 65534", st)
	}
	lim, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", e.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`Max address space\s+2147483648\s`).Match(lim) {
		t.Errorf("ffmpeg's limits: %s; want a 2 GiB address space", lim)
	}
}

// TestArgs: ffmpeg decodes and scales on one thread each, writes no more
// than MaxBytes, and an mp4 is fragmented (playable when cut off) with a
// capped bitrate.
func TestArgs(t *testing.T) {
	o := Options{Path: "/x", Format: FormatMP4, FPS: 5, Width: 64, Height: 64, SrcWidth: 64, SrcHeight: 64, MaxBytes: 1 << 30}
	a := strings.Join(o.args("/proc/self/fd/3"), " ")
	for _, want := range []string{
		"-filter_threads 1 -threads 1 -f matroska -i pipe:0", // -threads before -i: the decoder's
		"-maxrate 4M -bufsize 8M",
		"-movflags +frag_keyframe+empty_moov+default_base_moof",
		"-fs 1073741824 -y /proc/self/fd/3",
	} {
		if !strings.Contains(a, want) {
			t.Errorf("ffmpeg args %q lack %q", a, want)
		}
	}
}

// TestEncoderStuckInput: an ffmpeg that stops reading its input fails the
// frame being written after frameWriteBound, rather than block it, and
// Finish still leaves no process.
func TestEncoderStuckInput(t *testing.T) {
	old := frameWriteBound
	frameWriteBound = 300 * time.Millisecond
	defer func() { frameWriteBound = old }()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fake := filepath.Join(dir, "ffmpeg")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := Start(Options{FFmpeg: fake, Path: filepath.Join(dir, "r.webm"), Format: FormatWebM, FPS: 5, Width: 64, Height: 64, SrcWidth: 64, SrcHeight: 64})
	if err != nil {
		t.Fatal(err)
	}
	// A frame larger than a pipe's buffer: its write cannot complete.
	big := bytes.Repeat([]byte{0}, 1<<20)
	frame := append(pngOf(t, 64, 64, color.RGBA{0, 0, 0, 255}), big...)
	began := time.Now()
	err = e.Frame(0, frame)
	if err == nil {
		t.Fatal("a frame ffmpeg does not read: no error")
	}
	t.Logf("after %v: %v", time.Since(began), err)
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("the write took %v, want about frameWriteBound", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = e.Finish(ctx)
	if !gone(e.Pid()) {
		t.Errorf("ffmpeg %d still runs", e.Pid())
	}
}
