package xdo

// This file routes the rest of what E2B's Desktop SDK runs through the
// desktop (mouse, keys, screenshots) to the agent's computer facade
// (internal/computer), the same path the native API, the vendors'
// computer-use endpoints and the MCP server take: `xdotool mousemove`,
// `click`, `mousedown`, `mouseup` and `key`, and `scrot`. The reasons:
//
//   - one behaviour for one action, whichever front end asked: a key name
//     the API accepts is one the SDK's press() accepts, a click is the same
//     XTEST sequence;
//   - `scrot` through exec costs a process start, a full X image read and a
//     zlib PNG encode every time (~160 ms of a busy page on gVisor here);
//     the agent already holds the screen and knows through X DAMAGE whether
//     it changed.
//
// As for `type`, a command the wrapper does not know exactly, or one the
// agent refuses before doing anything, runs the real program instead, so
// the wrapper never does less than xdotool or scrot would.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/computer"
)

// RealScrot is the scrot the wrapper runs for what it does not handle.
const RealScrot = "/usr/bin/scrot"

// ActRequest is what the wrappers send to POST /act: the actions, in the
// native API's form, and the DISPLAY the command was run with.
type ActRequest struct {
	Display string          `json:"display"`
	Actions []action.Action `json:"actions"`
}

// ActResponse is the agent's answer to POST /act. Ran is how many actions
// ran to the end; Error, when set, is why the next one did not. Image is
// the PNG of a screenshot action, the only result a wrapper prints.
type ActResponse struct {
	Ran   int    `json:"ran"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
	Image []byte `json:"image,omitempty"`
}

// maxActBody bounds an /act request: a key command's few combos or one
// pointer action, with room to spare.
const maxActBody = 64 << 10

// maxWrapperActions is the most actions one wrapped command may ask for
// (`xdotool key a b c ...`).
const maxWrapperActions = 64

// serveAct is POST /act: the actions run through computer.Run on d.
func serveAct(display string, d computer.Desktop, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req ActRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxActBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if !SameDisplay(req.Display, display) {
			http.Error(w, fmt.Sprintf("display %q is not the agent's %q", req.Display, display), http.StatusConflict)
			return
		}
		if len(req.Actions) == 0 || len(req.Actions) > maxWrapperActions {
			http.Error(w, fmt.Sprintf("bad request: 1 to %d actions", maxWrapperActions), http.StatusBadRequest)
			return
		}
		acts := make([]action.Action, len(req.Actions))
		for i, a := range req.Actions {
			n, err := action.Normalize(a)
			if err != nil {
				http.Error(w, fmt.Sprintf("bad request: action %d: %v", i, err), http.StatusBadRequest)
				return
			}
			acts[i] = n
		}
		out, err := computer.Run(r.Context(), d, acts)
		if err != nil {
			log.Warn("wrapped desktop command: desktop unavailable", "err", err)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		resp := ActResponse{Ran: len(out.Results)}
		if f := out.Failure; f != nil {
			resp.Ran, resp.Error, resp.Code = f.Index, f.Message, f.Code
		}
		for _, res := range out.Results {
			if res.Image != nil {
				resp.Image = res.Image.Data
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(resp); err != nil {
			log.Debug("wrapped desktop command: answer", "err", err)
		}
	}
}

// SendActs asks the agent listening on path to run req. A transport
// failure, or an answer other than 200, is an error and means nothing ran
// as far as the caller can tell only when errors.Is(err, errNotRun).
func SendActs(ctx context.Context, path string, req ActRequest) (ActResponse, error) {
	resp, err := post(ctx, path, "/act", req)
	if err != nil {
		return ActResponse{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		// Every answer but 200 is given before anything ran.
		return ActResponse{}, errors.Join(errNotRun, fmt.Errorf("agent: %s: %s", resp.Status, strings.TrimSpace(string(msg))))
	}
	var out ActResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil {
		return ActResponse{}, fmt.Errorf("read the agent's answer: %w", err)
	}
	return out, nil
}

// errNotRun marks a SendActs error after which the actions certainly did
// not run, so that the real program may run them instead.
var errNotRun = errors.New("not run")

// isDialError reports whether err is a failure to connect (no agent
// socket, nobody listening), not one after the request was sent.
func isDialError(err error) bool {
	var se syscall.Errno
	return errors.As(err, &se) && (se == syscall.ENOENT || se == syscall.ECONNREFUSED || se == syscall.EACCES)
}

// ParseXdotool reads the xdotool commands E2B's Desktop SDK runs, other
// than type, as the actions that do exactly what xdotool would:
//
//	mousemove [--sync] X Y
//	click [--repeat N] [--delay MS] BUTTON   (1-3, 8, 9 a click of N ≤ 3; 4-7 N scroll steps MS apart, default 100)
//	mousedown BUTTON, mouseup BUTTON          (1-3)
//	key [--delay MS] COMBO...                 (each COMBO a key action; MS ≤ 1000 between them)
//
// Anything else (another option, a window, chained commands, a key name
// the agent does not know) reports ok false, and the real xdotool runs.
func ParseXdotool(args []string) (acts []action.Action, ok bool) {
	if len(args) == 0 {
		return nil, false
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "mousemove":
		if len(rest) > 0 && rest[0] == "--sync" {
			// The agent's move is a synchronous XTEST request followed by
			// a round trip, so the pointer is there when it answers.
			rest = rest[1:]
		}
		if len(rest) != 2 {
			return nil, false
		}
		x, okX := coord(rest[0])
		y, okY := coord(rest[1])
		if !okX || !okY {
			return nil, false
		}
		return []action.Action{{Type: action.TypeMove, X: &x, Y: &y}}, true
	case "click":
		repeat, delay := 1, clickDelayMS
		for len(rest) > 1 && strings.HasPrefix(rest[0], "-") {
			n, err := strconv.Atoi(rest[1])
			switch {
			case err != nil:
				return nil, false
			case rest[0] == "--repeat" && n >= 1 && n <= action.MaxScrollAmount:
				repeat = n
			case rest[0] == "--delay" && n >= 0 && n <= action.MaxDelayMS:
				delay = n
			default:
				return nil, false
			}
			rest = rest[2:]
		}
		if len(rest) != 1 {
			return nil, false
		}
		if dir, isWheel := wheel[rest[0]]; isWheel {
			// One step at a time with xdotool's pause between them:
			// Chromium folds wheel events that come together into one,
			// and a page counting them (E2B's scroll(dir, n)) would see
			// fewer than n.
			if 2*repeat-1 > maxWrapperActions {
				return nil, false
			}
			for i := 0; i < repeat; i++ {
				if i > 0 && delay > 0 {
					acts = append(acts, action.Action{Type: action.TypeWait, DurationMS: delay})
				}
				acts = append(acts, action.Action{Type: action.TypeScroll, Direction: dir, Amount: 1})
			}
			return acts, true
		}
		b, okB := buttons[rest[0]]
		if !okB || repeat > 3 {
			return nil, false
		}
		// A double or triple click at the agent's own interval, which
		// applications take as one (xdotool's 100 ms does too).
		return []action.Action{{Type: action.TypeClick, Button: b, Count: repeat}}, true
	case "mousedown", "mouseup":
		if len(rest) != 1 {
			return nil, false
		}
		b, okB := buttons[rest[0]]
		if !okB {
			return nil, false
		}
		t := action.TypeMouseDown
		if cmd == "mouseup" {
			t = action.TypeMouseUp
		}
		return []action.Action{{Type: t, Button: b}}, true
	case "key":
		delay := -1
		if len(rest) > 1 && rest[0] == "--delay" {
			n, err := strconv.Atoi(rest[1])
			if err != nil || n < 0 || n > action.MaxDelayMS {
				return nil, false
			}
			delay, rest = n, rest[2:]
		}
		if len(rest) == 0 || len(rest) > maxWrapperActions/2 {
			return nil, false
		}
		for i, combo := range rest {
			if strings.HasPrefix(combo, "-") && combo != "-" {
				return nil, false
			}
			keys := action.SplitCombo(combo)
			if len(keys) == 0 || len(keys) > action.MaxKeys {
				return nil, false
			}
			if _, err := action.ParseCombo(keys); err != nil {
				return nil, false
			}
			if i > 0 && delay != 0 {
				// xdotool waits 12 ms between keys unless told otherwise.
				ms := delay
				if ms < 0 {
					ms = defaultDelayMS
				}
				acts = append(acts, action.Action{Type: action.TypeWait, DurationMS: ms})
			}
			acts = append(acts, action.Action{Type: action.TypeKey, Keys: action.Keys(keys)})
		}
		return acts, true
	}
	return nil, false
}

// clickDelayMS is xdotool's default pause between the clicks of
// `click --repeat`.
const clickDelayMS = 100

// buttons are xdotool's button numbers the click actions take; wheel are
// the ones X sends as scroll steps.
var (
	buttons = map[string]string{"1": action.ButtonLeft, "2": action.ButtonMiddle, "3": action.ButtonRight,
		"8": action.ButtonBack, "9": action.ButtonForward}
	wheel = map[string]string{"4": action.DirectionUp, "5": action.DirectionDown,
		"6": action.DirectionLeft, "7": action.DirectionRight}
)

// coord reads a pointer coordinate xdotool would use as is (it reads
// negative ones relative to nothing useful; those go to xdotool).
func coord(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > action.MaxCoord {
		return 0, false
	}
	return n, true
}

// ScrotArgs is a scrot command the wrapper can serve: a PNG of the whole
// screen written to Path.
type ScrotArgs struct {
	Path      string
	Pointer   bool // --pointer: draw the mouse pointer
	Overwrite bool // --overwrite: replace Path rather than pick a new name
}

// ParseScrot reads `scrot [--pointer|-p] [--overwrite|-o] [--silent|-z]
// FILE.png`, the forms E2B's Desktop SDK and agents following it run.
// Any other option, no file, or a file not named .png (scrot picks the
// format by the name) reports ok false.
func ParseScrot(args []string) (ScrotArgs, bool) {
	var s ScrotArgs
	for _, a := range args {
		switch {
		case a == "--pointer" || a == "-p":
			s.Pointer = true
		case a == "--overwrite" || a == "-o":
			s.Overwrite = true
		case a == "--silent" || a == "-z":
		case strings.HasPrefix(a, "-") || s.Path != "":
			return ScrotArgs{}, false
		default:
			s.Path = a
		}
	}
	if s.Path == "" || !strings.EqualFold(filepath.Ext(s.Path), ".png") || strings.Contains(s.Path, "$") || strings.Contains(s.Path, "%") {
		// scrot expands $-variables and %-formats in the name.
		return ScrotArgs{}, false
	}
	return s, true
}

// mainXdotool is `cubicle-agent xdotool ARGS...` for a command other
// than type; see Main.
func mainXdotool(args []string, getenv func(string) string, stderr io.Writer) (code int, handled bool) {
	acts, ok := ParseXdotool(args)
	if !ok || getenv("DISPLAY") == "" {
		return 0, false
	}
	return act(SocketPath, acts, getenv("DISPLAY"), "xdotool "+args[0], stderr, nil)
}

// act runs acts through the agent. It reports handled false when the real
// program should run instead: the agent could not be asked, or refused
// before anything ran.
func act(socket string, acts []action.Action, display, what string, stderr io.Writer, image *[]byte) (code int, handled bool) {
	limit := 30 * time.Second
	for _, a := range acts {
		limit += time.Duration(a.DurationMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	out, err := SendActs(ctx, socket, ActRequest{Display: display, Actions: acts})
	switch {
	case errors.Is(err, errNotRun):
		return 0, false
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\n", what, err)
		return 1, true
	case out.Error != "" && out.Ran == 0 && out.Code == computer.CodeInvalid:
		// Refused before its first event was sent.
		return 0, false
	case out.Error != "":
		fmt.Fprintf(stderr, "%s: %s\n", what, out.Error)
		return 1, true
	}
	if image != nil {
		*image = out.Image
	}
	return 0, true
}

// ScrotMain is `cubicle-agent scrot ARGS...`, the desktop image's
// /usr/local/bin/scrot: it writes the agent's screenshot when it can and
// otherwise execs the real scrot. It returns the exit status when it does
// not exec.
func ScrotMain(args []string, getenv func(string) string, stderr io.Writer) int {
	if s, ok := ParseScrot(args); ok && getenv("DISPLAY") != "" {
		if code, done := scrot(SocketPath, s, getenv("DISPLAY"), stderr); done {
			return code
		}
	}
	err := syscall.Exec(RealScrot, append([]string{"scrot"}, args...), os.Environ())
	fmt.Fprintf(stderr, "scrot: exec %s: %v\n", RealScrot, err)
	return 127
}

// scrot writes the screenshot s asks for, from the agent at socket.
func scrot(socket string, s ScrotArgs, display string, stderr io.Writer) (code int, handled bool) {
	if !s.Overwrite {
		if _, err := os.Lstat(s.Path); err == nil {
			// scrot would pick another name (FILE_000.png); let it.
			return 0, false
		}
	}
	var png []byte
	shot := action.Action{Type: action.TypeScreenshot, Format: action.FormatPNG, Cursor: s.Pointer}
	if code, handled := act(socket, []action.Action{shot}, display, "scrot", stderr, &png); !handled || code != 0 {
		return code, handled
	}
	if len(png) == 0 {
		return 0, false
	}
	// Written by this process, so the file belongs to whoever ran scrot,
	// with their umask, as scrot's own would.
	if err := os.WriteFile(s.Path, png, 0o666); err != nil {
		fmt.Fprintf(stderr, "scrot: %v\n", err)
		return 2, true
	}
	return 0, true
}
