package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const metricsJSON = `{"sandbox_id":"abc123","backend":"gvisor","state":"running","interval_seconds":5,"window_seconds":600,
"latest":{"timestamp":"2030-01-01T11:59:55Z","cpu":{"used_seconds":61.5,"percent":48.7,"count":2},
 "memory":{"used_bytes":536870912,"cache_bytes":20971520,"limit_bytes":2147483648},
 "disk":{"used_bytes":12582912,"limit_bytes":4294967296},
 "network":{"rx_bytes":2048,"tx_bytes":1024,"rx_packets":20,"tx_packets":10}},
"samples":[{"timestamp":"2030-01-01T11:59:50Z","cpu":{"used_seconds":56.6,"percent":48.9,"count":2},
 "memory":{"used_bytes":536870912,"cache_bytes":0,"limit_bytes":2147483648},"disk":{"used_bytes":12582912,"limit_bytes":4294967296}}]}`

func TestMetricsCommand(t *testing.T) {
	var since []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/sandboxes/abc123/metrics":
			since = append(since, r.URL.Query().Get("since"))
			io.WriteString(w, metricsJSON)
		case "/v1/sandboxes/fresh/metrics":
			io.WriteString(w, `{"sandbox_id":"fresh","backend":"qemu","state":"running","interval_seconds":5,"window_seconds":600,"latest":null,"samples":[]}`)
		default:
			w.WriteHeader(409)
			io.WriteString(w, `{"error":{"code":"conflict","message":"sandbox gone is stopped; its figures went with it"}}`)
		}
	}))
	defer srv.Close()
	d := &daemon{srv: srv}
	fields := func(s string) string { return strings.Join(strings.Fields(s), " ") }

	r, _ := runCLI(t, d, nil, "", "metrics", "abc123")
	for _, want := range []string{
		"sandbox: abc123 (gvisor, running), sampled 5s ago",
		"cpu: 48.7% of 2 CPUs (0.97 cores), 61.5 s used",
		"memory: 512.0 MiB of 2.0 GiB (page cache 20.0 MiB)",
		"disk: 12.0 MiB of 4.0 GiB",
		"network: received 2.0 KiB (20 packets), sent 1.0 KiB (10 packets)",
	} {
		if r.code != 0 || !strings.Contains(fields(r.stdout), want) {
			t.Errorf("metrics output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if since[0] != "" {
		t.Errorf("since sent without --since: %q", since[0])
	}

	r, _ = runCLI(t, d, nil, "", "metrics", "abc123", "--since", "2m")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 || fields(lines[0]) != "TIME CPU MEMORY DISK RX TX" || !strings.Contains(fields(lines[1]), "48.9% 512.0 MiB 12.0 MiB - -") {
		t.Errorf("--since output:\n%s%s", r.stdout, r.stderr)
	}
	if since[1] != "2030-01-01T11:58:00Z" {
		t.Errorf("--since 2m sent since=%q, want two minutes before now", since[1])
	}

	r, _ = runCLI(t, d, nil, "", "metrics", "fresh")
	if r.code != 0 || !strings.Contains(r.stdout, "no sample yet; the first comes 5s after") {
		t.Errorf("no sample: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "metrics", "gone")
	if r.code != 1 || !strings.Contains(r.stderr, "its figures went with it (conflict)") {
		t.Errorf("stopped sandbox: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "metrics", "abc123", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"used_seconds": 61.5`) {
		t.Errorf("--json: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "metrics")
	if r.code != 2 {
		t.Errorf("without an ID: %+v", r)
	}
}
