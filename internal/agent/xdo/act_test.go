package xdo

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/proto/desktop"
)

// desk is a desktop that records the actions it is asked to run. It fails
// the action at failAt (with code) and answers a screenshot with png.
type desk struct {
	mu     sync.Mutex
	ran    []string
	failAt int // -1: none; the zero value refuses the first action
	code   string
	png    []byte
	rpcErr error
}

func (d *desk) Act(_ context.Context, req *connect.Request[desktop.ActRequest]) (*connect.Response[desktop.ActResponse], error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rpcErr != nil {
		return nil, d.rpcErr
	}
	resp := &desktop.ActResponse{FailedIndex: -1}
	for i, pa := range req.Msg.GetActions() {
		if i == d.failAt {
			resp.FailedIndex, resp.Error, resp.ErrorCode = int32(i), "action 0: refused", d.code
			break
		}
		a := action.FromProto(pa)
		d.ran = append(d.ran, describe(a))
		res := &desktop.ActionResult{Type: a.Type}
		if a.Type == action.TypeScreenshot {
			res.Screenshot = &desktop.ScreenshotResponse{Format: "png", Width: 4, Height: 3, Data: d.png}
		}
		resp.Results = append(resp.Results, res)
	}
	return connect.NewResponse(resp), nil
}

// describe is a short text of an action for comparing in tests.
func describe(a action.Action) string {
	var b strings.Builder
	b.WriteString(a.Type)
	if a.X != nil {
		b.WriteString(" " + strconv.Itoa(*a.X) + "," + strconv.Itoa(*a.Y))
	}
	for _, s := range []string{a.Button, a.Direction, a.Keys.String()} {
		if s != "" {
			b.WriteString(" " + s)
		}
	}
	if a.Count > 1 || a.Amount > 1 {
		b.WriteString(" ×" + strconv.Itoa(max(a.Count, a.Amount)))
	}
	if a.DurationMS > 0 {
		b.WriteString(" " + strconv.Itoa(a.DurationMS) + "ms")
	}
	if a.Cursor {
		b.WriteString(" cursor")
	}
	return b.String()
}

func TestParseXdotool(t *testing.T) {
	for _, tc := range []struct {
		args string
		want string // actions joined by "; "; "" means the real xdotool runs
	}{
		// What @e2b/desktop 2.4 runs.
		{"mousemove --sync 100 200", "move 100,200"},
		{"click 1", "click left"},
		{"click 2", "click middle"},
		{"click 3", "click right"},
		{"click --repeat 2 1", "click left ×2"},
		{"click --repeat 3 1", "click left ×3"},
		{"click --repeat 2 4", "scroll up; wait 100ms; scroll up"},
		{"click --repeat 3 5", "scroll down; wait 100ms; scroll down; wait 100ms; scroll down"},
		{"click 4", "scroll up"},
		{"mousedown 1", "mouse_down left"},
		{"mouseup 3", "mouse_up right"},
		{"key Return", "key Return"},
		{"key ctrl+c", "key ctrl+c"},
		{"key Control_L+Alt_L+Delete", "key Control_L+Alt_L+Delete"},
		{"key a", "key a"},
		{"key pageup", "key pageup"}, // the SDK lower-cases PageUp; xdotool ignores both
		// Other forms that mean the same to xdotool.
		{"mousemove 0 0", "move 0,0"},
		{"click 8", "click back"},
		{"click --delay 20 --repeat 2 7", "scroll right; wait 20ms; scroll right"},
		{"click --delay 0 --repeat 2 6", "scroll left; scroll left"},
		{"click --delay 50 --repeat 2 1", "click left ×2"},
		{"key Tab Tab", "key Tab; wait 12ms; key Tab"},
		{"key --delay 0 a b", "key a; key b"},
		{"key --delay 100 a b", "key a; wait 100ms; key b"},
		// Left to xdotool.
		{"", ""},
		{"mousemove", ""},
		{"mousemove 100", ""},
		{"mousemove -10 20", ""},
		{"mousemove 1 2 click 1", ""},
		{"mousemove --window 12 1 2", ""},
		{"mousemove restore", ""},
		{"mousemove 99999 1", ""},
		{"click --repeat 4 1", ""},
		{"click --repeat 0 1", ""},
		{"click --repeat 40 5", ""}, // more steps than one wrapped command runs
		{"click --clearmodifiers 1", ""},
		{"click 10", ""},
		{"click 1 2", ""},
		{"mousedown 4", ""},
		{"key", ""},
		{"key --clearmodifiers a", ""},
		{"key --window 1 a", ""},
		{"key not_a_key_name", ""},
		{"key a+b+c+d+e+f+g+h+i", ""},
		{"key --delay 5000 a", ""},
		{"getmouselocation", ""},
		{"search --onlyvisible --class chromium", ""},
		{"type hello", ""}, // type has its own path (ParseType)
	} {
		acts, ok := ParseXdotool(strings.Fields(tc.args))
		var got []string
		for _, a := range acts {
			n, err := action.Normalize(a)
			if err != nil {
				t.Errorf("%q: action %+v does not normalize: %v", tc.args, a, err)
			}
			got = append(got, describe(n))
		}
		if ok != (tc.want != "") || strings.Join(got, "; ") != tc.want {
			t.Errorf("%q: got %q (ok %v), want %q", tc.args, strings.Join(got, "; "), ok, tc.want)
		}
	}
}

func TestParseScrot(t *testing.T) {
	for _, tc := range []struct {
		args string
		want ScrotArgs
		ok   bool
	}{
		{"--pointer /tmp/screenshot-ab12.png", ScrotArgs{Path: "/tmp/screenshot-ab12.png", Pointer: true}, true},
		{"-o /tmp/a.png", ScrotArgs{Path: "/tmp/a.png", Overwrite: true}, true},
		{"-p -o -z shot.PNG", ScrotArgs{Path: "shot.PNG", Pointer: true, Overwrite: true}, true},
		{"", ScrotArgs{}, false},
		{"--pointer", ScrotArgs{}, false},
		{"/tmp/a.jpg", ScrotArgs{}, false},
		{"/tmp/a.png /tmp/b.png", ScrotArgs{}, false},
		{"--select /tmp/a.png", ScrotArgs{}, false},
		{"-u /tmp/a.png", ScrotArgs{}, false},
		{"/tmp/%Y-shot.png", ScrotArgs{}, false},
		{"/tmp/$w.png", ScrotArgs{}, false},
	} {
		got, ok := ParseScrot(strings.Fields(tc.args))
		if ok != tc.ok || got != tc.want {
			t.Errorf("%q: got %+v, %v; want %+v, %v", tc.args, got, ok, tc.want, tc.ok)
		}
	}
}

// TestAct runs wrapped commands against a real socket and a recording
// desktop: what ran, what the command exits with, and when the real
// program must run instead.
func TestAct(t *testing.T) {
	d := &desk{failAt: -1}
	path := serveDesktop(t, &typer{}, d)
	var stderr bytes.Buffer

	acts, _ := ParseXdotool([]string{"key", "ctrl+a", "BackSpace"})
	if code, handled := act(path, acts, ":0", "xdotool key", &stderr, nil); !handled || code != 0 {
		t.Fatalf("key: code %d handled %v (%s)", code, handled, stderr.String())
	}
	if got := strings.Join(d.ran, "; "); got != "key ctrl+a; wait 12ms; key BackSpace" {
		t.Errorf("ran %q", got)
	}

	// Refused before anything ran: the real xdotool gets its turn.
	d.ran, d.failAt, d.code = nil, 0, "invalid_argument"
	if _, handled := act(path, acts, ":0", "xdotool key", &stderr, nil); handled {
		t.Error("a refusal of the first action was handled; the real xdotool must run")
	}
	// Failed in the first action for another reason than its input: its
	// first events may have gone out, so the real xdotool must not repeat it.
	d.code = "internal"
	stderr.Reset()
	if code, handled := act(path, acts, ":0", "xdotool key", &stderr, nil); !handled || code != 1 {
		t.Errorf("an internal failure of the first action: code %d handled %v; want exit 1, no second run", code, handled)
	}
	d.code = "invalid_argument"
	// Failed after the first ran: running it again would repeat it.
	d.failAt = 1
	stderr.Reset()
	if code, handled := act(path, acts, ":0", "xdotool key", &stderr, nil); !handled || code != 1 || !strings.Contains(stderr.String(), "refused") {
		t.Errorf("a failure midway: code %d handled %v stderr %q; want exit 1 with the reason", code, handled, stderr.String())
	}
	// Another display, no desktop, no agent: the real program.
	d.failAt = -1
	if _, handled := act(path, acts, ":1", "xdotool key", &stderr, nil); handled {
		t.Error("a command for display :1 was handled")
	}
	d.rpcErr = errors.New("no desktop yet")
	if _, handled := act(path, acts, ":0", "xdotool key", &stderr, nil); handled {
		t.Error("a command with the desktop down was handled")
	}
	d.rpcErr = nil
	if _, handled := act(filepath.Join(t.TempDir(), "none.sock"), acts, ":0", "xdotool key", &stderr, nil); handled {
		t.Error("a command with no agent listening was handled")
	}
	// Bad actions never reach the desktop.
	d.ran = nil
	if _, handled := act(path, []action.Action{{Type: "explode"}}, ":0", "x", &stderr, nil); handled || len(d.ran) != 0 {
		t.Errorf("an unknown action: handled %v, ran %q", handled, d.ran)
	}
}

func TestScrot(t *testing.T) {
	d := &desk{failAt: -1, png: []byte("\x89PNG fake bytes")}
	path := serveDesktop(t, &typer{}, d)
	dir := t.TempDir()
	var stderr bytes.Buffer

	file := filepath.Join(dir, "screenshot-x.png")
	if code, handled := scrot(path, ScrotArgs{Path: file, Pointer: true}, ":0", &stderr); !handled || code != 0 {
		t.Fatalf("scrot: code %d handled %v (%s)", code, handled, stderr.String())
	}
	if b, err := os.ReadFile(file); err != nil || !bytes.Equal(b, d.png) {
		t.Errorf("file holds %q, %v; want the agent's PNG", b, err)
	}
	if got := strings.Join(d.ran, "; "); got != "screenshot cursor" {
		t.Errorf("ran %q, want a screenshot with the pointer", got)
	}

	// scrot without -o keeps an existing file and picks another name: the
	// real scrot does that.
	d.ran = nil
	if _, handled := scrot(path, ScrotArgs{Path: file}, ":0", &stderr); handled || len(d.ran) != 0 {
		t.Errorf("existing file without -o: handled %v, ran %q", handled, d.ran)
	}
	if code, handled := scrot(path, ScrotArgs{Path: file, Overwrite: true}, ":0", &stderr); !handled || code != 0 {
		t.Errorf("existing file with -o: code %d handled %v", code, handled)
	}
	// A directory that does not exist: scrot's own failure, exit non-zero.
	if code, handled := scrot(path, ScrotArgs{Path: filepath.Join(dir, "no", "x.png")}, ":0", &stderr); !handled || code == 0 {
		t.Errorf("missing directory: code %d handled %v", code, handled)
	}
}

func FuzzParseXdotool(f *testing.F) {
	for _, s := range []string{"mousemove --sync 1 2", "click --repeat 2 1", "key ctrl+c Return", "mousedown 1", "click 5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		acts, ok := ParseXdotool(strings.Split(s, " "))
		if !ok {
			return
		}
		for _, a := range acts {
			if _, err := action.Normalize(a); err != nil {
				t.Fatalf("%q parsed to an action that does not normalize: %+v: %v", s, a, err)
			}
		}
	})
}

func FuzzParseScrot(f *testing.F) {
	for _, s := range []string{"--pointer /tmp/a.png", "-o x.png", "-z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := ParseScrot(strings.Split(s, " "))
		if ok && (a.Path == "" || strings.HasPrefix(a.Path, "-")) {
			t.Fatalf("%q: path %q", s, a.Path)
		}
	})
}
