package agentclient

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// forwardProtocol must match agent.ForwardProtocol (the agent package is
// not imported here: it belongs to the guest side).
const forwardProtocol = "cubicle-forward"

// Forward opens a byte stream to port on the sandbox's loopback through the
// agent (GET /forward, upgraded). ctx bounds only the opening; the stream
// lives until the caller closes it or the sandbox goes away. A port nobody
// listens on is a *StatusError with Code 502.
func (c *Client) Forward(ctx context.Context, port int) (io.ReadWriteCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/forward?port="+strconv.Itoa(port), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", forwardProtocol)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("forward port %d: %w", port, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if err := statusError(resp); err != nil {
			return nil, err
		}
		return nil, &StatusError{Code: resp.StatusCode, Message: "agent did not switch protocols"}
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("forward port %d: upgraded body is not writable", port)
	}
	return rwc, nil
}

// DialPort is Forward as a net.Conn, for an http.Transport or a WebSocket
// dialer that speaks to a service on the sandbox's loopback (Chromium's
// DevTools). The stream has no deadlines: they are accepted and ignored, so
// callers bound their reads and writes with contexts or by closing it.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	rwc, err := c.Forward(ctx, port)
	if err != nil {
		return nil, err
	}
	return &forwardConn{ReadWriteCloser: rwc, port: port}, nil
}

// forwardConn is a forwarded stream dressed as a net.Conn.
type forwardConn struct {
	io.ReadWriteCloser
	port int
}

// forwardAddr names the far end of a forwarded stream.
type forwardAddr int

func (a forwardAddr) Network() string { return forwardProtocol }
func (a forwardAddr) String() string  { return "sandbox-loopback:" + strconv.Itoa(int(a)) }

func (c *forwardConn) LocalAddr() net.Addr              { return forwardAddr(0) }
func (c *forwardConn) RemoteAddr() net.Addr             { return forwardAddr(c.port) }
func (c *forwardConn) SetDeadline(time.Time) error      { return nil }
func (c *forwardConn) SetReadDeadline(time.Time) error  { return nil }
func (c *forwardConn) SetWriteDeadline(time.Time) error { return nil }
