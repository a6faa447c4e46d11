package api

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// logTime is the time of the fake's first log line.
var logTime = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// Logs answers lines of the running sandbox for the test key's owner:
// three lines, a second apart, selected as a ring would.
func (m *fakeManager) Logs(_ context.Context, id, owner string, q consolelog.Query) ([]sandbox.LogEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastLogs.id, m.lastLogs.owner, m.lastLogs.q = id, owner, q
	if m.err != nil {
		return nil, m.err
	}
	if _, ok := m.sandboxes[id]; !ok || owner != sandbox.KeyOwner(testKey) {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	r := consolelog.NewRing(consolelog.Options{})
	r.Write([]byte(`time=2025-01-02T03:04:05Z level=INFO msg="session: started" program=Xvfb`+"\n"+
		`time=2025-01-02T03:04:06Z level=ERROR msg="session: exited" program=x11vnc`+"\n"), logTime.Add(time.Hour), logTime)
	r.Write([]byte("hello from the console\n"), logTime.Add(2*time.Second), logTime.Add(2*time.Second))
	var out []sandbox.LogEntry
	for _, e := range r.Select(q) {
		out = append(out, sandbox.LogEntry{Timestamp: e.Time, Level: e.Level.String(), Source: e.Source, Message: e.Message, Fields: e.Fields})
	}
	return out, nil
}

func TestSandboxLogs(t *testing.T) {
	e := newTestEnv(t, Config{})
	base := "/v1/sandboxes/" + runningID + "/logs"
	for _, tt := range []struct {
		name, target string
		status       int
		code         string
		want         []string
	}{
		{"newest, oldest first", base, 200, "", []string{"session: started", "session: exited", "hello from the console"}},
		{"newest two", base + "?limit=2", 200, "", []string{"session: exited", "hello from the console"}},
		{"since is exclusive", base + "?since=" + url.QueryEscape("2025-01-02T03:04:05Z"), 200, "", []string{"session: exited", "hello from the console"}},
		{"since and limit", base + "?limit=1&since=" + url.QueryEscape("2025-01-02T03:04:04Z"), 200, "", []string{"session: started"}},
		{"level", base + "?level=WARN", 200, "", []string{"session: exited"}},
		{"search", base + "?search=console", 200, "", []string{"hello from the console"}},
		{"none", base + "?search=nothing", 200, "", []string{}},
		{"since not a time", base + "?since=yesterday", 400, codeInvalid, nil},
		{"limit 0", base + "?limit=0", 400, codeInvalid, nil},
		{"limit too big", base + "?limit=1001", 400, codeInvalid, nil},
		{"level unknown", base + "?level=loud", 400, codeInvalid, nil},
		{"search too long", base + "?search=" + strings.Repeat("x", consolelog.MaxLineBytes+1), 400, codeInvalid, nil},
		{"unknown", "/v1/sandboxes/nope/logs", 404, codeNotFound, nil},
		{"bad id", "/v1/sandboxes/a%20b/logs", 404, codeNotFound, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := e.do("GET", tt.target, nil)
			if tt.code != "" {
				wantError(t, w, tt.status, tt.code)
				return
			}
			got := decode[logsBody](t, w, tt.status)
			msgs := []string{}
			for _, l := range got.Logs {
				msgs = append(msgs, l.Message)
			}
			if diff := cmp.Diff(tt.want, msgs); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
		})
	}
	if e.mgr.touched != 0 || e.mgr.agentCalls != 0 {
		t.Errorf("reading logs counted as activity: %d touches, %d agent calls", e.mgr.touched, e.mgr.agentCalls)
	}

	// Another key: the manager is asked for that key's owner, and the
	// sandbox is not found.
	w := e.do("GET", base, nil, "X-API-Key", "other-key")
	wantError(t, w, 404, codeNotFound)
	if got, want := e.mgr.lastLogs.owner, sandbox.KeyOwner("other-key"); got != want {
		t.Errorf("owner asked for = %q, want %q", got, want)
	}

	// The wire form: API.md's style.
	w = e.do("GET", base+"?limit=1&since="+url.QueryEscape("2025-01-02T03:04:05Z"), nil)
	want := `{"logs":[{"timestamp":"2025-01-02T03:04:06Z","level":"error","source":"agent","message":"session: exited","fields":{"program":"x11vnc"}}]}`
	if got := strings.TrimSpace(w.Body.String()); got != want {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
}

// FuzzLogsQuery feeds the logs query parser anything: an answer or a 400.
func FuzzLogsQuery(f *testing.F) {
	for _, s := range []string{"", "since=2025-01-02T03:04:05Z&limit=5&level=warn&search=x", "limit=0", "since=%ff", "level=", "limit=99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest("GET", "/v1/sandboxes/x/logs", nil)
		r.URL.RawQuery = raw
		q, err := parseLogsQuery(r)
		if err != nil {
			if he, ok := err.(*httpError); !ok || he.status != 400 {
				t.Fatalf("%q: %v, want a 400", raw, err)
			}
			return
		}
		if q.Limit < 0 || q.Limit > consolelog.MaxLimit || len(q.Search) > consolelog.MaxLineBytes {
			t.Fatalf("%q: accepted %+v", raw, q)
		}
	})
}
