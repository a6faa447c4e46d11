package xdo

// E2B's Desktop.create({resolution, dpi}) asks for its screen the one way
// it knows: it runs `Xvfb :0 -ac -screen 0 WxHx24 -retro -dpi D -nolisten
// tcp -nolisten unix` in the background, then waits for xdpyinfo to
// answer. In a cubicle sandbox the agent's X server holds :0 already, so
// that Xvfb exits at once ("server already active") and the screen keeps
// the size the sandbox was made with. The desktop image's Xvfb wrapper
// runs `cubicle-agent Xvfb ARGS...` (XvfbMain), which asks the agent to
// give its display the size and DPI asked for (POST /screen), and runs the
// real Xvfb for any other display or any option it does not know.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RealXvfb is the X server the wrapper runs for what it does not handle.
const RealXvfb = "/usr/bin/Xvfb"

// Resizer gives the agent's display a new size and DPI; the session
// supervisor is one.
type Resizer interface {
	Resize(ctx context.Context, width, height, dpi int) error
}

// ScreenRequest is what the Xvfb wrapper sends to POST /screen.
type ScreenRequest struct {
	Display string `json:"display"`
	Width   int    `json:"width"`
	Height  int    `json:"height"`
	DPI     int    `json:"dpi"`
}

// resizeTimeout bounds a resize: the X server starts again, then the
// programs; Xvfb itself is up in well under a second.
const resizeTimeout = 60 * time.Second

// serveScreen is POST /screen.
func serveScreen(display string, r Resizer, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var sr ScreenRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&sr); err != nil {
			http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if !SameDisplay(sr.Display, display) {
			http.Error(w, fmt.Sprintf("display %q is not the agent's %q", sr.Display, display), http.StatusConflict)
			return
		}
		if r == nil {
			http.Error(w, "this agent runs no desktop session", http.StatusConflict)
			return
		}
		ctx, cancel := context.WithTimeout(req.Context(), resizeTimeout)
		defer cancel()
		if err := r.Resize(ctx, sr.Width, sr.Height, sr.DPI); err != nil {
			log.Warn("Xvfb wrapper: resize", "width", sr.Width, "height", sr.Height, "dpi", sr.DPI, "err", err)
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// ParseXvfb reads an Xvfb command line that asks for display's first
// screen to be WxHx24 at some DPI (96, Xvfb's default, when not given):
// the display, then any of -ac, -retro, -noreset, -nolisten T, -listen T,
// ±extension E, -dpi N, -screen 0 WxH[x24]. Any other option, another
// screen or depth, or no display reports ok false.
func ParseXvfb(args []string) (req ScreenRequest, ok bool) {
	req.DPI = 96
	screen := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		arg := func() (string, bool) {
			if i+1 >= len(args) {
				return "", false
			}
			i++
			return args[i], true
		}
		switch {
		case strings.HasPrefix(a, ":") && req.Display == "":
			if _, err := strconv.Atoi(a[1:]); err != nil {
				return ScreenRequest{}, false
			}
			req.Display = a
		case a == "-ac" || a == "-retro" || a == "-noreset":
		case a == "-nolisten" || a == "-listen" || a == "+extension" || a == "-extension":
			if _, ok := arg(); !ok {
				return ScreenRequest{}, false
			}
		case a == "-dpi":
			v, ok := arg()
			n, err := strconv.Atoi(v)
			if !ok || err != nil {
				return ScreenRequest{}, false
			}
			req.DPI = n
		case a == "-screen":
			num, ok1 := arg()
			geom, ok2 := arg()
			if !ok1 || !ok2 || num != "0" || screen {
				return ScreenRequest{}, false
			}
			parts := strings.Split(geom, "x")
			if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "24") {
				return ScreenRequest{}, false
			}
			var err1, err2 error
			req.Width, err1 = strconv.Atoi(parts[0])
			req.Height, err2 = strconv.Atoi(parts[1])
			if err1 != nil || err2 != nil {
				return ScreenRequest{}, false
			}
			screen = true
		default:
			return ScreenRequest{}, false
		}
	}
	return req, req.Display != "" && screen
}

// SendScreen asks the agent listening on path for req.
func SendScreen(ctx context.Context, path string, req ScreenRequest) error {
	resp, err := post(ctx, path, "/screen", req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return &statusError{resp.StatusCode, fmt.Sprintf("agent: %s: %s", resp.Status, strings.TrimSpace(string(msg)))}
	}
	return nil
}

// statusError is an answer of the agent other than success.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

// SessionXServerEnv is set in the environment of the X server the
// agent's own session starts: that one is always the real Xvfb, whatever
// PATH finds first, so the agent never asks itself to resize a display it
// is starting.
const SessionXServerEnv = "CUBICLE_SESSION_XSERVER"

// XvfbMain is `cubicle-agent Xvfb ARGS...`, the desktop image's
// /usr/local/bin/Xvfb. It returns the exit status when it does not exec
// the real Xvfb.
func XvfbMain(args []string, getenv func(string) string, stderr io.Writer) int {
	if req, ok := resizeRequest(args, getenv); ok {
		code, handled := xvfb(SocketPath, req, stderr)
		if handled {
			return code
		}
	}
	err := syscall.Exec(RealXvfb, append([]string{"Xvfb"}, args...), os.Environ())
	fmt.Fprintf(stderr, "Xvfb: exec %s: %v\n", RealXvfb, err)
	return 127
}

// resizeRequest is the resize an Xvfb command line asks the agent for,
// if any: never for the session's own X server.
func resizeRequest(args []string, getenv func(string) string) (ScreenRequest, bool) {
	if getenv(SessionXServerEnv) != "" {
		return ScreenRequest{}, false
	}
	return ParseXvfb(args)
}

// xvfb asks the agent at socket to resize its display. The agent answers
// for its own display only, also while that display is starting again
// (it waits for it); for any other display, or with no agent, the real
// Xvfb runs.
func xvfb(socket string, req ScreenRequest, stderr io.Writer) (code int, handled bool) {
	ctx, cancel := context.WithTimeout(context.Background(), resizeTimeout+5*time.Second)
	defer cancel()
	if err := SendScreen(ctx, socket, req); err != nil {
		var errno syscall.Errno
		var se *statusError
		if errors.As(err, &errno) || (errors.As(err, &se) && se.code == http.StatusConflict) {
			return 0, false // no agent to ask, or not its display
		}
		fmt.Fprintf(stderr, "Xvfb: %v\n", err)
		return 1, true
	}
	fmt.Fprintf(stderr, "Xvfb: display %s is now %dx%d at %d dpi (the cubicle agent's X server)\n", req.Display, req.Width, req.Height, req.DPI)
	return 0, true
}
