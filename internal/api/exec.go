package api

import (
	"encoding/json"
	"net/http"
	"path"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// maxExecTimeoutSeconds bounds timeout_seconds of one exec.
const maxExecTimeoutSeconds = 24 * 3600

// ndjson is the media type of streamed exec output.
const ndjson = "application/x-ndjson"

// userName matches a Unix user name or a numeric uid.
var userName = regexp.MustCompile(`^(?:[a-z_][a-z0-9_.-]{0,31}\$?|[0-9]{1,10})$`)

// execRequest is the wire form of POST /v1/sandboxes/{id}/exec.
type execRequest struct {
	Command        string            `json:"command"`
	Argv           []string          `json:"argv"`
	Env            map[string]string `json:"env"`
	Cwd            string            `json:"cwd"`
	User           string            `json:"user"`
	TimeoutSeconds int               `json:"timeout_seconds"`
	Stdin          string            `json:"stdin"`
	Background     bool              `json:"background"`
}

// validate checks an exec request; errors are 400 invalid_argument.
func (in *execRequest) validate() error {
	switch {
	case in.Command == "" && len(in.Argv) == 0:
		return invalidf("give command or argv")
	case in.Command != "" && len(in.Argv) > 0:
		return invalidf("give command or argv, not both")
	case len(in.Argv) > 0 && in.Argv[0] == "":
		return invalidf("argv[0] must not be empty")
	}
	if strings.IndexByte(in.Command, 0) >= 0 {
		return invalidf("command contains a NUL byte")
	}
	for i, a := range in.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return invalidf("argv[%d] contains a NUL byte", i)
		}
	}
	if in.Cwd != "" && (!path.IsAbs(in.Cwd) || strings.IndexByte(in.Cwd, 0) >= 0) {
		return invalidf("cwd must be an absolute path")
	}
	if in.User != "" && !userName.MatchString(in.User) {
		return invalidf("user %q is not a valid user name", in.User)
	}
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxExecTimeoutSeconds {
		return invalidf("timeout_seconds must be 0..%d, not %d", maxExecTimeoutSeconds, in.TimeoutSeconds)
	}
	if err := sandbox.CheckEnv(in.Env); err != nil {
		return invalidf("%s", err)
	}
	return nil
}

// execResponse is the answer of a foreground exec.
type execResponse struct {
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMS int64  `json:"duration_ms"`
	Truncated  bool   `json:"truncated,omitempty"`
	// TimedOut says timeout_seconds killed the command (exit_code is -1).
	TimedOut bool `json:"timed_out,omitempty"`
}

func (s *server) exec(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var in execRequest
	if err := decodeJSON(w, r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := in.validate(); err != nil {
		s.writeError(w, r, err)
		return
	}
	req := agentclient.ExecRequest{
		Command:   in.Command,
		Argv:      in.Argv,
		Env:       in.Env,
		Cwd:       in.Cwd,
		User:      in.User,
		Timeout:   time.Duration(in.TimeoutSeconds) * time.Second,
		MaxOutput: int64(s.cfg.MaxExecOutput),
	}
	if in.Stdin != "" {
		req.Stdin = []byte(in.Stdin)
	}
	ac, err := s.mgr.Agent(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if in.Background {
		pid, err := ac.Background(r.Context(), req)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusAccepted, struct {
			PID uint32 `json:"pid"`
		}{pid})
		return
	}
	if accepts(r, ndjson) {
		s.execStream(w, r, ac, req)
		return
	}
	start := time.Now()
	res, err := ac.Exec(r.Context(), req, nil)
	s.metrics.ExecDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	dur := res.Duration
	if dur == 0 {
		dur = time.Since(start)
	}
	writeJSON(w, http.StatusOK, execResponse{
		ExitCode:   res.ExitCode,
		Stdout:     string(res.Stdout),
		Stderr:     string(res.Stderr),
		DurationMS: dur.Milliseconds(),
		Truncated:  res.Truncated,
		TimedOut:   res.TimedOut,
	})
}

// execStream runs an exec whose output streams as NDJSON: {"stdout": "..."}
// and {"stderr": "..."} lines as output arrives, then {"truncated": true} if
// the output was capped, then {"exit_code": N, "duration_ms": M} (with
// "timed_out": true when timeout_seconds killed the command). The status
// is sent with the first line; an error before it is an ordinary error
// answer, one after it a final {"error": {...}} line.
func (s *server) execStream(w http.ResponseWriter, r *http.Request, ac *agentclient.Client, req agentclient.ExecRequest) {
	st := &execStreamer{w: w, rc: http.NewResponseController(w), limit: s.cfg.MaxExecOutput}
	st.enc = json.NewEncoder(w)
	st.enc.SetEscapeHTML(false)

	start := time.Now()
	res, err := ac.Exec(r.Context(), req, st.output)
	s.metrics.ExecDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		if !st.started {
			s.writeError(w, r, err)
			return
		}
		he := classify(err)
		if he.status >= 500 {
			s.logInternal(r, "exec stream failed", err)
		}
		st.line(errorBody{Error: apiError{Code: he.code, Message: he.msg}})
		return
	}
	st.flushPending()
	if res.Truncated || st.truncated {
		st.line(map[string]bool{"truncated": true})
	}
	dur := res.Duration
	if dur == 0 {
		dur = time.Since(start)
	}
	st.line(struct {
		ExitCode   int   `json:"exit_code"`
		DurationMS int64 `json:"duration_ms"`
		TimedOut   bool  `json:"timed_out,omitempty"`
	}{res.ExitCode, dur.Milliseconds(), res.TimedOut})
}

// execStreamer writes streamed exec output as NDJSON.
type execStreamer struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	enc       *json.Encoder
	started   bool
	limit     int // bytes of output to pass on
	written   int
	truncated bool
	pending   map[string][]byte // incomplete UTF-8 sequences, by stream
	writeErr  error
}

// output receives a chunk of a stream ("stdout" or "stderr").
func (st *execStreamer) output(stream string, data []byte) error {
	if st.writeErr != nil {
		return st.writeErr
	}
	if stream != "stdout" && stream != "stderr" {
		return nil
	}
	if room := st.limit - st.written; len(data) > room {
		data = data[:max(room, 0)]
		st.truncated = true
	}
	st.written += len(data)
	text := st.complete(stream, data)
	if text == "" {
		return nil
	}
	st.line(map[string]string{stream: text})
	return st.writeErr
}

// complete returns the complete UTF-8 text of pending+data and keeps an
// incomplete trailing sequence for the next chunk, so that a character split
// across chunks is not turned into replacement characters. Invalid bytes
// pass through and are replaced by the JSON encoder.
func (st *execStreamer) complete(stream string, data []byte) string {
	if st.pending == nil {
		st.pending = map[string][]byte{}
	}
	b := append(st.pending[stream], data...)
	cut := len(b)
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				cut = i
			}
			break
		}
	}
	st.pending[stream] = append([]byte(nil), b[cut:]...)
	return string(b[:cut])
}

// flushPending writes what is left of incomplete sequences.
func (st *execStreamer) flushPending() {
	for _, stream := range []string{"stdout", "stderr"} {
		if p := st.pending[stream]; len(p) > 0 {
			st.line(map[string]string{stream: string(p)})
			st.pending[stream] = nil
		}
	}
}

// line writes one NDJSON line and flushes it.
func (st *execStreamer) line(v any) {
	if st.writeErr != nil {
		return
	}
	if !st.started {
		st.started = true
		h := st.w.Header()
		h.Set("Content-Type", ndjson)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		st.w.WriteHeader(http.StatusOK)
	}
	if err := st.enc.Encode(v); err != nil {
		st.writeErr = err
		return
	}
	if err := st.rc.Flush(); err != nil {
		st.writeErr = err
	}
}
