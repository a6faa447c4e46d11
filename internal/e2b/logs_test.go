package e2b

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/apikey"
	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

func (f *fakeManager) Logs(ctx context.Context, id, owner string, q consolelog.Query) ([]sandbox.LogEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logQueries = append(f.logQueries, q)
	_, ok := f.sbs[id]
	if o, has := f.logOwners[id]; !ok || has && o != owner {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	out := []sandbox.LogEntry{}
	if r := f.logs[id]; r != nil {
		for _, e := range r.Select(q) {
			out = append(out, sandbox.LogEntry{Timestamp: e.Time, Level: e.Level.String(), Source: e.Source, Message: e.Message, Fields: e.Fields})
		}
	}
	return out, nil
}

// logLines is what the fake's sandboxes printed: one agent line a
// second from t0, then a program's line read at t0+5s.
var logLines = strings.Join([]string{
	`time=2026-08-01T12:00:00Z level=DEBUG msg="session: config"`,
	`time=2026-08-01T12:00:01Z level=INFO msg="session: started" program=Xvfb pid=12`,
	`time=2026-08-01T12:00:02Z level=WARN msg="session: exited" program=x11vnc status="exit status 1"`,
	`time=2026-08-01T12:00:03Z level=ERROR msg="session: cannot start program" program=chromium`,
	`hello from the console`,
	``,
}, "\n")

func newLogsServer(t *testing.T) (*Server, *fakeManager) {
	t.Helper()
	s, f := newTestServer(t, nil)
	f.add(running("sb1"))
	stopped := running("sbstopped")
	stopped.State = sandbox.StateStopped
	f.add(stopped)
	f.add(running("sbother"))
	f.logs = map[string]*consolelog.Ring{}
	for _, id := range []string{"sb1", "sbstopped", "sbother"} {
		r := consolelog.NewRing(consolelog.Options{})
		r.Write([]byte(logLines), t0.Add(5*time.Second), t0.Add(5*time.Second))
		f.logs[id] = r
	}
	f.logOwners = map[string]string{"sb1": sandbox.KeyOwner(testKey), "sbother": sandbox.KeyOwner("other-key")}
	return s, f
}

func TestLogsV2(t *testing.T) {
	ms := func(sec int) string { return millis(t0.Add(time.Duration(sec) * time.Second)) }
	for _, tt := range []struct {
		name, id, query string
		want            []string // messages answered
		status          int
		msg             string
	}{
		{name: "all", want: []string{"session: config", "session: started", "session: exited", "session: cannot start program", "hello from the console"}},
		{name: "limit", query: "?limit=2", want: []string{"session: config", "session: started"}},
		{name: "limit 0", query: "?limit=0", want: []string{}},
		{name: "cursor forward", query: "?cursor=" + ms(2), want: []string{"session: exited", "session: cannot start program", "hello from the console"}},
		{name: "backward", query: "?direction=backward&limit=2", want: []string{"hello from the console", "session: cannot start program"}},
		{name: "backward cursor takes its millisecond", query: "?direction=backward&cursor=" + ms(1), want: []string{"session: started", "session: config"}},
		{name: "level", query: "?level=warn", want: []string{"session: exited", "session: cannot start program"}},
		{name: "search", query: "?search=" + url.QueryEscape("start"), want: []string{"session: started", "session: cannot start program"}},
		{name: "search case-sensitive", query: "?search=Hello", want: []string{}},
		{name: "stopped keeps its logs", id: "sbstopped", want: []string{"session: config", "session: started", "session: exited", "session: cannot start program", "hello from the console"}},
		{name: "another key's sandbox", id: "sbother", status: 404, msg: "not found"},
		{name: "unknown", id: "nosuch", status: 404, msg: "not found"},
		{name: "bad id", id: "no%20such", status: 404, msg: "not found"},
		{name: "limit too big", query: "?limit=1001", status: 400, msg: "limit must be"},
		{name: "limit negative", query: "?limit=-1", status: 400, msg: "limit must be"},
		{name: "limit not a number", query: "?limit=ten", status: 400, msg: "limit must be"},
		{name: "cursor negative", query: "?cursor=-1", status: 400, msg: "cursor must be"},
		{name: "cursor not a number", query: "?cursor=now", status: 400, msg: "cursor must be"},
		{name: "cursor past year 9999", query: "?cursor=999999999999999", status: 400, msg: "cursor must be"},
		{name: "direction", query: "?direction=sideways", status: 400, msg: "direction must be"},
		{name: "level unknown", query: "?level=fatal", status: 400, msg: "level must be"},
		{name: "level in capitals", query: "?level=WARN", status: 400, msg: "level must be"},
		{name: "search too long", query: "?search=" + strings.Repeat("x", maxSearchBytes+1), status: 400, msg: "search is longer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newLogsServer(t)
			id := tt.id
			if id == "" {
				id = "sb1"
			}
			rec := do(t, s, "GET", "/v2/sandboxes/"+id+"/logs"+tt.query, "", nil)
			if tt.status != 0 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.msg)
				if tt.status == 400 && len(f.logQueries) != 0 {
					t.Errorf("a bad query reached the manager: %+v", f.logQueries)
				}
				return
			}
			if rec.Code != 200 {
				t.Fatalf("status %d (body %s)", rec.Code, rec.Body)
			}
			var got logsV2Body
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("%v: %s", err, rec.Body)
			}
			msgs := []string{}
			for _, e := range got.Logs {
				msgs = append(msgs, e.Message)
			}
			if diff := cmp.Diff(tt.want, msgs); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
		})
	}
}

// millis is t as a logs cursor: Unix milliseconds.
func millis(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

func TestLogsWire(t *testing.T) {
	s, _ := newLogsServer(t)
	rec := do(t, s, "GET", "/v2/sandboxes/sb1/logs?limit=2&cursor="+millis(t0.Add(time.Second)), "", nil)
	want := `{"logs":[{"timestamp":"2026-08-01T12:00:01Z","level":"info","message":"session: started","fields":{"pid":"12","program":"Xvfb"}},` +
		`{"timestamp":"2026-08-01T12:00:02Z","level":"warn","message":"session: exited","fields":{"program":"x11vnc","status":"exit status 1"}}]}`
	if got := rec.Body.String(); got != want+"\n" {
		t.Errorf("v2 body\n got %s\nwant %s", got, want)
	}
	// The deprecated endpoint: each line twice, plain and structured;
	// a line without fields has {} (required by E2B's schema).
	rec = do(t, s, "GET", "/sandboxes/sb1/logs?start="+millis(t0.Add(3*time.Second)), "", nil)
	want = `{"logs":[{"timestamp":"2026-08-01T12:00:03Z","line":"session: cannot start program"},{"timestamp":"2026-08-01T12:00:05Z","line":"hello from the console"}],` +
		`"logEntries":[{"timestamp":"2026-08-01T12:00:03Z","level":"error","message":"session: cannot start program","fields":{"program":"chromium"}},` +
		`{"timestamp":"2026-08-01T12:00:05Z","level":"info","message":"hello from the console","fields":{}}]}`
	if got := rec.Body.String(); got != want+"\n" {
		t.Errorf("v1 body\n got %s\nwant %s", got, want)
	}
	for _, q := range []string{"?limit=x", "?start=-3"} {
		rec = do(t, s, "GET", "/sandboxes/sb1/logs"+q, "", nil)
		checkError(t, rec.Code, rec.Body.Bytes(), 400, "must be")
	}
	// Without the key: 401 in E2B's shape, before anything else.
	rec = do(t, s, "GET", "/v2/sandboxes/sb1/logs?limit=bad", "", map[string]string{"X-API-KEY": "e2b_bad"})
	checkError(t, rec.Code, rec.Body.Bytes(), 401, apikey.Refused)
}

// FuzzLogsQuery feeds the logs endpoints' query parsers anything: they
// answer a query or a 400, and a query they accept asks for at most
// consolelog.MaxLimit lines.
func FuzzLogsQuery(f *testing.F) {
	for _, s := range []string{"", "cursor=1&limit=10&direction=backward&level=warn&search=x", "limit=1001",
		"cursor=-1", "direction=%ff", "level=INFO", "search=%00", "start=99999999999999999999", "limit=0&limit=5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		for _, parse := range []func(url.Values) (logsQuery, error){parseLogsV2Query, parseLogsV1Query} {
			lq, err := parse(v)
			if err != nil {
				if status, _ := classify(err); status != 400 {
					t.Fatalf("%q: status %d, want 400", raw, status)
				}
				continue
			}
			if lq.limit < 0 || lq.limit > consolelog.MaxLimit || lq.q.Limit != lq.limit {
				t.Fatalf("%q: limit %d (query %d)", raw, lq.limit, lq.q.Limit)
			}
			if _, err := json.Marshal(lq.q.Cursor); err != nil {
				t.Fatalf("%q: cursor %v cannot be answered: %v", raw, lq.q.Cursor, err)
			}
		}
	})
}
