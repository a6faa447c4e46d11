package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

// TestMCPStdio speaks MCP to `cubicle mcp` over its standard streams, as
// a desktop client does, and checks that a tool call reaches the daemon
// with the key of the environment.
func TestMCPStdio(t *testing.T) {
	d := newDaemon(t)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	env := map[string]string{"CUBICLE_URL": d.srv.URL, "CUBICLE_API_KEY": "k3y"}
	a := newApp(inR, outW, io.Discard, func(k string) string { return env[k] })
	done := make(chan int, 1)
	go func() { done <- run(context.Background(), a, []string{"mcp"}); outW.Close() }()

	lines := bufio.NewScanner(outR)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	send := func(msg string) {
		if _, err := io.WriteString(inW, msg+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(id int) map[string]any {
		t.Helper()
		for lines.Scan() {
			var m map[string]any
			if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
				t.Fatalf("not JSON on stdout: %q", lines.Text())
			}
			if m["id"] == float64(id) {
				return m
			}
		}
		t.Fatalf("no answer to %d: %v", id, lines.Err())
		return nil
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if m := answer(1); m["result"] == nil {
		t.Fatalf("initialize: %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if b, _ := json.Marshal(answer(2)); !strings.Contains(string(b), `"name":"left_click"`) || !strings.Contains(string(b), `"name":"create_sandbox"`) {
		t.Errorf("tools/list: %.300s", b)
	}
	send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"list_sandboxes","arguments":{}}}`)
	if b, _ := json.Marshal(answer(3)); !strings.Contains(string(b), `abc123`) {
		t.Errorf("list_sandboxes: %.300s", b)
	}
	if got := d.last(t); got.Method != "GET" || got.Path != "/v1/sandboxes" || got.Key != "k3y" {
		t.Errorf("the daemon saw %s %s key %q", got.Method, got.Path, got.Key)
	}
	inW.Close()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("cubicle mcp exited %d at the end of its input", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cubicle mcp did not exit at the end of its input")
	}
}
