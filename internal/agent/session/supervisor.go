// Package session starts and supervises the sandbox's desktop session from
// the image's /etc/cubicle/session.json: the Xvfb X server, then each
// program (window manager, browser, VNC server) as its configured user.
// Programs that exit are restarted with backoff; if Xvfb dies it is
// restarted and the agent's X connection re-established. An on-demand
// program (x11vnc) runs only while a connection uses its port (Acquire). The session is
// ready when the first screenshot succeeds. Only cmd/cubicle-agent imports
// it.
package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/account"
	"github.com/cubicle-dev/cubicle/internal/agent/desktop"
	"github.com/cubicle-dev/cubicle/internal/agent/process"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
)

// Options configure a Supervisor.
type Options struct {
	// Reaper owns child exit statuses. Required.
	Reaper *reap.Reaper
	// Desktop receives the X connection; may be nil.
	Desktop Sink
	// Env is the sandbox's default environment, given to every program.
	Env []string
	// Output receives the programs' stdout and stderr (default os.Stderr).
	Output *os.File
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Grace is how long Stop waits after SIGTERM before SIGKILL (default 5s).
	Grace time.Duration
	// MinBackoff and MaxBackoff bound the restart delay (default 500ms, 30s).
	// A program that ran longer than StableAfter (default 10s) restarts
	// after MinBackoff again.
	MinBackoff, MaxBackoff, StableAfter time.Duration
	// StartTimeout bounds how long Xvfb may take to accept connections
	// before it is killed and started again (default 30s).
	StartTimeout time.Duration
	// DevTools turns on Chromium's DevTools on the sandbox's loopback
	// (DevToolsPort), for cubicled's CDP endpoint.
	DevTools bool
	// ChromiumFlagsDir is where the image's Chromium launcher reads extra
	// flags (default ChromiumFlagsDir); with DevTools, New writes the
	// DevTools flag there when the directory exists.
	ChromiumFlagsDir string
}

// Supervisor runs one desktop session. Create it with New, then Start it.
type Supervisor struct {
	cfg  Config
	opts Options
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // runX and every runProgram
	progs  sync.WaitGroup // every runProgram

	ready     chan struct{}
	readyOnce sync.Once

	mu       sync.Mutex
	err      error
	up       chan struct{} // closed while the display is up; replaced when it goes down
	children map[int]string
	desk     *desktop.Desktop // the display's connection while it is up
	stopOnce sync.Once
	// xvfb is the X server's argv, geomEnv the CUBICLE_WIDTH, _HEIGHT and
	// _DPI a Resize gave every program started since, and restartNow
	// makes runX start the X server a Resize stopped without a backoff.
	xvfb       []string
	geomEnv    []string
	restartNow bool
	// demands holds the on-demand programs by the port they serve.
	demands map[int]*demand
}

// New returns a supervisor of cfg, which must be expanded (Config.Expand).
func New(cfg Config, opts Options) (*Supervisor, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if opts.Reaper == nil {
		return nil, errors.New("session: no reaper")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Output == nil {
		opts.Output = os.Stderr
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.Grace, 5*time.Second)
	def(&opts.MinBackoff, 500*time.Millisecond)
	def(&opts.MaxBackoff, 30*time.Second)
	def(&opts.StableAfter, 10*time.Second)
	def(&opts.StartTimeout, 30*time.Second)
	if opts.ChromiumFlagsDir == "" {
		opts.ChromiumFlagsDir = ChromiumFlagsDir
	}
	// With DevTools, Chromium serves it on the sandbox's loopback: flags
	// for a Chromium the session runs itself, a flags file for the
	// launcher.
	if opts.DevTools {
		cfg.Programs = devToolsPrograms(cfg.Programs)
		if err := writeDevToolsFlags(opts.ChromiumFlagsDir); err != nil {
			opts.Logger.Warn("chromium devtools disabled", "err", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Supervisor{
		cfg: cfg, opts: opts, log: opts.Logger.With("component", "session"),
		ctx: ctx, cancel: cancel,
		ready: make(chan struct{}), up: make(chan struct{}), children: map[int]string{},
		xvfb: slices.Clone(cfg.Xvfb), demands: map[int]*demand{},
	}
	s.addDemands(cfg.Programs)
	return s, nil
}

// addDemands registers progs' on-demand programs; the caller holds s.mu
// or has not shared s yet.
func (s *Supervisor) addDemands(progs []Program) {
	for _, p := range progs {
		if p.OnDemand != nil {
			s.demands[p.OnDemand.Port] = newDemand(p.OnDemand)
		}
	}
}

// Start starts Xvfb and the programs in the background and returns at
// once; watch Ready for the outcome.
func (s *Supervisor) Start() {
	s.wg.Add(1 + len(s.cfg.Programs))
	s.progs.Add(len(s.cfg.Programs))
	go s.runX()
	for _, p := range s.cfg.Programs {
		go s.runProgram(p)
	}
}

// Add starts more programs (expanded, as New's config) in the running
// session: the programs a warm-pool sandbox holds until its create's start
// URL and environment are known. It fails once the session is stopping.
func (s *Supervisor) Add(progs []Program) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return errors.New("session: stopping")
	}
	for i, p := range progs {
		if p.Name == "" || len(p.Argv) == 0 || p.Argv[0] == "" {
			return fmt.Errorf("session: added program %d has no name or argv", i)
		}
		if p.OnDemand != nil && s.demands[p.OnDemand.Port] != nil {
			return fmt.Errorf("session: added program %q: port %d already has an on-demand program", p.Name, p.OnDemand.Port)
		}
	}
	s.addDemands(progs)
	if s.opts.DevTools {
		progs = devToolsPrograms(progs)
	}
	s.wg.Add(len(progs))
	s.progs.Add(len(progs))
	for _, p := range progs {
		go s.runProgram(p)
	}
	return nil
}

// Ready is closed once the first screenshot has succeeded.
func (s *Supervisor) Ready() <-chan struct{} { return s.ready }

// Err is the last error of the session (e.g. why Xvfb did not come up),
// or nil.
func (s *Supervisor) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Wait waits until the session is ready or ctx ends; then it returns the
// session's last error as well as ctx's.
func (s *Supervisor) Wait(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return errors.Join(ctx.Err(), s.Err())
	}
}

func (s *Supervisor) setErr(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// displayUp returns a channel that is closed while the display is up.
func (s *Supervisor) displayUp() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up
}

// Stop terminates the programs, then Xvfb. Each program's own process
// gets SIGTERM first, not its process group: a browser shuts down its
// helper processes itself, and its network process holds the cookies it
// has not written yet, which a signal to the whole group would lose.
// Once the programs have exited, or after the grace period, whatever is
// left in their process groups is killed. The display goes last because
// a program that loses it while it shuts down dies on the spot: Chromium
// then neither writes its cookies nor releases its profile lock, and the
// next sandbox with the same profile volume finds itself logged out. Xvfb
// gets SIGTERM, and SIGKILL after the grace period. Stop returns when all
// have exited or ctx ends, and is safe to call more than once.
func (s *Supervisor) Stop(ctx context.Context) error {
	var groups []int
	s.stopOnce.Do(func() {
		s.mu.Lock() // Add checks for the cancel under it
		s.cancel()
		s.mu.Unlock()
		s.closeWindows(ctx)
		groups = s.signal(syscall.SIGTERM, false, false)
	})
	deadline := time.Now().Add(s.opts.Grace)
	ok := s.waitStopped(ctx, &s.progs, func() { s.signal(syscall.SIGKILL, false, true) })
	// A program's helpers may outlive it a little: Chromium's network
	// process finishes writing the cookie database after the browser
	// process has exited. They get until the grace period is over.
	for _, g := range groups {
		for syscall.Kill(-g, 0) == nil && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		_ = syscall.Kill(-g, syscall.SIGKILL)
	}
	if !ok {
		return ctx.Err()
	}
	s.signal(syscall.SIGTERM, true, true)
	if !s.waitStopped(ctx, &s.wg, func() { s.signal(syscall.SIGKILL, true, true) }) {
		return ctx.Err()
	}
	return nil
}

// closeWindows asks the applications' windows to close, as a desktop's
// logout does, and waits (up to the grace period) for the processes that
// own them to exit. Chromium closed this way writes its cookies and
// releases its profile lock; on SIGTERM it exits at once and loses the
// cookies it had not written yet (up to 30 s of them), so a profile
// volume would lose a login made just before the sandbox stopped.
func (s *Supervisor) closeWindows(ctx context.Context) {
	s.mu.Lock()
	d := s.desk
	s.mu.Unlock()
	if d == nil {
		return
	}
	pids, err := d.CloseWindows(ctx)
	if err != nil {
		s.log.Warn("session: close windows", "err", err)
	}
	deadline := time.Now().Add(s.opts.Grace)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if len(pids) > 0 {
		s.log.Info("session: windows closed", "processes", len(pids))
	}
}

// waitStopped waits for wg, calling kill once the grace period or ctx is
// over; it reports false if ctx ended first.
func (s *Supervisor) waitStopped(ctx context.Context, wg *sync.WaitGroup, kill func()) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	grace := time.NewTimer(s.opts.Grace)
	defer grace.Stop()
	select {
	case <-done:
		return true
	case <-grace.C:
		s.log.Warn("session: still running after the grace period; killing")
		kill()
	case <-ctx.Done():
		kill()
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// signal sends sig to every program (and to Xvfb too with x): to its
// process group with group, else to the process alone. It returns the
// process groups it signalled.
func (s *Supervisor) signal(sig syscall.Signal, x, group bool) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pids []int
	for pid, name := range s.children {
		if name == xvfbName && !x {
			continue
		}
		target := pid
		if group {
			target = -pid
		}
		_ = syscall.Kill(target, sig)
		pids = append(pids, pid)
	}
	return pids
}

// spawn starts argv as user in its own process group.
// extraEnv ("K=V") comes after the session's environment.
func (s *Supervisor) spawn(name string, argv []string, user string, extraEnv []string) (int, <-chan reap.Status, error) {
	if len(argv) == 0 {
		return 0, nil, errors.New("empty argv")
	}
	acct, err := account.Lookup(user)
	if err != nil {
		return 0, nil, err
	}
	s.mu.Lock()
	base := append(slices.Clip(s.opts.Env), s.geomEnv...)
	s.mu.Unlock()
	env := process.BuildEnv(acct, append(base, extraEnv...), "", nil, map[string]string{"DISPLAY": s.cfg.Display})
	dir := acct.Home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/"
	}
	path, err := process.LookPath(argv[0], envValue(env, "PATH"), dir)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", argv[0], err)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, nil, err
	}
	defer null.Close()
	out := s.opts.Output.Fd()
	attr := &syscall.ProcAttr{
		Dir: dir, Env: env, Files: []uintptr{null.Fd(), out, out},
		Sys: &syscall.SysProcAttr{Setpgid: true, Credential: acct.Credential()},
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return 0, nil, s.ctx.Err()
	}
	pid, status, err := s.opts.Reaper.Spawn(func() (int, error) {
		pid, err := syscall.ForkExec(path, argv, attr)
		if attr.Sys.Credential != nil {
			account.KeepDumpable()
		}
		return pid, err
	})
	if err != nil {
		return 0, nil, err
	}
	s.children[pid] = name
	s.log.Info("session: started", "program", name, "pid", pid, "user", acct.Name, "argv", argv)
	return pid, status, nil
}

// exited forgets pid (so Stop never signals a reused pid) and logs.
func (s *Supervisor) exited(name string, st reap.Status, ran time.Duration) {
	s.mu.Lock()
	delete(s.children, st.Pid)
	s.mu.Unlock()
	lvl := slog.LevelWarn
	if s.ctx.Err() != nil {
		lvl = slog.LevelInfo
	}
	s.log.Log(context.Background(), lvl, "session: exited", "program", name, "pid", st.Pid, "status", st.String(), "ran", ran.Round(time.Millisecond))
}

// sleep waits d or until the session stops, reporting whether to go on.
func (s *Supervisor) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

type backoff struct {
	min, max, stable, cur time.Duration
}

// next is the delay before a restart of something that ran for ran.
func (b *backoff) next(ran time.Duration) time.Duration {
	if ran >= b.stable || b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur
}

// xvfbName is the X server's name among the children.
const xvfbName = "xvfb"

// sessionXServerEnv is xdo.SessionXServerEnv (this package does not
// import the wrappers').
const sessionXServerEnv = "CUBICLE_SESSION_XSERVER"

// runX keeps Xvfb running and the desktop connected.
func (s *Supervisor) runX() {
	defer s.wg.Done()
	bo := backoff{min: s.opts.MinBackoff, max: s.opts.MaxBackoff, stable: s.opts.StableAfter}
	for s.ctx.Err() == nil {
		began := time.Now()
		s.mu.Lock()
		argv := s.xvfb
		s.mu.Unlock()
		// The marker makes the image's Xvfb wrapper, should PATH find it,
		// run the real X server (internal/agent/xdo).
		pid, status, err := s.spawn(xvfbName, argv, "root", []string{sessionXServerEnv + "=1"})
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.setErr(fmt.Errorf("start Xvfb: %w", err))
			s.log.Error("session: cannot start Xvfb", "err", err)
			if !s.sleep(bo.next(0)) {
				return
			}
			continue
		}
		d, err := s.connect(status, pid)
		if err != nil {
			s.setErr(err)
			s.log.Error("session: display did not come up", "err", err)
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		} else {
			s.mu.Lock()
			s.err = nil
			s.desk = d
			close(s.up)
			s.mu.Unlock()
			if s.opts.Desktop != nil {
				s.opts.Desktop.SetDesktop(d)
			}
			s.readyOnce.Do(func() { close(s.ready) })
			s.log.Info("session: display ready", "display", s.cfg.Display, "after", time.Since(began).Round(time.Millisecond))
		}
		var st reap.Status
		if status != nil {
			st = <-status
		}
		s.exited(xvfbName, st, time.Since(began))
		if d != nil {
			s.mu.Lock()
			s.up = make(chan struct{})
			s.desk = nil
			s.mu.Unlock()
			if s.opts.Desktop != nil {
				s.opts.Desktop.SetDesktop(nil)
			}
			_ = d.Close()
		}
		if s.ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		now := s.restartNow
		s.restartNow = false
		s.mu.Unlock()
		if now {
			continue // a Resize stopped it
		}
		s.setErr(fmt.Errorf("xvfb exited: %s", st.String()))
		if !s.sleep(bo.next(time.Since(began))) {
			return
		}
	}
}

// connect waits for Xvfb's socket, connects and takes a screenshot. It
// gives up when Xvfb exits or StartTimeout passes.
func (s *Supervisor) connect(status <-chan reap.Status, pid int) (*desktop.Desktop, error) {
	n, _ := DisplayNumber(s.cfg.Display)
	sock := filepath.Join("/tmp/.X11-unix", "X"+strconv.Itoa(n))
	deadline := time.Now().Add(s.opts.StartTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		if s.ctx.Err() != nil {
			return nil, s.ctx.Err()
		}
		if xvfbExited(status) {
			return nil, fmt.Errorf("xvfb (pid %d) exited before accepting connections", pid)
		}
		if _, err := os.Stat(sock); err != nil {
			lastErr = err
			time.Sleep(20 * time.Millisecond)
			continue
		}
		d, err := openDisplay(s.cfg.Display)
		if err != nil {
			lastErr = err
			time.Sleep(50 * time.Millisecond)
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		err = probe(ctx, d)
		cancel()
		if err == nil {
			return d, nil
		}
		lastErr = err
		_ = d.Close()
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("display %s not ready after %v: %w", s.cfg.Display, s.opts.StartTimeout, lastErr)
}

// xvfbExited peeks at status without consuming it (the reaper's channel is
// buffered and receives at most one value), so runX still reads it.
func xvfbExited(status <-chan reap.Status) bool {
	return len(status) > 0
}

// runProgram keeps one program running while the display is up.
func (s *Supervisor) runProgram(p Program) {
	defer s.wg.Done()
	defer s.progs.Done()
	if p.OnDemand != nil {
		s.mu.Lock()
		d := s.demands[p.OnDemand.Port]
		s.mu.Unlock()
		s.runDemand(p, d)
		return
	}
	bo := backoff{min: s.opts.MinBackoff, max: s.opts.MaxBackoff, stable: s.opts.StableAfter}
	for {
		select {
		case <-s.displayUp():
		case <-s.ctx.Done():
			return
		}
		began := time.Now()
		_, status, err := s.spawn(p.Name, p.Argv, p.User, p.Env)
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.log.Error("session: cannot start program", "program", p.Name, "err", err)
		} else {
			st := <-status
			s.exited(p.Name, st, time.Since(began))
		}
		if s.ctx.Err() != nil {
			return
		}
		delay := bo.next(time.Since(began))
		s.log.Info("session: restarting", "program", p.Name, "in", delay)
		if !s.sleep(delay) {
			return
		}
	}
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}
