package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/reap"
)

// TestHostListenerCheckpoint checks the agent's side of a gVisor
// checkpoint: PrepareCheckpoint is answered, and then nothing of the host
// socket is left in the agent (the listener is closed, and so is every
// connection, the one of a long request too); Reopen serves again on the
// same path, to a client with the token only.
func TestHostListenerCheckpoint(t *testing.T) {
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	srv, err := New(Options{Token: "tok", Reaper: r})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := ListenHost(sock, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	srv.OnCheckpoint(ln.Detach)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	defer func() {
		srv.Shutdown(context.Background())
		ln.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := client(sock, "tok")
	defer c.Close()
	health := func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/health", nil)
		resp, err := c.HTTP.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	if err := health(); err != nil {
		t.Fatal(err)
	}
	// A connection that stays open (a raw one, idle after its request).
	held, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := io.WriteString(held, "GET /health HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	if _, err := held.Read(buf); err != nil {
		t.Fatal(err)
	}

	if err := client(sock, "wrong").PrepareCheckpoint(ctx); err == nil {
		t.Fatal("PrepareCheckpoint with a wrong token succeeded")
	}
	if err := c.PrepareCheckpoint(ctx); err != nil {
		t.Fatal(err)
	}
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held.Read(buf); !errors.Is(err, io.EOF) {
		t.Errorf("a connection open at the checkpoint: read %v, want EOF (closed by the agent)", err)
	}
	c.Close()
	if err := health(); err == nil {
		// The listener is closed: a dial is refused (or, under gVisor,
		// never accepted), never served.
		t.Error("the agent served a request after PrepareCheckpoint")
	}
	if err := ln.Reopen(); err != nil {
		t.Fatal(err)
	}
	if err := ln.Reopen(); err != nil {
		t.Errorf("second Reopen: %v", err)
	}
	if err := health(); err != nil {
		t.Errorf("after Reopen: %v", err)
	}
	if err := c.PrepareCheckpoint(ctx); err != nil {
		t.Errorf("second PrepareCheckpoint: %v", err)
	}
	ln.Reopen()
	if err := health(); err != nil {
		t.Errorf("after the second Reopen: %v", err)
	}
}
