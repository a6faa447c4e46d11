// Package xdo makes `xdotool type` inside a sandbox type what it was given.
//
// xdotool types a character the keyboard map lacks (é, ✓, 日 on a US map)
// by binding it to a spare keycode, sending the key, and unbinding the
// keycode right after the release. An application translates a key event
// with the map it holds when it reads the event, so a busy one (Chromium
// under gVisor, on a loaded host) now and then reads the event after the
// unbinding and drops the character. E2B's Desktop SDK types all text with
// `xdotool type`, so agents written for it lose characters: in a runc
// sandbox here xdotool lost some of "ж東✓€ß日本ü" in 14 of 15 tries, and
// on a CI machine three tries in a row of a 24-character string under
// gVisor each lost one.
//
// The desktop image puts a wrapper first on PATH that runs the agent binary
// as `cubicle-agent xdotool ARGS...` (see Main). For a plain `type` on the
// agent's display it asks the agent, over a unix socket only the sandbox
// sees, to type the text with the agent's own keyboard code, which keeps
// such bindings for seconds and binds all of a text's keysyms before its
// first key (none lost in 45 tries). Everything else, and
// `type` whenever the agent cannot take it, runs the real /usr/bin/xdotool
// with the same arguments, so the wrapper never does less than xdotool.
//
// The socket lets any process in the sandbox type on the sandbox's display,
// which any X client there can already do with XTEST; it is not the agent's
// token-guarded socket and offers nothing else.
package xdo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/computer"
)

// SocketPath is where the agent listens for typing requests. It is inside
// the sandbox's own file system, never a directory shared with the host.
const SocketPath = "/run/cubicle-input/type.sock"

// RealXdotool is the xdotool the wrapper runs for everything it does not
// handle itself.
const RealXdotool = "/usr/bin/xdotool"

// defaultDelayMS is xdotool's own default delay between typed characters.
const defaultDelayMS = 12

// maxBody bounds a request: the text limit plus room for the JSON around it.
const maxBody = action.MaxTextBytes*2 + 1024

// Request is what the wrapper sends: the text, the delay between characters
// and the DISPLAY it was run with.
type Request struct {
	Display string `json:"display"`
	Text    string `json:"text"`
	DelayMS int    `json:"delay_ms"`
}

// Typer types text on the agent's display. An *action.Error means the
// request itself cannot be typed; any other error means the desktop could
// not take it (not up yet, X failure) and the wrapper should fall back.
type Typer interface {
	Type(ctx context.Context, text string, delayMS int) error
}

// Handler serves POST /type, POST /act (see act.go) and POST /screen
// (xvfb.go) for the display the agent drives; d is the agent's desktop
// service and r its session (nil: none, and /screen refuses).
func Handler(display string, t Typer, d computer.Desktop, r Resizer, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /act", serveAct(display, d, log))
	mux.Handle("POST /screen", serveScreen(display, r, log))
	mux.HandleFunc("POST /type", func(w http.ResponseWriter, r *http.Request) {
		var req Request
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if !SameDisplay(req.Display, display) {
			// Not ours: the real xdotool will talk to that display.
			http.Error(w, fmt.Sprintf("display %q is not the agent's %q", req.Display, display), http.StatusConflict)
			return
		}
		err := t.Type(r.Context(), req.Text, req.DelayMS)
		var aerr *action.Error
		switch {
		case err == nil:
			w.WriteHeader(http.StatusNoContent)
		case errors.As(err, &aerr):
			http.Error(w, aerr.Error(), http.StatusUnprocessableEntity)
		default:
			log.Warn("xdotool type: desktop unavailable", "err", err)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	return mux
}

// Listen opens SocketPath-style sockets: it makes the directory, removes a
// stale socket and lets every user of the sandbox connect (the wrapper runs
// as whoever ran xdotool).
func Listen(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("make %s: %w", dir, err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, nil
}

// SameDisplay reports whether two DISPLAY values name the same local
// display: ":0", ":0.0" and "unix:0" do.
func SameDisplay(a, b string) bool {
	norm := func(s string) string {
		s = strings.TrimPrefix(s, "unix")
		if i := strings.LastIndexByte(s, ':'); i >= 0 {
			if j := strings.IndexByte(s[i:], '.'); j >= 0 && s[i+j:] == ".0" {
				s = s[:i+j]
			}
		}
		return s
	}
	return a != "" && b != "" && norm(a) == norm(b)
}

// ParseType reads the arguments of `xdotool type ...` (args[0] == "type").
// It accepts only what the wrapper can do exactly as xdotool would: the
// delay option and text; anything else (--window, --clearmodifiers,
// --file, chained commands cannot follow type anyway) reports ok false.
func ParseType(args []string) (text string, delayMS int, ok bool) {
	if len(args) < 2 || args[0] != "type" {
		return "", 0, false
	}
	delayMS = defaultDelayMS
	rest := args[1:]
	for len(rest) > 0 {
		a := rest[0]
		if a == "--" {
			rest = rest[1:]
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		var val string
		switch {
		case a == "--delay" || a == "-d":
			if len(rest) < 2 {
				return "", 0, false
			}
			val, rest = rest[1], rest[2:]
		case strings.HasPrefix(a, "--delay="):
			val, rest = strings.TrimPrefix(a, "--delay="), rest[1:]
		default:
			return "", 0, false
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 || n > action.MaxDelayMS {
			return "", 0, false
		}
		delayMS = n
	}
	if len(rest) == 0 {
		return "", 0, false
	}
	text = strings.Join(rest, "") // xdotool types its arguments one after another
	if text == "" || len(text) > action.MaxTextBytes || !utf8.ValidString(text) {
		return "", 0, false
	}
	for _, r := range text {
		if _, typable := action.RuneKeysym(r); !typable {
			return "", 0, false
		}
	}
	return text, delayMS, true
}

// refusal is the agent's answer that the text cannot be typed.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

// Send asks the agent listening on path to type req. It returns a *refusal
// error when the agent read the request and will not type it; any other
// error means the agent could not be asked or could not type.
func Send(ctx context.Context, path string, req Request) error {
	resp, err := post(ctx, path, "/type", req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch resp.StatusCode {
	case http.StatusNoContent:
		return nil
	case http.StatusUnprocessableEntity:
		return &refusal{strings.TrimSpace(string(msg))}
	case http.StatusConflict, http.StatusServiceUnavailable, http.StatusBadRequest:
		// Not the agent's display, no desktop to type on, or a request
		// it could not read: nothing was typed.
		return errors.Join(errNotRun, fmt.Errorf("agent: %s: %s", resp.Status, strings.TrimSpace(string(msg))))
	default:
		return fmt.Errorf("agent: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
}

// post sends v as JSON to endpoint ("/type") of the agent listening on
// path. A failure to connect is marked errNotRun: nothing was sent. The
// caller closes the response's body; the connection is not kept.
func post(ctx context.Context, path, endpoint string, v any) (*http.Response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent"+endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Close = true // a wrapper sends one request and exits
	resp, err := unixClient(path).Do(hreq)
	if err != nil {
		if ctx.Err() == nil && isDialError(err) {
			err = errors.Join(errNotRun, err)
		}
		return nil, fmt.Errorf("ask the agent: %w", err)
	}
	return resp, nil
}

// unixClient is an HTTP client whose every request goes to the socket at
// path.
func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

// Main is `cubicle-agent xdotool ARGS...`: it types, and runs the pointer
// and key commands of act.go, through the agent when it can and otherwise
// execs the real xdotool. It returns the exit status when it does not exec.
func Main(args []string, getenv func(string) string, stderr io.Writer) int {
	if code, handled := mainXdotool(args, getenv, stderr); handled {
		return code
	}
	if text, delay, ok := ParseType(args); ok && getenv("DISPLAY") != "" {
		n := utf8.RuneCountInString(text)
		// Typing takes the delays plus a few ms a character; past that the
		// agent is stuck and xdotool could not do better.
		limit := time.Duration(n)*(time.Duration(delay)*time.Millisecond+50*time.Millisecond) + 30*time.Second
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		err := Send(ctx, SocketPath, Request{Display: getenv("DISPLAY"), Text: text, DelayMS: delay})
		cancel()
		var ref *refusal
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ref):
			fmt.Fprintf(stderr, "xdotool type: %s\n", ref.msg)
			return 1
		case !errors.Is(err, errNotRun):
			// Some of the text may have been typed (the agent timed
			// out, say): typing it all again would repeat it.
			fmt.Fprintf(stderr, "xdotool type: %v\n", err)
			return 1
		}
	}
	err := syscall.Exec(RealXdotool, append([]string{"xdotool"}, args...), os.Environ())
	fmt.Fprintf(stderr, "xdotool: exec %s: %v\n", RealXdotool, err)
	return 127
}
