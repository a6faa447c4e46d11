package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"
)

// logsBody is an answer of GET /v1/sandboxes/{id}/logs as the daemon
// writes it (internal/api's TestSandboxLogs checks that side).
const logsBody = `{"logs":[{"timestamp":"2025-01-02T03:04:06Z","level":"error","source":"agent","message":"session: exited","fields":{"program":"x11vnc"}},
{"timestamp":"2025-01-02T03:04:07.000000001Z","level":"info","source":"console","message":"hello"}]}`

func TestLogs(t *testing.T) {
	var got *url.URL
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(logsBody))
	}))
	defer srv.Close()
	c, _ := testClient(srv)
	since := time.Date(2025, 1, 2, 3, 4, 0, 500, time.UTC)
	logs, err := c.Logs(context.Background(), "sb1", LogsOptions{Since: since, Limit: 10, Level: "warn", Search: "a b"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Path != "/v1/sandboxes/sb1/logs" || got.Query().Encode() != "level=warn&limit=10&search=a+b&since=2025-01-02T03%3A04%3A00.0000005Z" {
		t.Errorf("request %s?%s", got.Path, got.RawQuery)
	}
	if len(logs) != 2 || logs[0].Fields["program"] != "x11vnc" || logs[1].Source != "console" ||
		!logs[1].Timestamp.Equal(time.Date(2025, 1, 2, 3, 4, 7, 1, time.UTC)) {
		t.Errorf("decoded %+v", logs)
	}
	if _, err := c.Logs(context.Background(), "sb1", LogsOptions{}); err != nil || got.RawQuery != "" {
		t.Errorf("zero options: %v, query %q", err, got.RawQuery)
	}
	if _, err := c.Logs(context.Background(), "", LogsOptions{}); err == nil {
		t.Error("an empty id was sent")
	}
}
