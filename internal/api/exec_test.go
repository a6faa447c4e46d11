package api

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestExec(t *testing.T) {
	e := newTestEnv(t, Config{})
	p := "/v1/sandboxes/" + runningID + "/exec"

	got := decode[execResponse](t, e.do("POST", p, strings.NewReader(`{"command":"echo hi"}`)), 200)
	if got.ExitCode != 0 || got.Stdout != "hi\n" || got.Stderr != "" || got.Truncated {
		t.Errorf("echo: %+v", got)
	}
	if cmd := e.agent.lastProc.GetProcess(); cmd.GetCmd() != "/bin/sh" || cmd.GetArgs()[1] != "echo hi" {
		t.Errorf("agent ran %v", cmd)
	}

	got = decode[execResponse](t, e.do("POST", p, strings.NewReader(`{"command":"fail"}`)), 200)
	if got.ExitCode != 3 || got.Stdout != "out\n" || got.Stderr != "bad\n" {
		t.Errorf("fail: %+v", got)
	}

	got = decode[execResponse](t, e.do("POST", p, strings.NewReader(`{"argv":["ls","-la","/"]}`)), 200)
	if got.Stdout != "ls -la /\n" {
		t.Errorf("argv: %+v", got)
	}

	got = decode[execResponse](t, e.do("POST", p, strings.NewReader(
		`{"command":"env","env":{"FOO":"bar"},"cwd":"/root","user":"root","timeout_seconds":5}`)), 200)
	if got.Stdout != "bar /root" {
		t.Errorf("env/cwd: %+v", got)
	}
	if want := "Basic " + base64.StdEncoding.EncodeToString([]byte("root:")); e.agent.lastUser != want {
		t.Errorf("user sent as %q, want %q", e.agent.lastUser, want)
	}

	got = decode[execResponse](t, e.do("POST", p, strings.NewReader(`{"command":"cat","stdin":"some input"}`)), 200)
	if got.Stdout != "some input" {
		t.Errorf("stdin: %+v", got)
	}

	// Invalid UTF-8 still makes valid JSON.
	w := e.do("POST", p, strings.NewReader(`{"command":"utf8"}`))
	if !json.Valid(w.Body.Bytes()) {
		t.Errorf("invalid JSON: %q", w.Body.String())
	}
	got = decode[execResponse](t, w, 200)
	if got.Stdout != "é€" || got.Stderr != "\uFFFD!" {
		t.Errorf("utf8: %+q %+q", got.Stdout, got.Stderr)
	}

	// An empty argv next to a command is no argv.
	if w := e.do("POST", p, strings.NewReader(`{"command":"echo hi","argv":[]}`)); w.Code != 200 {
		t.Errorf("command with empty argv: %d %s", w.Code, w.Body.String())
	}

	for _, body := range []string{
		`{}`,
		`{"command":"x","argv":["x"]}`,
		`{"argv":[]}`,
		`{"argv":[""]}`,
		`{"command":"x","cwd":"relative"}`,
		`{"command":"x","user":"root; rm -rf /"}`,
		`{"command":"x","timeout_seconds":-1}`,
		`{"command":"x","env":{"BAD-KEY":"v"}}`,
		`{"command":"a\u0000b"}`,
		`{"command":"x","shell":true}`,
		`{"command":1}`,
	} {
		wantError(t, e.do("POST", p, strings.NewReader(body)), 400, codeInvalid)
	}
}

func TestExecTruncated(t *testing.T) {
	e := newTestEnv(t, Config{MaxExecOutput: 25})
	got := decode[execResponse](t, e.do("POST", "/v1/sandboxes/"+runningID+"/exec", strings.NewReader(`{"command":"big"}`)), 200)
	if !got.Truncated || got.Stdout != strings.Repeat("x", 25) {
		t.Errorf("truncated: %+v", got)
	}
	w := e.do("POST", "/v1/sandboxes/"+runningID+"/exec", strings.NewReader(`{"command":"big"}`), "Accept", ndjson)
	lines := ndjsonLines(t, w.Body.String())
	out := ""
	for _, l := range lines[:len(lines)-2] {
		out += l["stdout"].(string)
	}
	if out != strings.Repeat("x", 25) {
		t.Errorf("streamed %q", out)
	}
	if d := cmp.Diff(map[string]any{"truncated": true}, lines[len(lines)-2]); d != "" {
		t.Errorf("truncated line (-want +got):\n%s", d)
	}
}

func ndjsonLines(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		t.Fatalf("no lines in %q", body)
	}
	return out
}

func TestExecStream(t *testing.T) {
	e := newTestEnv(t, Config{})
	p := "/v1/sandboxes/" + runningID + "/exec"

	w := e.do("POST", p, strings.NewReader(`{"command":"fail"}`), "Accept", "application/x-ndjson")
	if w.Code != 200 || w.Header().Get("Content-Type") != ndjson {
		t.Fatalf("status %d, Content-Type %q", w.Code, w.Header().Get("Content-Type"))
	}
	if !w.Flushed {
		t.Error("stream not flushed")
	}
	lines := ndjsonLines(t, w.Body.String())
	last := lines[len(lines)-1]
	if last["exit_code"] != 3.0 || last["duration_ms"] == nil {
		t.Errorf("last line %v", last)
	}
	if d := cmp.Diff([]map[string]any{{"stdout": "out\n"}, {"stderr": "bad\n"}}, lines[:len(lines)-1]); d != "" {
		t.Errorf("output lines (-want +got):\n%s", d)
	}

	// A character split across chunks arrives whole; invalid bytes are
	// replaced.
	w = e.do("POST", p, strings.NewReader(`{"command":"utf8"}`), "Accept", ndjson)
	var stdout, stderr string
	for _, l := range ndjsonLines(t, w.Body.String()) {
		if s, ok := l["stdout"].(string); ok {
			stdout += s
		}
		if s, ok := l["stderr"].(string); ok {
			stderr += s
		}
	}
	if stdout != "é€" || stderr != "\uFFFD!" {
		t.Errorf("stdout %+q stderr %+q", stdout, stderr)
	}

	// Errors before the stream starts are ordinary errors.
	wantError(t, e.do("POST", "/v1/sandboxes/"+stoppedID+"/exec", strings.NewReader(`{"command":"x"}`), "Accept", ndjson), 409, codeConflict)
}

func TestExecBackground(t *testing.T) {
	e := newTestEnv(t, Config{})
	w := e.do("POST", "/v1/sandboxes/"+runningID+"/exec", strings.NewReader(`{"command":"sleep","background":true}`))
	got := decode[map[string]uint32](t, w, http.StatusAccepted)
	if got["pid"] != 4242 {
		t.Errorf("pid %v", got)
	}
}

func TestExecStreamerComplete(t *testing.T) {
	st := &execStreamer{}
	var got []string
	for _, c := range []string{"a\xc3", "\xa9", "\xf0\x9f", "\x98", "\x80z", "\xff"} {
		got = append(got, st.complete("stdout", []byte(c)))
	}
	want := []string{"a", "é", "", "", "😀z", "\xff"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("chunks (-want +got):\n%s", d)
	}
}

func TestExecTimeout(t *testing.T) {
	e := newTestEnv(t, Config{})
	p := "/v1/sandboxes/" + runningID + "/exec"
	got := decode[execResponse](t, e.do("POST", p, strings.NewReader(`{"command":"hang","timeout_seconds":1}`)), 200)
	if !got.TimedOut || got.ExitCode != -1 || got.Stdout != "partial" {
		t.Errorf("timeout: %+v", got)
	}
	w := e.do("POST", p, strings.NewReader(`{"command":"hang","timeout_seconds":1}`), "Accept", ndjson)
	lines := ndjsonLines(t, w.Body.String())
	if last := lines[len(lines)-1]; last["timed_out"] != true || last["exit_code"] != -1.0 {
		t.Errorf("last line %v", last)
	}
}
