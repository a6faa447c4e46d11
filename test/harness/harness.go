// Package harness builds cubicle's programs and runs a real cubicled for the
// end-to-end tests and the benchmark. Only test code imports it.
package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	// prebuilt is set when buildDir came from BinDirEnv: RemoveBuild
	// leaves it alone, since the process that built it owns it.
	prebuilt bool
)

// BinDirEnv names a directory that already holds cubicled, cubicle and
// cubicle-agent, built once for the commit by `make build`: every test
// process (and every network-namespace child a test re-executes) uses it
// instead of linking its own three binaries, which cost each of them about
// 20 s of a 2-core machine's CPU.
const BinDirEnv = "CUBICLE_TEST_BIN"

// moduleRoot finds the repository root from this file's location.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// Build compiles cubicled, cubicle and the static cubicle-agent once per test
// process and returns the directory holding them, or returns the directory
// BinDirEnv names once it has checked that all three are there.
func Build() (string, error) {
	buildOnce.Do(func() {
		if dir := os.Getenv(BinDirEnv); dir != "" {
			for _, name := range []string{"cubicled", "cubicle", "cubicle-agent"} {
				fi, err := os.Stat(filepath.Join(dir, name))
				if err == nil && fi.Mode()&0o111 == 0 {
					err = errors.New("not executable")
				}
				if err != nil {
					buildErr = fmt.Errorf("%s=%s: %s (make build builds it): %w", BinDirEnv, dir, name, err)
					return
				}
			}
			buildDir, prebuilt = dir, true
			return
		}
		dir, err := os.MkdirTemp("", "cubicle-bin-")
		if err != nil {
			buildErr = err
			return
		}
		root := moduleRoot()
		for _, p := range []struct{ name, pkg string }{
			{"cubicled", "./cmd/cubicled"},
			{"cubicle", "./cmd/cubicle"},
			{"cubicle-agent", "./cmd/cubicle-agent"},
		} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(dir, p.name), p.pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", p.pkg, err, out)
				return
			}
		}
		buildDir = dir
	})
	return buildDir, buildErr
}

// BuildVersion compiles cubicled, cubicle and cubicle-agent again into
// a directory of their own, with version stamped into cubicled as a
// release build stamps it: the binaries an upgrade test moves a daemon
// to (Upgrade). The caller removes the directory.
func BuildVersion(version string) (string, error) {
	dir, err := os.MkdirTemp("", "cubicle-bin-"+version+"-")
	if err != nil {
		return "", err
	}
	for _, p := range []struct{ name, pkg string }{
		{"cubicled", "./cmd/cubicled"},
		{"cubicle", "./cmd/cubicle"},
		{"cubicle-agent", "./cmd/cubicle-agent"},
	} {
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+version, "-o", filepath.Join(dir, p.name), p.pkg)
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("go build %s: %v\n%s", p.pkg, err, out)
		}
	}
	return dir, nil
}

// RemoveBuild deletes what Build compiled (never a BinDirEnv directory).
// Every process that uses the harness without BinDirEnv builds its own
// copy (about 50 MB in /tmp), so each must call it
// when done: test packages from TestMain after m.Run, programs at exit,
// once every daemon they started has stopped. A later Build compiles
// anew (a benchmark program measures one part after another).
func RemoveBuild() {
	if buildDir != "" && !prebuilt {
		os.RemoveAll(buildDir)
	}
	buildOnce, buildDir, buildErr, prebuilt = sync.Once{}, "", nil, false
}

// RepoRoot is the repository's root directory.
func RepoRoot() string { return moduleRoot() }

// NoVNCDir is where `make deps` installs noVNC (npm ci in web/).
func NoVNCDir() string {
	return filepath.Join(moduleRoot(), "web", "node_modules", "@novnc", "novnc")
}

// Options configure a daemon.
type Options struct {
	DataDir        string // required; reused across restarts
	ImageDir       string // required
	DefaultBackend string // default "gvisor"
	// DefaultTemplate is the daemon's --default-template; default
	// "desktop-lite": most tests are about the API, not XFCE, and the
	// openbox image is lighter. Tests of the XFCE desktop name "desktop".
	DefaultTemplate string
	Env             []string
	Args            []string
	// APIKey is the daemon's API key; default a random "test-<hex>".
	APIKey string
	// ListenHost is the address the API listens on; default 127.0.0.1.
	// Network tests, which run the daemon inside a namespace of their
	// own, use 0.0.0.0 so that sandboxes could try the API on every host
	// address. The client always uses 127.0.0.1.
	ListenHost string
	// Netns runs the daemon in the named network namespace (one `ip
	// netns add` made); ListenHost is then its address there, which the
	// client uses too.
	Netns string
	// Bin is a directory holding cubicled and cubicle-agent to run
	// instead of this commit's: the benchmark's old-against-new runs
	// start a daemon built from an earlier commit.
	Bin string
}

// Daemon is a running cubicled.
type Daemon struct {
	URL    string
	APIKey string
	Addr   string
	opts   Options
	bin    string
	cmd    *exec.Cmd
	done   chan struct{}
	Log    string // path of its log file
}

// Start builds (once) and starts cubicled, waiting until /healthz answers.
func Start(ctx context.Context, opts Options) (*Daemon, error) {
	bin := opts.Bin
	if bin == "" {
		var err error
		if bin, err = Build(); err != nil {
			return nil, err
		}
	}
	if opts.DefaultBackend == "" {
		opts.DefaultBackend = "gvisor"
	}
	if opts.DefaultTemplate == "" {
		opts.DefaultTemplate = "desktop-lite"
	}
	key := make([]byte, 16)
	rand.Read(key)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	if opts.APIKey == "" {
		opts.APIKey = "test-" + hex.EncodeToString(key)
	}
	d := &Daemon{URL: "http://" + addr, APIKey: opts.APIKey, Addr: addr, opts: opts, bin: bin,
		Log: filepath.Join(opts.DataDir, "cubicled.log")}
	if opts.ListenHost != "" {
		d.Addr = net.JoinHostPort(opts.ListenHost, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	if opts.Netns != "" {
		d.URL = "http://" + d.Addr
	}
	return d, d.start(ctx)
}

func (d *Daemon) start(ctx context.Context) error {
	if err := os.MkdirAll(d.opts.DataDir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(d.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	args := append([]string{
		"--listen", d.Addr, "--data-dir", d.opts.DataDir, "--image-dir", d.opts.ImageDir,
		"--default-backend", d.opts.DefaultBackend, "--default-template", d.opts.DefaultTemplate, "--agent-bin", filepath.Join(d.bin, "cubicle-agent"),
		"--log-level", "debug", "--novnc-dir", NoVNCDir(),
	}, d.opts.Args...)
	cmd := exec.Command(filepath.Join(d.bin, "cubicled"), args...) //depcheck:built
	if d.opts.Netns != "" {
		// nsenter, not `ip netns exec`: that one also gives the daemon a
		// mount namespace of its own, which a restarted daemon would not
		// share with the sandboxes the first one started.
		cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + d.opts.Netns, "--", filepath.Join(d.bin, "cubicled")}, args...)...)
	}
	cmd.Env = append(os.Environ(), "CUBICLE_API_KEYS="+d.APIKey)
	cmd.Env = append(cmd.Env, d.opts.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start cubicled: %w", err)
	}
	d.cmd = cmd
	d.done = make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(d.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(d.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-d.done:
			log, _ := os.ReadFile(d.Log)
			return fmt.Errorf("cubicled exited at start:\n%s", log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("cubicled did not become healthy in 30s")
		}
	}
}

// Kill9 kills the daemon with SIGKILL, as a crash would.
func (d *Daemon) Kill9() {
	if d.cmd != nil && d.cmd.Process != nil {
		d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.done
	}
}

// Stop stops the daemon gracefully (SIGTERM); sandboxes stay running.
func (d *Daemon) Stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(40 * time.Second):
		d.Kill9()
	}
}

// Restart starts the daemon again on the same address and data dir.
func (d *Daemon) Restart(ctx context.Context) error {
	return d.start(ctx)
}

// Upgrade starts the daemon again, stopped, from the binaries in bin
// (BuildVersion's), on the same address and data dir.
func (d *Daemon) Upgrade(ctx context.Context, bin string) error {
	d.bin = bin
	return d.start(ctx)
}

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// HostProcesses lists host processes whose command line or environment names
// sandbox id (runsc's sandbox and gofer; runc's container processes, whose
// environment carries CUBICLE_SANDBOX_ID).
func HostProcesses(id string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, e := range dirs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if bytes.Contains(cmdline, []byte(id)) || bytes.Contains(environ, []byte("CUBICLE_SANDBOX_ID="+id)) {
			pids = append(pids, pid)
		}
	}
	return pids
}
