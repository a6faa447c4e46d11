// Package process is the agent's process service: Connect RPC handlers for
// envd's process.Process (Start, Connect, List, SendInput, StreamInput,
// CloseStdin, SendSignal, Update), wire-compatible with E2B's envd so the
// E2B data plane is a plain forward and the daemon's exec uses the same
// service.
//
// Semantics copied from envd: a process is not killed when the client that
// started it goes away; the Connect-Timeout-Ms request header (or our own
// X-Cubicle-Process-Timeout-Ms, which does not also cut the stream) is the
// process's time limit; the user comes from HTTP Basic auth. Children are
// started with syscall.ForkExec under the agent's single reaper (package
// reap), never waited for with os/exec. Only the agent server imports it.
package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	"github.com/cubicle-dev/cubicle/internal/agent/account"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	pb "github.com/cubicle-dev/cubicle/proto/process"
	"github.com/cubicle-dev/cubicle/proto/process/processconnect"
)

// Request headers the service reads.
const (
	// TimeoutHeader is the daemon's process time limit in milliseconds. It
	// wins over Connect-Timeout-Ms and, unlike it, leaves the stream alive
	// so the caller still receives the end event of a killed process.
	TimeoutHeader = "X-Cubicle-Process-Timeout-Ms"
	// ConnectTimeoutHeader is the Connect protocol deadline, which envd (and
	// so E2B's SDK) also uses as the process time limit.
	ConnectTimeoutHeader = "Connect-Timeout-Ms"
	// KeepaliveHeader is the keepalive interval in seconds.
	KeepaliveHeader = "Keepalive-Ping-Interval"
)

// defaultKeepalive is envd's keepalive interval when the header is absent.
const defaultKeepalive = 90 * time.Second

// Bounds of the header values, which come from clients: a keepalive of
// zero would panic the ticker, and values past these overflow a
// time.Duration into a negative one.
const (
	maxKeepalive = time.Hour
	maxTimeLimit = 365 * 24 * time.Hour
)

// Options configure a Service.
type Options struct {
	// Reaper delivers the exit statuses of the service's children. Required.
	Reaper *reap.Reaper
	// Env is the sandbox's default environment ("K=V"), applied to every
	// process after the user variables and before the request's own.
	Env []string
	// Display is the DISPLAY a process gets when Env has none.
	Display string
	// DefaultUser runs requests that name no user; "" means root.
	DefaultUser string
	// Logger receives start and exit lines; nil means slog.Default().
	Logger *slog.Logger
}

// Service implements processconnect.ProcessHandler. Its zero value is not
// usable; create it with New.
type Service struct {
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	procs map[int]*proc
	env   []string // opts.Env, then what SetEnv added
}

var _ processconnect.ProcessHandler = (*Service)(nil)

// New returns a process service.
func New(opts Options) *Service {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DefaultUser == "" {
		opts.DefaultUser = account.Root
	}
	return &Service{opts: opts, log: opts.Logger, procs: make(map[int]*proc), env: opts.Env}
}

// SetEnv adds env ("K=V", later ones win) to the default environment of
// the processes started from now on: the session of a warm-pool sandbox
// arrives after the agent started.
func (s *Service) SetEnv(env []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.env = append(slices.Clip(s.env), env...)
}

// Signal sends sig to the process group of every running process (used
// at shutdown).
func (s *Service) Signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		_ = p.signal(sig)
	}
}

// userOf resolves the request's user: Basic auth, else the default.
func (s *Service) userOf(h interface{ Get(string) string }) (*account.Account, error) {
	name, err := account.UserFromBasicAuth(h.Get("Authorization"))
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	if name == "" {
		name = s.opts.DefaultUser
	}
	a, err := account.Lookup(name)
	if err != nil {
		if errors.Is(err, account.ErrUnknownUser) {
			return nil, connect.NewError(connect.CodePermissionDenied, err)
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return a, nil
}

// timeLimit reads the process time limit: our header, then Connect's, then
// the request deadline. 0 means unlimited.
func timeLimit(ctx context.Context, h interface{ Get(string) string }) (time.Duration, error) {
	for _, name := range []string{TimeoutHeader, ConnectTimeoutHeader} {
		if v := h.Get(name); v != "" {
			ms, err := strconv.ParseInt(v, 10, 64)
			if err != nil || ms < 0 || ms > maxTimeLimit.Milliseconds() {
				return 0, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: invalid value %q (milliseconds, at most %d)", name, v, maxTimeLimit.Milliseconds()))
			}
			return time.Duration(ms) * time.Millisecond, nil
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Millisecond), nil
	}
	return 0, nil
}

func keepaliveOf(h interface{ Get(string) string }) time.Duration {
	if v := h.Get(KeepaliveHeader); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return time.Duration(min(n, int(maxKeepalive/time.Second))) * time.Second
		}
	}
	return defaultKeepalive
}

// Start starts a process and streams its events: start first, then data
// as it comes, then end. The process outlives the stream.
func (s *Service) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	acct, err := s.userOf(req.Header())
	if err != nil {
		return err
	}
	limit, err := timeLimit(ctx, req.Header())
	if err != nil {
		return err
	}
	sub := newSubscriber()
	p, err := s.spawn(ctx, req.Msg, acct, limit, sub)
	if err != nil {
		return err
	}
	return s.follow(ctx, p, sub, keepaliveOf(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

// Connect attaches to a running process by pid or tag and streams its
// further output and its end, after a start event naming its pid.
func (s *Service) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := newSubscriber()
	if !p.subscribe(sub) {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
	}
	return s.follow(ctx, p, sub, keepaliveOf(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// follow sends the start event and then everything sub receives, with
// keepalives, until the end event or until the client goes away.
func (s *Service) follow(ctx context.Context, p *proc, sub *subscriber, keepalive time.Duration, send func(*pb.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	start := &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}
	if err := send(start); err != nil {
		return err
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-sub.ch:
			if !ok {
				return nil
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-tick.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err() // connect maps it to canceled / deadline_exceeded
		}
	}
}

// forkTries bounds how long spawn retries a fork the kernel refused for
// want of a process slot (EAGAIN: the sandbox's pids limit, or a user's
// RLIMIT_NPROC), as shells do: a fork bomb's processes end and free slots
// all the time, and a command run to clean up after one should get one.
const (
	forkTries     = 100
	forkRetryWait = 100 * time.Millisecond
)

// spawn starts the process described by req as acct with sub already
// subscribed, so not a byte of output is missed.
func (s *Service) spawn(ctx context.Context, req *pb.StartRequest, acct *account.Account, limit time.Duration, sub *subscriber) (*proc, error) {
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty"))
	}
	withPTY := req.Pty != nil
	extra := map[string]string{}
	if withPTY {
		extra["TERM"] = "xterm-256color"
	}
	s.mu.Lock()
	defaults := s.env
	s.mu.Unlock()
	env := BuildEnv(acct, defaults, s.opts.Display, extra, cfg.GetEnvs())

	dir := acct.Home
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		dir = cfg.GetCwd()
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(acct.Home, dir)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %s: not a directory", dir))
		}
	} else if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/"
	}
	path, err := LookPath(cfg.GetCmd(), getenv(env, "PATH"), dir)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: %w", cfg.GetCmd(), err))
	}
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)

	p := &proc{config: cfg, tag: req.Tag, subs: map[*subscriber]struct{}{sub: {}}}
	sys := &syscall.SysProcAttr{Credential: acct.Credential()}
	var childFiles []*os.File // closed in the parent once the child has them
	defer func() {
		for _, f := range childFiles {
			_ = f.Close()
		}
	}()
	var fds []uintptr
	if withPTY {
		master, slave, err := pty.Open()
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("open pty: %w", err))
		}
		if size := req.GetPty().GetSize(); size != nil && size.Cols > 0 && size.Rows > 0 {
			_ = pty.Setsize(master, &pty.Winsize{Rows: uint16(size.Rows), Cols: uint16(size.Cols)})
		}
		childFiles = append(childFiles, slave)
		p.pty = master
		p.outputs = []*os.File{master}
		fds = []uintptr{slave.Fd(), slave.Fd(), slave.Fd()}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		// stdin is open unless the request says stdin=false (absent = true).
		if req.Stdin == nil || req.GetStdin() {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			childFiles = append(childFiles, r)
			p.stdin = w
		} else {
			null, err := os.Open(os.DevNull)
			if err != nil {
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			childFiles = append(childFiles, null)
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			_ = outR.Close()
			_ = outW.Close()
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		childFiles = append(childFiles, outW, errW)
		p.outputs = []*os.File{outR, errR}
		fds = []uintptr{childFiles[0].Fd(), outW.Fd(), errW.Fd()}
		sys.Setpgid = true
	}
	attr := &syscall.ProcAttr{Dir: dir, Env: env, Files: fds, Sys: sys}
	fork := func() (int, error) {
		pid, err := syscall.ForkExec(path, argv, attr)
		if sys.Credential != nil {
			account.KeepDumpable()
		}
		return pid, err
	}
	pid, status, err := s.opts.Reaper.Spawn(fork)
	for try := 1; errors.Is(err, syscall.EAGAIN) && try < forkTries && ctx.Err() == nil; try++ {
		select {
		case <-ctx.Done():
		case <-time.After(forkRetryWait):
			pid, status, err = s.opts.Reaper.Spawn(fork)
		}
	}
	if err != nil {
		p.closeAll()
		code := connect.CodeInternal
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission):
			code = connect.CodeInvalidArgument
		case errors.Is(err, syscall.EAGAIN):
			code = connect.CodeFailedPrecondition
			err = fmt.Errorf("the sandbox is at its process limit (%w)", err)
		}
		return nil, connect.NewError(code, fmt.Errorf("start %s: %w", cfg.GetCmd(), err))
	}
	p.pid = pid
	s.log.Info("process started", "pid", pid, "cmd", cfg.GetCmd(), "user", acct.Name, "tag", req.GetTag(), "limit", limit)

	s.mu.Lock()
	s.procs[pid] = p
	s.mu.Unlock()

	if withPTY {
		p.readers.Add(1)
		go p.read(p.pty, func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
		})
	} else {
		p.readers.Add(2)
		go p.read(p.outputs[0], func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
		})
		go p.read(p.outputs[1], func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
		})
	}
	go p.finish(status, limit, func() {
		s.mu.Lock()
		delete(s.procs, pid)
		s.mu.Unlock()
	})
	go func() {
		// Log the end without holding up anything else.
		sub := newSubscriber()
		if !p.subscribe(sub) {
			return
		}
		defer p.unsubscribe(sub)
		for ev := range sub.ch {
			if end := ev.GetEnd(); end != nil {
				s.log.Info("process ended", "pid", pid, "status", end.GetStatus())
			}
		}
	}()
	return p, nil
}

// closeAll closes the parent's ends after a failed start.
func (p *proc) closeAll() {
	for _, f := range p.outputs {
		_ = f.Close()
	}
	if p.stdin != nil {
		_ = p.stdin.Close()
	}
	if p.pty != nil {
		_ = p.pty.Close()
	}
}

func (s *Service) find(sel *pb.ProcessSelector) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := s.procs[int(v.Pid)]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range s.procs {
			if p.tag != nil && *p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is empty"))
	}
}

// List returns the running processes, ordered by pid.
func (s *Service) List(_ context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	out := make([]*pb.ProcessInfo, 0, len(s.procs))
	for _, p := range s.procs {
		out = append(out, p.info())
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return connect.NewResponse(&pb.ListResponse{Processes: out}), nil
}

// SendInput writes to the process's stdin or PTY.
func (s *Service) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := writeInput(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func writeInput(p *proc, in *pb.ProcessInput) error {
	var err error
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		if p.pty != nil {
			err = p.writePTY(v.Stdin)
		} else {
			err = p.writeStdin(v.Stdin)
		}
	case *pb.ProcessInput_Pty:
		err = p.writePTY(v.Pty)
	default:
		return nil
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errStdinClosed), errors.Is(err, errNoPTY):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	default:
		return connect.NewError(connect.CodeInternal, fmt.Errorf("write input: %w", err))
	}
}

// StreamInput reads a start event naming the process, then writes every
// data event's input to it.
func (s *Service) StreamInput(_ context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := s.find(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("data before start event"))
			}
			if err := writeInput(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// CloseStdin closes the process's stdin (sends ^D to a PTY).
func (s *Service) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to the process's group.
func (s *Service) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.signal(sig); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signal %d: %w", p.pid, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// Update resizes the process's PTY.
func (s *Service) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if err := p.resize(size); err != nil {
			if errors.Is(err, errNoPTY) {
				return nil, connect.NewError(connect.CodeFailedPrecondition, err)
			}
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}
