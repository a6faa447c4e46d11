package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

const logsJSON = `{"logs":[{"timestamp":"2030-01-01T11:59:50.5Z","level":"warn","source":"agent","message":"session: exited","fields":{"status":"exit status 1","program":"x11vnc"}},
{"timestamp":"2030-01-01T11:59:55Z","level":"info","source":"console","message":"hello"}]}`

func TestLogsCommand(t *testing.T) {
	var queries []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/v1/sandboxes/abc123/logs" {
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"code":"not_found","message":"sandbox not found"}}`)
			return
		}
		queries = append(queries, r.URL.Query())
		io.WriteString(w, logsJSON)
	}))
	defer srv.Close()
	d := &daemon{srv: srv}

	r, _ := runCLI(t, d, nil, "", "logs", "abc123")
	want := `2030-01-01T11:59:50.500Z agent    warn  session: exited program="x11vnc" status="exit status 1"` + "\n" +
		"2030-01-01T11:59:55.000Z console  info  hello\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("logs output:\n%s\nwant:\n%s%s", r.stdout, want, r.stderr)
	}
	if len(queries[0]) != 0 {
		t.Errorf("options sent without flags: %v", queries[0])
	}
	r, _ = runCLI(t, d, nil, "", "logs", "abc123", "-n", "5", "--since", "2m", "--level", "warn", "--search", "exit")
	if got := queries[1].Encode(); r.code != 0 || got != "level=warn&limit=5&search=exit&since=2030-01-01T11%3A58%3A00Z" {
		t.Errorf("flags sent %s (%+v)", got, r)
	}
	r, _ = runCLI(t, d, nil, "", "logs", "abc123", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"source": "console"`) {
		t.Errorf("--json: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "logs", "gone")
	if r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("unknown sandbox: %+v", r)
	}
	for _, args := range [][]string{{"logs"}, {"logs", "abc123", "--since", "-1m"}, {"logs", "abc123", "-f", "--json"}} {
		if r, _ = runCLI(t, d, nil, "", args...); r.code != 2 {
			t.Errorf("%v: code %d, want 2 (usage)", args, r.code)
		}
	}
}
