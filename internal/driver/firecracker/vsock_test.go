package firecracker

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// peer listens on a unix socket and runs serve for every connection: a
// fake of Firecracker's side of the hybrid vsock.
func peer(t *testing.T, serve func(c net.Conn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return path
}

func TestDialVsock(t *testing.T) {
	var got string
	path := peer(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		got, _ = br.ReadString('\n')
		// The reply and the first guest bytes arrive in one write: none of
		// the guest's bytes may be lost to the handshake.
		io.WriteString(c, "OK 1073741824\nhello from the guest")
	})
	c, err := DialVsock(context.Background(), path, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data, err := io.ReadAll(c)
	if err != nil || string(data) != "hello from the guest" {
		t.Errorf("stream after handshake: %q, %v", data, err)
	}
	if got != "CONNECT 1024\n" {
		t.Errorf("sent %q, want CONNECT 1024", got)
	}
}

func TestDialVsockErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply string // "" closes without a word
		hang  bool
		want  string
	}{
		{"refused", "", false, "nothing listens"},
		{"error reply", "ERR no such port\n", false, `unexpected reply "ERR no such port"`},
		{"bad port", "OK 99999999999\n", false, "port"},
		{"no port", "OK \n", false, "unexpected reply"},
		{"partial", "OK 12", false, "connection closed after"},
		{"long", strings.Repeat("O", 100), false, "longer than"},
		{"timeout", "", true, "deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := peer(t, func(c net.Conn) {
				bufio.NewReader(c).ReadString('\n')
				if tc.hang {
					time.Sleep(500 * time.Millisecond)
				} else {
					io.WriteString(c, tc.reply)
				}
				c.Close()
			})
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			c, err := DialVsock(ctx, path, 1024)
			if err == nil {
				c.Close()
				t.Fatal("DialVsock succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to mention %q", err, tc.want)
			}
			if tc.name == "refused" && !errors.Is(err, ErrVsockRefused) {
				t.Errorf("error %v is not ErrVsockRefused", err)
			}
		})
	}
}

func TestDialVsockCancel(t *testing.T) {
	path := peer(t, func(c net.Conn) {
		time.Sleep(time.Second)
		c.Close()
	})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	if _, err := DialVsock(ctx, path, 1024); !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 800*time.Millisecond {
		t.Errorf("cancel took %v", d)
	}
}

func TestParseConnectReply(t *testing.T) {
	for in, want := range map[string]uint32{"OK 0\n": 0, "OK 1073741824\n": 1073741824, "OK 4294967295\n": 4294967295} {
		if got, err := parseConnectReply([]byte(in)); err != nil || got != want {
			t.Errorf("parseConnectReply(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "OK 1", "OK  1\n", "OK +1\n", "OK -1\n", "ok 1\n", "OK 4294967296\n", "OK 1 \n", "OK 1\r\n", "OK 0x10\n"} {
		if _, err := parseConnectReply([]byte(in)); err == nil {
			t.Errorf("parseConnectReply(%q) accepted", in)
		}
	}
}

// FuzzParseConnectReply: the reply comes from Firecracker, whose vsock
// device a guest drives; no input may panic, and whatever is accepted is
// exactly "OK <decimal port>\n".
func FuzzParseConnectReply(f *testing.F) {
	for _, s := range []string{"OK 1073741824\n", "OK 0\n", "ERR\n", "OK 4294967296\n", "OK \n", "\n", "OK 1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		port, err := parseConnectReply(line)
		if err != nil {
			return
		}
		s := string(line)
		if !strings.HasPrefix(s, "OK ") || !strings.HasSuffix(s, "\n") {
			t.Fatalf("accepted %q", line)
		}
		if back := "OK " + itoa(port) + "\n"; strings.TrimLeft(s[3:], "0") != strings.TrimLeft(back[3:], "0") {
			t.Fatalf("accepted %q as port %d", line, port)
		}
	})
}

// FuzzReadLine: the handshake reader never reads past the first newline
// nor more than its limit.
func FuzzReadLine(f *testing.F) {
	f.Add([]byte("OK 5\nrest"))
	f.Add([]byte(strings.Repeat("x", 40)))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := strings.NewReader(string(data))
		line, err := readLine(r, maxReplyLine)
		consumed := len(data) - r.Len()
		if err == nil {
			if len(line) == 0 || line[len(line)-1] != '\n' || strings.Count(string(line), "\n") != 1 || consumed != len(line) {
				t.Fatalf("line %q, consumed %d of %q", line, consumed, data)
			}
		}
		if consumed > maxReplyLine {
			t.Fatalf("consumed %d bytes", consumed)
		}
	})
}
