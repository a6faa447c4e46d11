package recording

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"os/exec"
	"path/filepath"
	"strconv"
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
			e, err := Start(Options{Path: path, Format: format, FPS: 5, Width: 160, Height: 120})
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
					err = e.Frame(f.at, 320, 240, pngOf(t, 320, 240, f.c))
				} else {
					err = e.Last(f.at, 200*time.Millisecond, 320, 240, pngOf(t, 320, 240, f.c))
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
	e, err := Start(Options{Path: path, Format: FormatWebM, FPS: 5, Width: 160, Height: 120})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Finish(context.Background()); err == nil {
		t.Fatal("Finish without frames: no error")
	}
}

func TestStartRejectsOddSize(t *testing.T) {
	for _, s := range [][2]int{{0, 2}, {3, 2}, {2, 5}, {-2, 2}} {
		if _, err := Start(Options{Path: "/nonexistent", Width: s[0], Height: s[1]}); err == nil {
			t.Errorf("size %v: no error", s)
		}
	}
}
