package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
)

// qmp is a connection to QEMU's QMP socket in command mode. QMP is one
// JSON object per line; commands are answered in order, with
// asynchronous events in between, which run skips.
type qmp struct {
	c net.Conn
	r *bufio.Reader
}

// dialQMP connects to sock and leaves capabilities negotiation behind.
// ctx's deadline bounds every command on the connection.
func dialQMP(ctx context.Context, sock string) (*qmp, error) {
	c, err := dialUnix(ctx, sock)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	q := &qmp{c: c, r: bufio.NewReader(c)}
	if _, err := q.r.ReadBytes('\n'); err != nil {
		c.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	if _, err := q.run("qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) Close() error { return q.c.Close() }

// run executes command with args (nil for none) and returns its answer.
func (q *qmp) run(command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	line, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := q.c.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			if command == "quit" && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)) {
				return nil, nil // QEMU may exit before answering
			}
			return nil, fmt.Errorf("qmp %s: %w", command, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
		}
		if json.Unmarshal(line, &resp) != nil {
			continue
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("qmp %s: %s", command, resp.Error.Desc)
		}
		if resp.Return != nil {
			return resp.Return, nil
		}
		// An event: keep reading.
	}
}

// qmpCommand runs one QMP command without arguments on the QMP socket.
func qmpCommand(ctx context.Context, sock, command string) error {
	q, err := dialQMP(ctx, sock)
	if err != nil {
		return err
	}
	defer q.Close()
	_, err = q.run(command, nil)
	return err
}

// isReset reports a connection QEMU closed as it exited.
func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
