package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// ExecRequest is a command to run in a sandbox. Set exactly one of Command
// (run by /bin/sh -c) and Argv (an exact argv). DISPLAY is set to the
// sandbox's display, so GUI programs work.
type ExecRequest struct {
	Command string            `json:"command,omitempty"`
	Argv    []string          `json:"argv,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	User    string            `json:"user,omitempty"`
	// TimeoutSeconds kills the command after this long (0: daemon default).
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// Stdin is fed to the command's standard input.
	Stdin string `json:"stdin,omitempty"`
	// Background is set by ExecBackground; Exec and ExecStream clear it.
	Background bool `json:"background,omitempty"`
}

// ExecResult is the outcome of a finished command.
type ExecResult struct {
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMS int64  `json:"duration_ms"`
	// Truncated is set when the output exceeded the daemon's cap and was
	// cut short.
	Truncated bool `json:"truncated,omitempty"`
	// TimedOut is set when ExecRequest.TimeoutSeconds killed the command
	// (ExitCode is then -1, as for a command killed otherwise).
	TimedOut bool `json:"timed_out,omitempty"`
}

// Exec runs a command to completion and returns its output and exit code.
// A non-zero exit code is not an error. Exec is never retried.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error) {
	if err := checkID(id); err != nil {
		return ExecResult{}, err
	}
	req.Background = false
	body, n, err := jsonBody(req)
	if err != nil {
		return ExecResult{}, err
	}
	var out ExecResult
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "exec"), body: body, contentLen: n, contentType: "application/json"}, &out)
	return out, err
}

// ExecBackground starts a command that keeps running after the call returns
// and returns its process id.
func (c *Client) ExecBackground(ctx context.Context, id string, req ExecRequest) (int, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	req.Background = true
	body, n, err := jsonBody(req)
	if err != nil {
		return 0, err
	}
	var out struct {
		PID int `json:"pid"`
	}
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "exec"), body: body, contentLen: n, contentType: "application/json"}, &out)
	return out.PID, err
}

// ExecEvent is one line of a streamed command's output: a chunk of stdout
// or stderr, or (last) the exit code.
type ExecEvent struct {
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
	// ExitCode is set on the final event only.
	ExitCode *int `json:"exit_code,omitempty"`
	// Truncated is set when the daemon stopped forwarding output at its cap.
	Truncated bool `json:"truncated,omitempty"`
	// TimedOut is set on the final event when the command's timeout killed
	// it.
	TimedOut bool `json:"timed_out,omitempty"`
}

// streamLine is the wire form of an NDJSON line, which may also carry an
// error that ended the stream after the 200 was sent.
type streamLine struct {
	ExecEvent
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// ErrStreamEnded is returned by ExecStream when the output stream ends
// without an exit code (the connection dropped or the daemon gave up).
var ErrStreamEnded = errors.New("client: exec stream ended without an exit code")

// ExecStream runs a command, calling fn with each piece of output as it
// arrives (application/x-ndjson), and returns the command's exit code. If
// fn returns an error the stream is abandoned and that error returned.
// WithTimeout does not apply; bound the call with ctx or
// req.TimeoutSeconds. ExecStream is never retried.
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest, fn func(ExecEvent) error) (int, error) {
	if err := checkID(id); err != nil {
		return -1, err
	}
	req.Background = false
	body, n, err := jsonBody(req)
	if err != nil {
		return -1, err
	}
	resp, err := c.send(ctx, &request{
		method: http.MethodPost, path: sandboxPath(id, "exec"), body: body, contentLen: n,
		contentType: "application/json", accept: "application/x-ndjson", noTimeout: true,
	})
	if err != nil {
		return -1, err
	}
	defer resp.Body.Close()
	return readExecStream(resp.Body, fn)
}

// readExecStream consumes NDJSON exec output from r.
func readExecStream(r io.Reader, fn func(ExecEvent) error) (int, error) {
	sc := bufio.NewScanner(r)
	// A line holds one output chunk, JSON-escaped; allow for big ones.
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var l streamLine
		if err := json.Unmarshal(line, &l); err != nil {
			return -1, fmt.Errorf("exec stream: bad line: %w", err)
		}
		if l.Error != nil {
			return -1, &APIError{Code: l.Error.Code, Message: l.Error.Message}
		}
		if fn != nil && (l.Stdout != "" || l.Stderr != "" || l.ExitCode != nil || l.Truncated) {
			if err := fn(l.ExecEvent); err != nil {
				return -1, err
			}
		}
		if l.ExitCode != nil {
			return *l.ExitCode, nil
		}
	}
	if err := sc.Err(); err != nil {
		return -1, fmt.Errorf("exec stream: %w", err)
	}
	return -1, ErrStreamEnded
}

// ExecStreamTo is ExecStream writing stdout and stderr chunks to the given
// writers (nil discards).
func (c *Client) ExecStreamTo(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	return c.ExecStream(ctx, id, req, func(e ExecEvent) error {
		if e.Stdout != "" && stdout != nil {
			if _, err := io.WriteString(stdout, e.Stdout); err != nil {
				return err
			}
		}
		if e.Stderr != "" && stderr != nil {
			if _, err := io.WriteString(stderr, e.Stderr); err != nil {
				return err
			}
		}
		return nil
	})
}
