package agentclient

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cubicle-dev/cubicle/proto/process"
)

// DefaultMaxOutput is how much output Exec keeps when ExecRequest.MaxOutput
// is 0: 10 MiB of stdout and stderr together.
const DefaultMaxOutput = 10 << 20

// processTimeoutHeader is the agent's process time limit header (see the
// agent's process package); unlike Connect-Timeout-Ms it leaves the stream
// open, so Exec still receives the end event of a killed process.
const processTimeoutHeader = "X-Cubicle-Process-Timeout-Ms"

// stdinChunk bounds one SendInput message.
const stdinChunk = 1 << 20

// ExecRequest describes a command to run in the sandbox.
type ExecRequest struct {
	// Argv is the program and its arguments. When empty, Command is run
	// with /bin/sh -c.
	Argv    []string
	Command string
	// Env is added to the sandbox's default environment.
	Env map[string]string
	// Cwd is the working directory; "" is the user's home.
	Cwd string
	// User runs the command; "" is the agent's default user (root).
	User string
	// Stdin is written to the command's stdin, which is then closed. When
	// empty the command's stdin is /dev/null.
	Stdin []byte
	// Timeout kills the command's process group after this long; 0 is
	// no limit.
	Timeout time.Duration
	// MaxOutput caps the stdout+stderr bytes Exec keeps (and hands to the
	// out callback); beyond it output is discarded, Truncated is set and
	// the command keeps running to completion. 0 means DefaultMaxOutput,
	// negative means no cap.
	MaxOutput int64
	// Tag names the process for the agent's Connect/List (Background).
	Tag string
}

// ExecResult is how a command ended.
type ExecResult struct {
	Pid uint32
	// ExitCode is the exit code, or -1 when a signal killed the command.
	ExitCode int
	// Status is the agent's description ("exit status 1", "signal: killed").
	Status string
	// TimedOut is set when the command was killed by Timeout.
	TimedOut bool
	// Stdout and Stderr are collected only when Exec's out is nil.
	Stdout, Stderr []byte
	// Truncated is set when output beyond MaxOutput was discarded.
	Truncated bool
	Duration  time.Duration
}

func (req *ExecRequest) start(stdin bool) (*connect.Request[pb.StartRequest], error) {
	argv := req.Argv
	if len(argv) == 0 {
		if req.Command == "" {
			return nil, errors.New("exec: neither argv nor command given")
		}
		argv = []string{"/bin/sh", "-c", req.Command}
	}
	cfg := &pb.ProcessConfig{Cmd: argv[0], Args: argv[1:], Envs: req.Env}
	if req.Cwd != "" {
		cfg.Cwd = &req.Cwd
	}
	sr := &pb.StartRequest{Process: cfg, Stdin: &stdin}
	if req.Tag != "" {
		sr.Tag = &req.Tag
	}
	r := connect.NewRequest(sr)
	if req.User != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(req.User+":")))
	}
	// Always sent, "0" meaning no limit: it overrides the Connect-Timeout-Ms
	// the Connect client derives from the caller's context deadline.
	ms := int64(0)
	if req.Timeout > 0 {
		ms = max(req.Timeout.Milliseconds(), 1)
	}
	r.Header().Set(processTimeoutHeader, strconv.FormatInt(ms, 10))
	r.Header().Set("Keepalive-Ping-Interval", "30")
	return r, nil
}

// sendStdin writes data to pid's stdin and closes it.
func (c *Client) sendStdin(ctx context.Context, pid uint32, data []byte) error {
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	for len(data) > 0 {
		n := min(len(data), stdinChunk)
		_, err := c.Process.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{
			Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: data[:n]}},
		}))
		if err != nil {
			return fmt.Errorf("send stdin: %w", err)
		}
		data = data[n:]
	}
	if _, err := c.Process.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		return fmt.Errorf("close stdin: %w", err)
	}
	return nil
}

// Exec runs a command to completion. Output is passed to out as it comes
// (stream is "stdout" or "stderr"); when out is nil it is collected into
// the result instead. An error from out stops Exec and kills the command.
// When ctx ends before the command, the command is killed too (a request
// that is gone wants no output); use Background for commands that outlive
// the call. A non-zero exit code is not an error.
func (c *Client) Exec(ctx context.Context, req ExecRequest, out func(stream string, data []byte) error) (ExecResult, error) {
	began := time.Now()
	sreq, err := req.start(len(req.Stdin) > 0)
	if err != nil {
		return ExecResult{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Process.Start(ctx, sreq)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	defer stream.Close()

	limit := req.MaxOutput
	if limit == 0 {
		limit = DefaultMaxOutput
	}
	var res ExecResult
	var kept int64
	stdinErr := make(chan error, 1)
	kill := func() {
		if res.Pid == 0 {
			return
		}
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer kcancel()
		_, _ = c.Process.SendSignal(kctx, connect.NewRequest(&pb.SendSignalRequest{
			Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: res.Pid}}, Signal: pb.Signal_SIGNAL_SIGKILL,
		}))
	}
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			res.Pid = ev.GetStart().GetPid()
			if len(req.Stdin) > 0 {
				go func() { stdinErr <- c.sendStdin(ctx, res.Pid, req.Stdin) }()
			}
		case ev.GetData() != nil:
			name, data := "stdout", ev.GetData().GetStdout()
			if data == nil {
				name, data = "stderr", ev.GetData().GetStderr()
			}
			if res.Truncated || len(data) == 0 {
				continue
			}
			if limit >= 0 && kept+int64(len(data)) > limit {
				data = data[:limit-kept]
				res.Truncated = true
			}
			kept += int64(len(data))
			if out != nil {
				if err := out(name, data); err != nil {
					kill()
					return res, err
				}
			} else if name == "stdout" {
				res.Stdout = append(res.Stdout, data...)
			} else {
				res.Stderr = append(res.Stderr, data...)
			}
		case ev.GetEnd() != nil:
			end := ev.GetEnd()
			res.ExitCode = int(end.GetExitCode())
			res.Status = end.GetStatus()
			res.Duration = time.Since(began)
			res.TimedOut = req.Timeout > 0 && !end.GetExited() && res.Duration >= req.Timeout
			if len(req.Stdin) > 0 {
				// Stdin delivery may fail harmlessly when the command exited
				// without reading it; only report it if nothing else ended.
				select {
				case <-stdinErr:
				default:
				}
			}
			return res, nil
		}
	}
	// The stream broke before the end event: the caller's context ended
	// (connect-go's own timer can fire just before ctx reports it, so ctx.Err
	// is no test) or the channel failed. Nobody will see the outcome, so
	// the command is killed rather than left running unattended.
	err = stream.Err()
	kill()
	if err == nil {
		err = errors.New("stream ended without an end event")
	}
	return res, fmt.Errorf("exec: %w", err)
}

// Background starts a command and returns its pid as soon as it runs. The
// command keeps running after Background returns (the agent never kills a
// process whose stream went away); its output is discarded. Stop it with
// Process.SendSignal.
func (c *Client) Background(ctx context.Context, req ExecRequest) (uint32, error) {
	sreq, err := req.start(len(req.Stdin) > 0)
	if err != nil {
		return 0, err
	}
	// The stream must not carry ctx's deadline: the agent would take it
	// as the process's time limit. ctx still aborts the wait.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel() // drops the stream, not the process
	stopWatch := context.AfterFunc(ctx, cancel)
	defer stopWatch()
	stream, err := c.Process.Start(sctx, sreq)
	if err != nil {
		return 0, fmt.Errorf("start: %w", err)
	}
	defer stream.Close()
	for stream.Receive() {
		if st := stream.Msg().GetEvent().GetStart(); st != nil {
			if len(req.Stdin) > 0 {
				if err := c.sendStdin(ctx, st.GetPid(), req.Stdin); err != nil {
					return st.GetPid(), err
				}
			}
			return st.GetPid(), nil
		}
	}
	if err := stream.Err(); err != nil {
		return 0, fmt.Errorf("start: %w", err)
	}
	return 0, errors.New("start: stream ended without a start event")
}
