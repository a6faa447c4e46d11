// Command cubicle-agent is the agent inside every cubicle sandbox: it serves
// the desktop, process and filesystem services (see internal/agent) on a
// unix socket, reaps orphans as PID 1 and supervises the desktop session
// described by /etc/cubicle/session.json. It is built with CGO_ENABLED=0.
//
// The per-sandbox token comes in the environment variable
// CUBICLE_AGENT_TOKEN, which the agent removes from its environment at
// start; every other variable is the sandbox's default environment for
// processes.
//
// Started as /init (PID 1) of a VM's initramfs, it is the VM's init instead:
// see internal/agent/vminit and vm.go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/desktop"
	"github.com/cubicle-dev/cubicle/internal/agent/detect"
	"github.com/cubicle-dev/cubicle/internal/agent/identity"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/agent/session"
	"github.com/cubicle-dev/cubicle/internal/agent/threads"
	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/agent/xdo"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// threadReserve is how many idle OS threads the agent starts with (see
// internal/agent/threads): enough for every request it serves at once to
// block in a system call (a command's wait, a file read) with some over,
// at about 50 KiB each.
const threadReserve = 32

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "xdotool" {
		// The desktop image's /usr/local/bin/xdotool: see internal/agent/xdo.
		os.Exit(xdo.Main(os.Args[2:], os.Getenv, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "Xvfb" {
		// The desktop image's /usr/local/bin/Xvfb: see internal/agent/xdo.
		os.Exit(xdo.XvfbMain(os.Args[2:], os.Getenv, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "scrot" {
		// The desktop image's /usr/local/bin/scrot: see internal/agent/xdo.
		os.Exit(xdo.ScrotMain(os.Args[2:], os.Getenv, os.Stderr))
	}
	if vminit.IsInit() {
		// The kernel passes its unknown parameters as arguments: no flags.
		runVM()
		return
	}
	listen := flag.String("listen", "/run/cubicle/agent.sock", "unix socket to serve on")
	listenTCP := flag.String("listen-tcp", "", "also serve on this TCP address (e.g. :49983)")
	sessionPath := flag.String("session", session.DefaultPath, "desktop session config; empty means no desktop")
	detect := flag.Bool("detect", true, "when the session config is missing, run the desktop the image has (X server, window manager, browser, x11vnc), or none")
	insecure := flag.Bool("insecure", false, "allow running without "+agent.TokenEnv+" (tests only)")
	defaultUser := flag.String("default-user", "root", "user for requests that name none")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	if err := run(log, *listen, *listenTCP, *sessionPath, *detect, *defaultUser, *insecure, nil); err != nil {
		log.Error("cubicle-agent", "err", err)
		os.Exit(1)
	}
}

// run serves the agent on a unix socket at listen (unless ""), on
// listenTCP (unless "") and on extra, until SIGTERM or SIGINT. Without a
// session config at sessionPath, detectDesktop makes the session from what
// the image has.
func run(log *slog.Logger, listen, listenTCP, sessionPath string, detectDesktop bool, defaultUser string, insecure bool, extra []net.Listener) error {
	token := agent.TokenFromEnv() // before anything can inherit the environment
	// While the sandbox's pids cgroup still has room: a full one (a fork
	// bomb) would otherwise end the agent the moment it needs a thread.
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if n, err := threads.Reserve(rctx, threadReserve); err != nil {
		log.Warn("thread reserve", "err", err)
	} else {
		log.Debug("thread reserve", "threads", n)
	}
	cancel()
	pooled := agent.PooledFromEnv()
	template := agent.TemplateFromEnv()
	devTools := agent.DevToolsFromEnv()
	env := os.Environ()

	var cfg *session.Config
	headless := false
	if sessionPath != "" {
		c, err := session.Load(sessionPath)
		switch {
		case errors.Is(err, fs.ErrNotExist) && detectDesktop:
			// An image that knows nothing of cubicle: run the desktop
			// it has, or none.
			found, derr := detect.Detect("/")
			if derr != nil {
				log.Warn("desktop detection", "err", derr)
			}
			if c, ok := session.FromFound(found); ok {
				log.Info("desktop session from what the image has", "x_server", found.XServer,
					"session", found.Session, "browser", found.Browser, "vnc", found.VNC, "user", found.User)
				cfg = &c
			} else {
				log.Info("headless sandbox: the image has no X server")
				headless = true
			}
		case errors.Is(err, fs.ErrNotExist):
			log.Info("no desktop session", "config", sessionPath)
		case err != nil:
			log.Error("desktop session disabled", "err", err)
		default:
			cfg = &c
		}
	}
	display := ":0"
	if cfg != nil {
		display = cfg.Display
	}
	// A box of the warm pool starts its desktop without the programs
	// that need the start URL; they start when a create applies its
	// session, with its start URL and environment, as they would have at
	// a cold boot.
	var held session.Config
	if pooled && cfg != nil {
		rest, h := cfg.Split()
		cfg, held = &rest, h
	}

	reaper, err := reap.Start(reap.All, log)
	if err != nil {
		return err
	}
	defer reaper.Stop()
	desk := desktop.NewService(version, display)
	if cfg != nil {
		wants := make([]desktop.WindowWant, 0, len(cfg.Usable))
		for _, w := range cfg.Usable {
			wants = append(wants, desktop.WindowWant{Class: w.Class, Focused: w.Focused})
		}
		desk.SetUsable(wants)
	}
	if headless {
		desk.SetHeadless()
	}
	srv, err := agent.New(agent.Options{
		Token: token, Insecure: insecure, Version: version, Reaper: reaper,
		Env: env, Display: display, DefaultUser: defaultUser, Desktop: desk, Logger: log,
	})
	if err != nil {
		return err
	}

	lns := extra
	if listen != "" {
		ln, err := agent.ListenHost(listen, log)
		if err != nil {
			return err
		}
		srv.OnCheckpoint(ln.Detach)
		reopen := make(chan os.Signal, 1)
		signal.Notify(reopen, agent.ReopenSignal)
		go func() {
			for range reopen {
				if err := ln.Reopen(); err != nil {
					log.Error("agent socket", "err", err)
				}
			}
		}()
		lns = append(lns, ln)
	}
	if listenTCP != "" {
		tl, err := net.Listen("tcp", listenTCP)
		if err != nil {
			return fmt.Errorf("listen %s: %w", listenTCP, err)
		}
		lns = append(lns, tl)
	}
	serveErr := make(chan error, len(lns))
	for _, l := range lns {
		go func() { serveErr <- srv.Serve(l) }()
	}

	var sup *session.Supervisor
	var vars session.Vars
	if cfg != nil {
		vars, err = session.VarsFromEnv(os.Getenv)
		if err != nil {
			log.Error("desktop session: bad geometry; using defaults", "err", err)
			vars, _ = session.VarsFromEnv(func(string) string { return "" })
		}
		sup, err = session.New(cfg.Expand(vars), session.Options{Reaper: reaper, Desktop: desk, Env: env, Logger: log, DevTools: devTools})
		if err != nil {
			log.Error("desktop session disabled", "err", err)
		} else {
			srv.SetDemand(sup.Acquire)
			sup.Start()
			go func() {
				if err := sup.Wait(context.Background()); err == nil {
					log.Info("desktop ready")
				}
			}()
		}
	}

	var typeSrv *http.Server
	if cfg != nil {
		// Only a desktop sandbox has the xdotool, scrot and Xvfb the
		// image's wrappers improve.
		if tl, err := xdo.Listen(xdo.SocketPath); err != nil {
			log.Warn("desktop command wrappers (xdotool, scrot, Xvfb) disabled", "err", err)
		} else {
			var rs xdo.Resizer
			if sup != nil {
				rs = sup
			}
			typeSrv = &http.Server{Handler: xdo.Handler(display, desk, desk, rs, log), ReadHeaderTimeout: 10 * time.Second}
			go func() {
				if err := typeSrv.Serve(tl); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Warn("xdotool type wrapper", "err", err)
				}
			}()
		}
	}

	switch {
	case pooled:
		desk.SetApplySession(applySession(log, srv, sup, held, vars, nil))
	case template:
		// Every program already runs; the start URL is a navigation.
		desk.SetApplySession(applySession(log, srv, nil, session.Config{}, vars, session.Navigate))
	}
	desk.SetRekey(rekey(log, srv))

	// A shutdown is asked for by a signal or by the daemon's Shutdown
	// RPC, which is answered once the programs have ended and the
	// filesystems are synced, before the server itself stops.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	asked := make(chan chan error)
	desk.SetShutdown(func(ctx context.Context) error {
		done := make(chan error, 1)
		select {
		case asked <- done:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	var answer chan error
	select {
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String())
	case answer = <-asked:
		log.Info("shutting down", "asked", "Shutdown")
	case err = <-serveErr:
		log.Error("serve", "err", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Every step runs whatever the others did; what went wrong is
	// returned, so the exit status and the log say so.
	var errs []error
	if sup != nil {
		errs = append(errs, sup.Stop(ctx))
	}
	srv.Process.Signal(syscall.SIGTERM)
	if typeSrv != nil {
		if serr := typeSrv.Shutdown(ctx); serr != nil {
			errs = append(errs, fmt.Errorf("shut down xdotool type wrapper: %w", serr))
		}
	}
	// What the programs wrote is on its way to disk, and to a volume the
	// sandbox holds, before the box is taken down.
	syscall.Sync()
	if answer != nil {
		answer <- errors.Join(errs...)
	}
	errs = append(errs, srv.Shutdown(ctx))
	return errors.Join(append([]error{err}, errs...)...)
}

// applySession is what Desktop.ApplySession runs in a box of the warm pool
// or one restored from a boot template: once in the box's life, it gives
// the create's environment to every process started from then on, starts
// the held programs with the create's start URL (a pool box) or has
// navigate point the running browser at it (a template's), and makes the
// create's token the only one accepted.
func applySession(log *slog.Logger, srv *agent.Server, sup *session.Supervisor, held session.Config, vars session.Vars, navigate func(context.Context, string) error) func(context.Context, *desktoppb.ApplySessionRequest) error {
	var applied atomic.Bool
	return func(ctx context.Context, req *desktoppb.ApplySessionRequest) error {
		if strings.ContainsRune(req.StartUrl, 0) {
			return errors.New("start URL holds a NUL byte")
		}
		if !applied.CompareAndSwap(false, true) {
			return errors.New("this sandbox already has its session")
		}
		keys := slices.Sorted(maps.Keys(req.Env))
		env := make([]string, 0, len(keys))
		for _, k := range keys {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(req.Env[k], 0) {
				continue
			}
			env = append(env, k+"="+req.Env[k])
		}
		srv.Process.SetEnv(env)
		if sup != nil && len(held.Programs) > 0 {
			v := vars
			v.StartURL = req.StartUrl
			progs := held.Expand(v).Programs
			for i := range progs {
				progs[i].Env = env
			}
			if err := sup.Add(progs); err != nil {
				return err
			}
		}
		if navigate != nil && req.StartUrl != "" {
			nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := navigate(nctx, req.StartUrl)
			cancel()
			if err != nil {
				return fmt.Errorf("start URL: %w", err)
			}
		}
		srv.SetToken(req.Token)
		log.Info("session applied", "env", len(env), "start_url", req.StartUrl != "")
		return nil
	}
}

// rekey is what Desktop.Rekey runs in a fork: the identity the request
// names, then its token, the only one accepted from then on.
func rekey(log *slog.Logger, srv *agent.Server) func(context.Context, *desktoppb.RekeyRequest) error {
	return func(_ context.Context, req *desktoppb.RekeyRequest) error {
		c := identity.Change{Hostname: req.Hostname, MachineID: req.MachineId, Entropy: req.Entropy}
		if req.Addr != "" {
			var err error
			if c.MAC, err = net.ParseMAC(req.Mac); err != nil {
				return fmt.Errorf("mac: %w", err)
			}
			if c.Addr, err = netip.ParsePrefix(req.Addr); err != nil {
				return fmt.Errorf("addr: %w", err)
			}
			if c.OldAddr, err = netip.ParsePrefix(req.OldAddr); err != nil {
				return fmt.Errorf("old_addr: %w", err)
			}
			if req.Gateway != "" {
				if c.Gateway, err = netip.ParseAddr(req.Gateway); err != nil {
					return fmt.Errorf("gateway: %w", err)
				}
			}
		}
		if err := identity.Apply(c, "/"); err != nil {
			return err
		}
		srv.SetToken(req.Token)
		log.Info("identity changed", "hostname", req.Hostname, "addr", req.Addr)
		return nil
	}
}
