package session

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// listenEnv makes the test binary, run as a session program, a server
// that greets every connection on 127.0.0.1:$listenEnv: the stand-in for
// x11vnc (which this machine need not have).
const listenEnv = "CUBICLE_TEST_LISTEN"

func TestMain(m *testing.M) {
	if port := os.Getenv(listenEnv); port != "" {
		ln, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			os.Exit(3)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(4)
			}
			_, _ = io.WriteString(c, "hello\n")
			c.Close()
		}
	}
	os.Exit(m.Run())
}

// greets reports whether something on port answers with the helper's
// greeting.
func greets(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b := make([]byte, 6)
	_, err = io.ReadFull(c, b)
	return err == nil && string(b) == "hello\n"
}

// TestOnDemand: an on-demand program does not run until its port is
// acquired, runs while it is, stops its idle time after the last release,
// and starts again for the next user.
func TestOnDemand(t *testing.T) {
	needs.Xvfb(t)
	needs.Root(t)
	n := freeDisplay(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Display: ":" + strconv.Itoa(n),
		Xvfb:    []string{"Xvfb", "{display}", "-screen", "0", "640x480x24", "-nolisten", "tcp"},
		Programs: []Program{{Name: "vnc", Argv: []string{self}, Env: []string{listenEnv + "=" + strconv.Itoa(port)},
			OnDemand: &OnDemand{Port: port, IdleSeconds: 1}}},
	}.Expand(Vars{Width: 640, Height: 480, DPI: 96})
	r, err := reap.Start(reap.All, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	out, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	defer out.Close()
	s, err := New(cfg, Options{Reaper: r, Output: out, MinBackoff: 100 * time.Millisecond, Grace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer func() { _ = s.Stop(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Wait(ctx); err != nil {
		t.Fatalf("session not ready: %v", err)
	}

	time.Sleep(1500 * time.Millisecond)
	if pid := s.pidOf("vnc"); pid != 0 || greets(port) {
		t.Fatalf("with no user the on-demand program runs (pid %d)", pid)
	}
	if _, ok := s.Acquire(port + 1); ok {
		t.Errorf("Acquire of a port no program serves reported ok")
	}

	for round := 1; round <= 2; round++ {
		release, ok := s.Acquire(port)
		if !ok {
			t.Fatal("Acquire of the on-demand port: not ok")
		}
		eventually(t, "the program to start and listen", 10*time.Second, func() bool { return greets(port) })
		// It keeps running while in use, past its idle time.
		time.Sleep(2 * time.Second)
		if !greets(port) {
			t.Fatalf("round %d: the program stopped while in use", round)
		}
		pid := s.pidOf("vnc")
		release()
		release() // a second call of the same release changes nothing
		eventually(t, "the unused program to stop", 10*time.Second, func() bool { return s.pidOf("vnc") == 0 })
		if greets(port) {
			t.Fatalf("round %d: port still answers after the program (pid %d) stopped", round, pid)
		}
	}
}
