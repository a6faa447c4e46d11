package security

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/e2b"
)

// e2bAnswers is what E2B's control plane answers, per POST route, to a body
// that is not what the route takes: 400 with E2B's error body (the SDK
// turns it into a SandboxError "400: <message>"). A POST route missing
// here fails the test: say what it answers.
var e2bAnswers = map[string]int{
	"POST /sandboxes":                 400,
	"POST /v2/sandboxes":              400,
	"POST /sandboxes/{id}/timeout":    400,
	"POST /sandboxes/{id}/connect":    400,
	"POST /v2/sandboxes/{id}/connect": 400,
	"POST /sandboxes/{id}/pause":      400,
	"POST /sandboxes/{id}/resume":     400,
	"POST /sandboxes/{id}/fork":       400,
	"POST /sandboxes/{id}/snapshots":  400,
}

// e2bWellFormedFor lists, per route, the bodies of e2bMalformedBodies
// that are well formed for it: pause takes only {"memory": bool} and
// ignores members it does not know, as E2B's API does, so an object of
// other members is a pause (which does change the sandboxes).
var e2bWellFormedFor = map[string][]string{
	"POST /sandboxes/{id}/pause": {"wrong types", "fractional timeout", "negative timeout", "timeout past int32"},
	// A snapshot takes only {"name": string}, the same way; the test's
	// sandboxes are gvisor's, which answers 501 and makes nothing.
	"POST /sandboxes/{id}/snapshots": {"wrong types", "fractional timeout", "negative timeout", "timeout past int32"},
}

// e2bMalformedBodies are bodies malformed for every POST route of E2B's
// control plane: not JSON, not an object, a timeout of the wrong type or
// out of int32's range, trailing data. (An empty body or {} is not among
// them: v2 connect takes those as its default timeout.)
func e2bMalformedBodies() map[string]string {
	return map[string]string{
		"not JSON":             "{nope",
		"truncated":            `{"templateID":"desktop","timeout":`,
		"trailing data":        `{"templateID":"desktop","timeout":60} {"timeout":70}`,
		"array":                `[1,2]`,
		"number":               `7`,
		"string":               `"desktop"`,
		"wrong types":          `{"templateID":7,"timeout":"60"}`,
		"fractional timeout":   `{"templateID":"desktop","timeout":1.5}`,
		"negative timeout":     `{"templateID":"desktop","timeout":-1}`,
		"timeout past int32":   `{"templateID":"desktop","timeout":4294967296}`,
		"invalid UTF-8":        "{\"templateID\":\"\xff\xfe\",\"timeout\":\"\xff\"}",
		"100000 nested arrays": `{"templateID":"desktop","timeout":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`,
		"12 MiB":               `{"templateID":"desktop","timeout":60,"metadata":{"a":"` + strings.Repeat("x", 12<<20) + `"}}`,
	}
}

// e2bState is what a malformed body must not change: the sandboxes (id and
// state) and when each of the two ends, as E2B's API reports them.
func (e *env) e2bState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, s := range e.inventory() {
		b.WriteString(s + "\n")
	}
	for _, id := range []string{e.sb.ID, e.other} {
		a := e.do("GET", "/sandboxes/"+id, "", "X-API-Key", e.key)
		var d struct {
			EndAt string `json:"endAt"`
		}
		if a.code != http.StatusOK || json.Unmarshal(a.body, &d) != nil || d.EndAt == "" {
			t.Fatalf("GET /sandboxes/%s: %d %.200s", id, a.code, a.body)
		}
		b.WriteString(id + " ends " + d.EndAt + "\n")
	}
	return b.String()
}

// e2bError checks an error answer has E2B's shape: a JSON object of code
// (the status), message (for the user) and nothing else but an optional
// error_code.
func e2bError(a answer) string {
	if ct := a.hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return "Content-Type " + ct
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(a.body, &body); err != nil {
		return "not a JSON object: " + err.Error()
	}
	var code int
	var msg string
	if json.Unmarshal(body["code"], &code) != nil || code != a.code {
		return "code is not the status"
	}
	if json.Unmarshal(body["message"], &msg) != nil || strings.TrimSpace(msg) == "" {
		return "no message"
	}
	for k := range body {
		if k != "code" && k != "message" && k != "error_code" {
			return "unexpected field " + k
		}
	}
	return ""
}

// e2bMalformed sends every malformed body to every POST route of E2B's
// control plane: each must get its route's answer (413 for the 12 MiB one
// where the route reads its body) in E2B's error shape, and change
// nothing. Then the data plane: Connect RPCs with malformed bodies get
// Connect's invalid_argument, which the SDK's connect-es client decodes,
// and start no process.
func e2bMalformed(t *testing.T, e *env, routes []e2b.Route, n tally) {
	before := e.e2bState(t)
	for _, rt := range routes {
		method, path := concrete(rt.Pattern, e.other)
		if method != "POST" {
			continue
		}
		want, ok := e2bAnswers[rt.Pattern]
		if !ok {
			t.Errorf("E2B route %s takes a body and has no expected answer in e2bAnswers", rt.Pattern)
			continue
		}
		for name, b := range e2bMalformedBodies() {
			if slices.Contains(e2bWellFormedFor[rt.Pattern], name) {
				continue
			}
			n["malformed or oversized E2B body"]++
			a := e.do(method, path, b, "X-API-Key", e.key)
			w := want
			if name == "12 MiB" && want == 400 {
				w = http.StatusRequestEntityTooLarge
			}
			if a.code != w {
				t.Errorf("E2B %s with a %s body: %d %.200s, want %d", rt.Pattern, name, a.code, a.body, w)
			} else if bad := e2bError(a); bad != "" {
				t.Errorf("E2B %s with a %s body: %d %.200s: not E2B's error body (%s)", rt.Pattern, name, a.code, a.body, bad)
			}
			if after := e.e2bState(t); after != before {
				t.Errorf("E2B %s with a %s body changed the sandboxes:\nbefore\n%safter\n%s", rt.Pattern, name, before, after)
				before = after
			}
		}
	}

	// The data plane.
	hdr := []string{"E2b-Sandbox-Id", e.other, "E2b-Sandbox-Port", "49983", "X-Access-Token", e.token, "Content-Type", "application/json"}
	procs := func() []string {
		a := e.doHost("", "POST", "/process.Process/List", "{}", hdr...)
		var l struct {
			Processes []struct {
				Pid int `json:"pid"`
			} `json:"processes"`
		}
		if a.code != http.StatusOK || json.Unmarshal(a.body, &l) != nil {
			t.Fatalf("process list: %d %.200s", a.code, a.body)
		}
		var out []string
		for _, p := range l.Processes {
			out = append(out, strconv.Itoa(p.Pid))
		}
		slices.Sort(out)
		return out
	}
	procsBefore := procs()
	// Start streams its answer (Connect's enveloped JSON, as the SDK sends
	// it): the error comes in the end-of-stream message.
	for _, body := range []string{"{nope", `{"process":{"cmd":7}}`, `{"process":{"cmd":"/bin/sh","args":"-c touch /tmp/malformed"}}`} {
		n["malformed E2B data-plane body"]++
		env := make([]byte, 5, 5+len(body))
		binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
		a := e.raw("POST", "/process.Process/Start", append(env, body...), append(slices.Clone(hdr[:len(hdr)-2]), "Content-Type", "application/connect+json")...)
		if code := connectStreamError(a.body); a.code != http.StatusOK || code != "invalid_argument" {
			t.Errorf("/process.Process/Start with %.60q: %d, end of stream %q (%.200q); want invalid_argument", body, a.code, code, a.body)
		}
	}
	for _, c := range []struct{ rpc, body string }{
		{"/process.Process/SendSignal", `{"process":{"pid":"one"},"signal":"SIGNAL_SIGKILL"}`},
		{"/filesystem.Filesystem/MakeDir", `{"path":["/tmp/malformed-dir"]}`},
		{"/filesystem.Filesystem/Remove", `[1]`},
		{"/filesystem.Filesystem/Move", `{"source":"/tmp/x","destination":{}}`},
		{"/filesystem.Filesystem/ListDir", `{"path":"/tmp","depth":"all"}`},
	} {
		n["malformed E2B data-plane body"]++
		a := e.doHost("", "POST", c.rpc, c.body, hdr...)
		var body struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if a.code != http.StatusBadRequest || json.Unmarshal(a.body, &body) != nil || body.Code != "invalid_argument" || body.Message == "" {
			t.Errorf("%s with %.60q: %d %.200s, want 400 {\"code\":\"invalid_argument\",\"message\":…}", c.rpc, c.body, a.code, a.body)
		}
	}
	if after := procs(); !slices.Equal(after, procsBefore) {
		t.Errorf("malformed Start requests changed the processes: %v, then %v", procsBefore, after)
	}
	for _, p := range []string{"/tmp/malformed", "/tmp/malformed-dir"} {
		if e.sh(t, e.other, "[ -e "+shQuote(p)+" ] && echo exists || true") != "" {
			t.Errorf("a malformed request made %s", p)
		}
	}
}

// connectStreamError returns the error code of a Connect streaming
// response's end-of-stream message, or "".
func connectStreamError(b []byte) string {
	for len(b) >= 5 {
		flags, n := b[0], int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 5+n {
			return ""
		}
		msg := b[5 : 5+n]
		b = b[5+n:]
		if flags&0x02 == 0 {
			continue
		}
		var end struct {
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(msg, &end) == nil && end.Error != nil {
			return end.Error.Code
		}
	}
	return ""
}
