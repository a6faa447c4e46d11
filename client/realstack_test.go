package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jezek/xgb"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/desktop"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/viewtoken"
	processpb "github.com/cubicle-dev/cubicle/proto/process"
)

// TestMain quiets xgb, which logs every X connection made without an
// Xauthority file (the fake's Xvfbs have none).
func TestMain(m *testing.M) {
	xgb.Logger = log.New(io.Discard, "", 0)
	os.Exit(m.Run())
}

// realStack is cubicled's own request path in one test process: the real
// REST handlers (internal/api) over a real sandbox.Manager, whose one
// backend is fakeDriver. Only the isolation is fake; every SDK call goes
// through the daemon's routing, validation, error mapping and agent client
// to a real agent.
type realStack struct {
	url    string
	key    string
	drv    *fakeDriver
	mgr    *sandbox.Manager
	client *client.Client
}

// startRealStack starts the stack; everything stops when t ends.
func startRealStack(t *testing.T, maxSandboxes int) *realStack {
	t.Helper()
	needs.Xvfb(t)
	needs.Command(t, "xev")
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	drv := &fakeDriver{reaper: r, dir: t.TempDir(), log: log, live: map[string]*fakeBox{}}
	image := t.TempDir() // the fake driver boots nothing from it
	m := metrics.New()
	mgr, err := sandbox.New(context.Background(), sandbox.Config{
		DataDir:        t.TempDir(),
		Drivers:        map[string]driver.Driver{"fake": drv},
		DefaultBackend: "fake",
		Images: func(template string) (string, error) {
			if template != "desktop" {
				return "", errdefs.Invalid("unknown template %q", template)
			}
			return image, nil
		},
		MaxSandboxes: maxSandboxes,
		ReadyTimeout: 30 * time.Second,
		Metrics:      m,
		Log:          log,
	})
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := viewtoken.New([]byte("0123456789abcdef0123456789abcdef"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	const key = "sdk-real-api-test-key"
	srv := httptest.NewServer(api.New(api.Config{
		APIKeys: []string{key}, Version: "sdk-test", ViewTokens: tokens, Context: ctx,
	}, mgr, m, log))
	t.Cleanup(func() {
		// Whatever a test left, the daemon frees at the end; then the
		// fake must hold nothing.
		for _, sb := range mgr.List(context.Background(), sandbox.Filter{}) {
			_ = mgr.Destroy(context.Background(), sb.ID)
		}
		cancel()
		srv.Close()
		if err := mgr.Close(); err != nil {
			t.Errorf("close manager: %v", err)
		}
		if n := drv.liveBoxes(); n != 0 {
			t.Errorf("%d fake sandboxes still running after every destroy", n)
		}
	})
	return &realStack{url: srv.URL, key: key, drv: drv, mgr: mgr,
		client: client.New(srv.URL, client.WithAPIKey(key), client.WithTimeout(time.Minute))}
}

// fakeDriver is a FAKE backend, for what cannot run in a unit test (a
// container or VM runtime and a desktop image): each "sandbox" is a real
// agent server (internal/agent: its process, filesystem and desktop
// services) running in the test process on a unix socket, over a real
// Xvfb of the requested size. It isolates nothing: commands run on the
// host as the test's user and paths are the host's.
type fakeDriver struct {
	reaper *reap.Reaper
	dir    string
	log    *slog.Logger

	mu   sync.Mutex
	live map[string]*fakeBox
}

var _ driver.Driver = (*fakeDriver)(nil)

func (d *fakeDriver) Name() string      { return "fake" }
func (d *fakeDriver) Isolation() string { return driver.IsolationNamespace }

func (d *fakeDriver) Available(context.Context) error {
	if _, err := exec.LookPath("Xvfb"); err != nil {
		return fmt.Errorf("%w: no Xvfb: %v", driver.ErrUnavailable, err)
	}
	return nil
}

func (d *fakeDriver) Create(ctx context.Context, spec driver.Spec) (driver.Box, error) {
	b := &fakeBox{id: spec.ID, dir: filepath.Join(d.dir, spec.ID), dead: make(chan struct{}), d: d}
	ok := false
	defer func() {
		if !ok {
			_ = b.Stop(context.WithoutCancel(ctx))
		}
	}()
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return nil, err
	}
	var err error
	if b.display, err = b.startXvfb(ctx, spec.Width, spec.Height); err != nil {
		return nil, err
	}
	if b.desk, err = desktop.Open(b.display); err != nil {
		return nil, fmt.Errorf("open display %s: %w", b.display, err)
	}
	svc := desktop.NewService("sdk-test", b.display)
	svc.SetDesktop(b.desk)
	var env []string
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	b.srv, err = agent.New(agent.Options{Token: spec.Token, Version: "sdk-test", Reaper: d.reaper,
		Env: env, Display: b.display, Desktop: svc, Logger: d.log})
	if err != nil {
		return nil, err
	}
	b.sock = filepath.Join(b.dir, "agent.sock")
	ln, err := agent.ListenUnix(b.sock)
	if err != nil {
		return nil, err
	}
	b.served = make(chan struct{})
	go func() {
		defer close(b.served)
		if err := b.srv.Serve(ln); err != nil {
			d.log.Error("fake agent", "sandbox", b.id, "err", err)
		}
	}()
	d.mu.Lock()
	d.live[b.id] = b
	d.mu.Unlock()
	ok = true
	return b, nil
}

func (d *fakeDriver) Adopt(context.Context, driver.State) (driver.Box, error) {
	return nil, errors.New("the fake driver cannot adopt: its sandboxes live in the test process")
}

func (d *fakeDriver) Cleanup(context.Context, map[string]bool) error { return nil }

func (d *fakeDriver) liveBoxes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.live)
}

// box returns the live fake sandbox id, or nil.
func (d *fakeDriver) box(id string) *fakeBox {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live[id]
}

// fakeBox is one sandbox of fakeDriver.
type fakeBox struct {
	d       *fakeDriver
	id, dir string
	display string
	sock    string
	xvfb    *exec.Cmd
	xdone   chan struct{} // closed when Xvfb has exited
	desk    *desktop.Desktop
	srv     *agent.Server
	served  chan struct{} // closed when Serve has returned
	dead    chan struct{}
	once    sync.Once // closes dead

	stopOnce sync.Once
	stopErr  error
}

// startXvfb starts an Xvfb of w×h on a display it picks itself
// (-displayfd) and returns the display.
func (b *fakeBox) startXvfb(ctx context.Context, w, h int) (string, error) {
	r, wr, err := os.Pipe()
	if err != nil {
		return "", err
	}
	defer r.Close()
	cmd := exec.Command("Xvfb", "-displayfd", "3", "-screen", "0", fmt.Sprintf("%dx%dx24", w, h), "-nolisten", "tcp", "-noreset")
	cmd.ExtraFiles = []*os.File{wr}
	err = cmd.Start()
	wr.Close()
	if err != nil {
		return "", fmt.Errorf("start Xvfb: %w", err)
	}
	b.xvfb, b.xdone = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(b.xdone)
		// An X server that dies kills the sandbox, as in a real one.
		b.once.Do(func() { close(b.dead) })
	}()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case n := <-line:
		if _, err := strconv.Atoi(n); err != nil {
			return "", fmt.Errorf("Xvfb reported display %q", n)
		}
		return ":" + n, nil
	case <-b.xdone:
		return "", errors.New("Xvfb exited before it reported a display")
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (b *fakeBox) DialAgent(ctx context.Context) (net.Conn, error) {
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", b.sock)
}

func (b *fakeBox) State() driver.State {
	return driver.State{Version: 1, Driver: "fake", Data: []byte(`{}`)}
}

func (b *fakeBox) Wait() <-chan struct{} { return b.dead }

// Stop kills the sandbox's processes (as a container's end would), stops
// the agent and the X server, and removes the sandbox's directory. Like a
// real box's, it is safe to call more than once.
func (b *fakeBox) Stop(ctx context.Context) error {
	b.stopOnce.Do(func() { b.stopErr = b.stop(ctx) })
	return b.stopErr
}

func (b *fakeBox) stop(ctx context.Context) error {
	var errs []error
	if b.srv != nil {
		if list, err := b.srv.Process.List(ctx, connect.NewRequest(&processpb.ListRequest{})); err == nil {
			for _, p := range list.Msg.GetProcesses() {
				_ = syscall.Kill(-int(p.GetPid()), syscall.SIGKILL)
				_ = syscall.Kill(int(p.GetPid()), syscall.SIGKILL)
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := b.srv.Shutdown(sctx); err != nil {
			errs = append(errs, fmt.Errorf("agent shutdown: %w", err))
		}
		cancel()
		if b.served != nil {
			<-b.served
		}
	}
	if b.desk != nil {
		_ = b.desk.Close()
	}
	if b.xvfb != nil {
		_ = b.xvfb.Process.Kill()
		<-b.xdone
	}
	b.once.Do(func() { close(b.dead) })
	if err := os.RemoveAll(b.dir); err != nil {
		errs = append(errs, err)
	}
	b.d.mu.Lock()
	delete(b.d.live, b.id)
	b.d.mu.Unlock()
	return errors.Join(errs...)
}
