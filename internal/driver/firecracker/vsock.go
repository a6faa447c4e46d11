package firecracker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// handshakeTimeout bounds the CONNECT handshake when ctx has no deadline.
const handshakeTimeout = 10 * time.Second

// maxReplyLine is the longest handshake reply accepted: "OK 4294967295\n"
// is 14 bytes; anything much longer is not Firecracker.
const maxReplyLine = 32

// ErrVsockRefused is returned by DialVsock when Firecracker closed the
// connection instead of answering: nothing listens on that port in the
// guest (yet).
var ErrVsockRefused = errors.New("vsock connection refused: nothing listens on the guest port")

// DialVsock opens a stream to guest vsock port through Firecracker's hybrid
// vsock: it connects to the unix socket at path, writes "CONNECT <port>\n"
// and reads Firecracker's "OK <host port>\n" reply. It reads the reply one
// byte at a time so that not a byte of the guest's stream is consumed. The
// handshake is bounded by ctx's deadline (or handshakeTimeout); the
// returned conn has no deadline.
func DialVsock(ctx context.Context, path string, port uint32) (net.Conn, error) {
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("vsock %s: %w", path, err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(handshakeTimeout)
	}
	c.SetDeadline(deadline)
	// Unblock the handshake when ctx is cancelled before its deadline.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		c.Close()
		return nil, fmt.Errorf("vsock %s: write CONNECT: %w", path, err)
	}
	line, err := readLine(c, maxReplyLine)
	if err == nil {
		_, err = parseConnectReply(line)
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// Our deadline, or ctx's cancellation cutting the read short.
		err = fmt.Errorf("no reply: %w", context.DeadlineExceeded)
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("vsock %s port %d: %w", path, port, err)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// readLine reads up to and including the first '\n', one byte at a time,
// at most max bytes.
func readLine(r io.Reader, max int) ([]byte, error) {
	var line []byte
	var b [1]byte
	for len(line) < max {
		n, err := r.Read(b[:])
		if n == 1 {
			line = append(line, b[0])
			if b[0] == '\n' {
				return line, nil
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if len(line) == 0 {
					return nil, ErrVsockRefused
				}
				return nil, fmt.Errorf("connection closed after %q", line)
			}
			return nil, fmt.Errorf("read reply: %w", err)
		}
	}
	return nil, fmt.Errorf("reply longer than %d bytes: %q", max, line)
}

// parseConnectReply parses Firecracker's answer to CONNECT: exactly
// "OK <port>\n" with <port> a decimal uint32 (the host-side port Firecracker
// assigned). Anything else is an error quoting what came.
func parseConnectReply(line []byte) (uint32, error) {
	s, ok := strings.CutSuffix(string(line), "\n")
	if !ok {
		return 0, fmt.Errorf("reply %q is not a line", line)
	}
	num, ok := strings.CutPrefix(s, "OK ")
	if !ok || num == "" || strings.TrimLeft(num, "0123456789") != "" {
		return 0, fmt.Errorf("unexpected reply %q, want \"OK <port>\"", s)
	}
	p, err := strconv.ParseUint(num, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("unexpected reply %q: port: %w", s, err)
	}
	return uint32(p), nil
}
