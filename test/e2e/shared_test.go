package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// Shared desktops. Tests that boot a desktop only to read from it, or to
// drive a page of their own in it (each opens its page first, which resets
// what the one before left on the screen), share one daemon and one
// sandbox per backend for the whole test process, instead of a daemon and
// a boot each (issue 25: a desktop's boot is 10-20 s of the 2-core
// machine's CPU). The first user boots it; TestMain destroys it after the
// last test (stopSharedDesktops).
//
// A test that uses one must leave it running, on its daemon as it found
// it: it must not destroy, pause or restart it, change the screen size,
// or leave a sandbox of its own on that daemon; and its users run one at
// a time (none is t.Parallel). Each user finds it checked
// (running, a command answers, the screen is the size it was made with)
// and checks it again when it ends; a shared desktop found broken fails
// every later user at once, naming the test that used it last, instead of
// cascading into failures that look like their own. Tests whose point is a
// fresh sandbox (the create path, its latency, the first screen after it,
// a destroy) or a daemon flag boot their own.

// sharedSpec is what the users of one shared desktop agree on: the
// backend, and a 1920×1080 desktop of the harness's default template
// (desktop-lite) with no network, DevTools, volumes or environment, on a
// daemon with default flags but for the sandbox's lifetimes.
type sharedSpec struct {
	backend       string
	width, height int
}

func (s sharedSpec) String() string { return fmt.Sprintf("%s %d×%d", s.backend, s.width, s.height) }

// sharedEnv lists, comma separated, the IDs of the shared desktops of this
// test process. It is in the environment so that a test re-executed in a
// network namespace of its own (netpooltest.InOwnNetns) inherits it: the
// host snapshots of crash tests leave out what names a shared desktop
// (snapshotHost).
const sharedEnv = "CUBICLE_E2E_SHARED_SANDBOXES"

// sharedSandboxIDs returns the IDs sharedEnv lists.
func sharedSandboxIDs() []string {
	var ids []string
	for _, id := range strings.Split(os.Getenv(sharedEnv), ",") {
		if id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// sharedDesktop is a booted desktop and its daemon, shared by the tests of
// one test process.
type sharedDesktop struct {
	d  *harness.Daemon
	c  *client.Client
	sb client.Sandbox

	// freshClipboard is what the clipboard held right after the boot,
	// read before any test could touch it (TestClipboard's "a fresh
	// desktop's clipboard is empty").
	freshClipboard    string
	freshClipboardErr error
}

// sharedSlot holds one spec's shared desktop: started once, its error
// kept for every later user.
type sharedSlot struct {
	spec    sharedSpec
	once    sync.Once
	dataDir string
	d       *harness.Daemon // set once the daemon started, even if the create failed
	desk    *sharedDesktop  // set once the sandbox is up
	err     error
	booted  string // the test that booted it
	took    time.Duration

	mu         sync.Mutex
	broken     string // why it is unusable; "" while it is fine
	last       string // the test that used it last
	lastFailed bool
}

var sharedSlots struct {
	mu sync.Mutex
	m  map[sharedSpec]*sharedSlot
}

// useSharedDesktop returns the shared 1920×1080 desktop on backend,
// booting it (and its daemon) on first use. The caller gates on the
// backend first (needsBackend).
func useSharedDesktop(t *testing.T, backend string) *sharedDesktop {
	t.Helper()
	return useShared(t, sharedSpec{backend: backend, width: 1920, height: 1080})
}

func useShared(t *testing.T, spec sharedSpec) *sharedDesktop {
	t.Helper()
	// startDaemonArgs's gates: each user skips (or, under
	// CUBICLE_REQUIRE_E2E=1, fails) on its own.
	needs.Root(t)
	needs.Image(t, filepath.Join(imageDir(), "desktop"))

	sharedSlots.mu.Lock()
	if sharedSlots.m == nil {
		sharedSlots.m = map[sharedSpec]*sharedSlot{}
	}
	s := sharedSlots.m[spec]
	if s == nil {
		s = &sharedSlot{spec: spec}
		sharedSlots.m[spec] = s
	}
	sharedSlots.mu.Unlock()

	s.once.Do(func() { s.start(t.Name()) })
	if s.err != nil {
		if s.booted == t.Name() && s.d != nil {
			log, _ := os.ReadFile(s.d.Log)
			t.Logf("cubicled log of the shared desktop (tail):\n%s", tail(string(log), 60))
		}
		t.Fatalf("shared %v desktop (booted for %s): %v", spec, s.booted, s.err)
	}

	s.mu.Lock()
	broken, last, lastFailed := s.broken, s.last, s.lastFailed
	s.mu.Unlock()
	if broken != "" {
		t.Fatalf("shared %v desktop %s is unusable: %s (not booted again: see that test's failure)", spec, s.desk.sb.ID, broken)
	}
	if err := s.check(); err != nil {
		who := "no test yet (it was just booted for " + s.booted + ")"
		if last != "" {
			who = last
			if lastFailed {
				who += ", which failed"
			}
		}
		s.setBroken(fmt.Sprintf("%v, found by %s after %s", err, t.Name(), who))
		t.Fatalf("shared %v desktop %s, last used by %s, is not healthy: %v. An earlier test left it so; this test does not boot another.", spec, s.desk.sb.ID, who, err)
	}
	if s.booted == t.Name() && last == "" {
		t.Logf("shared %v desktop: sandbox %s booted for this test in %v", spec, s.desk.sb.ID, s.took.Round(time.Millisecond))
	} else {
		t.Logf("shared %v desktop: sandbox %s (booted for %s; last used by %s)", spec, s.desk.sb.ID, s.booted, last)
	}
	s.mu.Lock()
	s.last = t.Name()
	s.mu.Unlock()

	logFrom := fileSize(s.d.Log)
	t.Cleanup(func() {
		s.afterUse(t)
		s.mu.Lock()
		s.lastFailed = t.Failed()
		s.mu.Unlock()
		if t.Failed() {
			t.Logf("cubicled log of the shared desktop during %s (tail):\n%s", t.Name(), tail(readFrom(s.d.Log, logFrom), 60))
		}
	})
	return s.desk
}

// start starts the daemon and boots the desktop; who is the test that
// asked first. It sets s.err on failure.
func (s *sharedSlot) start(who string) {
	s.booted = who
	dataDir, err := os.MkdirTemp("", "cubicle-e2e-shared-")
	if err != nil {
		s.err = err
		return
	}
	s.dataDir = dataDir
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	// Its users may be an hour of other tests apart: the sandbox must
	// outlive the default idle timeout (30 min) and lifetime (60 min).
	d, err := harness.Start(ctx, harness.Options{DataDir: dataDir, ImageDir: imageDir(), DefaultBackend: s.spec.backend,
		Args: []string{"--max-lifetime", "0", "--idle-timeout", "24h"}})
	cancel()
	s.d = d // even on error: teardown stops whatever started
	if err != nil {
		s.err = fmt.Errorf("start cubicled: %w", err)
		return
	}
	c := client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(3*time.Minute))
	t0 := time.Now()
	sb, err := c.Create(context.Background(), client.CreateRequest{Backend: s.spec.backend,
		Resolution: &client.Resolution{Width: s.spec.width, Height: s.spec.height}})
	if err != nil {
		s.err = fmt.Errorf("create: %w", err)
		return
	}
	s.took = time.Since(t0)
	desk := &sharedDesktop{d: d, c: c, sb: sb}
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	desk.freshClipboard, desk.freshClipboardErr = c.ClipboardGet(cctx, sb.ID)
	cancel()
	s.desk = desk
	os.Setenv(sharedEnv, strings.Join(append(sharedSandboxIDs(), sb.ID), ","))
}

// check reports what is wrong with the shared desktop: not running, no
// answer to a command, a screen of another size.
func (s *sharedSlot) check() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, id := s.desk.c, s.desk.sb.ID
	sb, err := c.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	if sb.State != client.StateRunning {
		return fmt.Errorf("it is %s, want %s", sb.State, client.StateRunning)
	}
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: "echo shared", TimeoutSeconds: 30})
	if err != nil || res.ExitCode != 0 || res.Stdout != "shared\n" {
		return fmt.Errorf("exec echo shared: %+v, %v", res, err)
	}
	size, err := c.ScreenSize(ctx, id)
	if err != nil || size.Width != s.spec.width || size.Height != s.spec.height {
		return fmt.Errorf("screen size %+v, %v; want %d×%d", size, err, s.spec.width, s.spec.height)
	}
	return nil
}

func (s *sharedSlot) setBroken(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken == "" {
		s.broken = why
	}
}

// afterUse fails t if it left the shared desktop other than running, and
// destroys (and reports) any sandbox of its own it left on the daemon.
func (s *sharedSlot) afterUse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, id := s.desk.c, s.desk.sb.ID
	sb, err := c.Get(ctx, id)
	if err != nil || sb.State != client.StateRunning {
		s.setBroken(fmt.Sprintf("%s left it %q (%v)", t.Name(), sb.State, err))
		t.Errorf("%s left the shared desktop %s %q (%v): a test sharing it must leave it running", t.Name(), id, sb.State, err)
		return
	}
	sbs, err := c.List(ctx, client.ListOptions{})
	if err != nil {
		t.Errorf("list the shared desktop's daemon: %v", err)
		return
	}
	for _, o := range sbs {
		if o.ID != id && o.State != client.StateStopped && o.State != client.StateFailed {
			t.Errorf("%s left sandbox %s (%s) on the shared desktop's daemon; destroying it", t.Name(), o.ID, o.State)
			if err := c.Destroy(ctx, o.ID); err != nil {
				t.Errorf("destroy %s: %v", o.ID, err)
			}
		}
	}
}

// stopSharedDesktops destroys every shared desktop, stops its daemon and
// checks that nothing of the sandbox is left on the host; TestMain calls it
// once the tests have run, with their exit code. It returns that code, or
// 1 when a teardown failed (said on stderr).
func stopSharedDesktops(code int) int {
	sharedSlots.mu.Lock()
	defer sharedSlots.mu.Unlock()
	var errs []error
	for spec, s := range sharedSlots.m {
		if s.d == nil {
			if s.dataDir != "" {
				os.RemoveAll(s.dataDir)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		c := client.New(s.d.URL, client.WithAPIKey(s.d.APIKey), client.WithTimeout(3*time.Minute))
		if sbs, err := c.List(ctx, client.ListOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("shared %v desktop: list: %w", spec, err))
		} else {
			for _, sb := range sbs {
				if sb.State == client.StateStopped || sb.State == client.StateFailed {
					continue
				}
				if err := c.Destroy(ctx, sb.ID); err != nil {
					errs = append(errs, fmt.Errorf("shared %v desktop: destroy %s: %w", spec, sb.ID, err))
				}
			}
		}
		cancel()
		s.d.Stop()
		if s.desk != nil {
			id := s.desk.sb.ID
			left := backendTraces(s.dataDir, spec.backend, id)
			if pids := harness.HostProcesses(id); len(pids) > 0 {
				left = append(left, fmt.Sprintf("processes %v", pids))
			}
			mounts, _ := os.ReadFile("/proc/self/mountinfo")
			for _, line := range strings.Split(string(mounts), "\n") {
				if strings.Contains(line, id) {
					left = append(left, "mount "+line)
				}
			}
			if len(left) > 0 {
				errs = append(errs, fmt.Errorf("shared %v desktop %s left: %s", spec, id, strings.Join(left, "; ")))
			}
		}
		if pids := harness.HostProcesses(s.dataDir); len(pids) > 0 {
			errs = append(errs, fmt.Errorf("shared %v desktop: processes of its daemon's data dir left: %v", spec, pids))
		}
		if len(errs) > 0 {
			log, _ := os.ReadFile(s.d.Log)
			fmt.Fprintf(os.Stderr, "cubicled log of the shared %v desktop (tail):\n%s\n", spec, tail(string(log), 60))
		}
		os.RemoveAll(s.dataDir)
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: teardown of the shared desktops: %v\n", err)
		return max(code, 1)
	}
	return code
}

// fileSize is the size of the file at path (0 when it cannot be read).
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns what the file at path holds from offset off on.
func readFrom(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err.Error()
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// namesShared reports whether any of bs names a shared desktop of ids.
func namesShared(ids []string, bs ...[]byte) bool {
	return slices.ContainsFunc(ids, func(id string) bool {
		return slices.ContainsFunc(bs, func(b []byte) bool { return bytes.Contains(b, []byte(id)) })
	})
}
