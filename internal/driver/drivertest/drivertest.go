// Package drivertest is the conformance suite of the driver.Driver contract,
// run against every backend on real runtimes (the way containerd's
// snapshotter suite runs against every snapshotter): Run creates boxes from
// the built desktop image, talks to the agent in them through the typed
// agent client, and checks what a user of the manager relies on — the
// process, desktop and filesystem services work in the box; a new driver
// instance (a restarted daemon) adopts a running box and reports a dead one
// dead; Cleanup removes orphans and keeps what it is told to; Stop is
// idempotent; and once a box is gone, or a Create failed, nothing of it is
// left on the host (see Scan).
//
// Only the tests of driver packages import it.
package drivertest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// Factory returns a driver. Every call must return a new instance over the
// same host state (state directory, runtime root, chroot base), as a
// restarted daemon makes one: the suite adopts boxes and cleans up through
// instances other than the one that created them.
type Factory func(t *testing.T) driver.Driver

// Option changes how Run runs.
type Option func(*config)

type config struct {
	stateDirs     []string
	paths         func(id string) []string
	image         string
	vm            bool
	boxes         int
	createTimeout time.Duration
	readyTimeout  time.Duration
	freeze        func(ctx context.Context, id string) (thaw func() error, err error)
	copies        bool
}

// StateDirs names the directories the driver keeps boxes' state in (its
// state directory, its runtime's root, a jailer's chroot base). After a box
// is gone, no entry below them may mention its ID. Required.
func StateDirs(dirs ...string) Option {
	return func(c *config) { c.stateDirs = append(c.stateDirs, dirs...) }
}

// Paths gives further host paths of box id, outside the state directories,
// that must not exist once the box is gone.
func Paths(f func(id string) []string) Option {
	return func(c *config) { c.paths = f }
}

// VM makes the suite need the desktop image's VM form (image.LookupVM), as
// the qemu and firecracker drivers do.
func VM() Option { return func(c *config) { c.vm = true } }

// Image sets the rootfs boxes are made from (default: the desktop image,
// DesktopImage).
func Image(rootfs string) Option { return func(c *config) { c.image = rootfs } }

// Boxes is how many boxes the suite boots to completion: 3 (the default)
// gives a stopped box, a live orphan for Cleanup and a crashed box each
// their own; 2, for backends where a boot is expensive (QEMU under TCG),
// has the crashed box be Cleanup's orphan, so Cleanup is shown removing a
// dead box but not killing a live one. The Create roll-back probes come on
// top: they are cut before the box is up.
func Boxes(n int) Option { return func(c *config) { c.boxes = n } }

// Timeouts bounds one Create (default 3 min) and the wait for a box's
// desktop to be ready and the test page painted (default 3 min).
func Timeouts(create, ready time.Duration) Option {
	return func(c *config) { c.createTimeout, c.readyTimeout = create, ready }
}

// FreezeDuringHandover has the adopt check hold box id's guest still
// (freeze; thaw lets it run) while the old driver instance's connections
// end and the new one adopts the box and sends its first request: a guest
// that sees its host go and a new one come only once it runs again must
// still answer that request. For backends with one byte stream to the
// guest that a session is multiplexed on (QEMU's virtio-serial); a busy
// guest under TCG shows the same on its own, at random.
func FreezeDuringHandover(freeze func(ctx context.Context, id string) (thaw func() error, err error)) Option {
	return func(c *config) { c.freeze = freeze }
}

// Copies runs the copy checks (copies.go) after PauseResume: Fork and
// Snapshot of the main box, or a fork's refusal where the driver says
// it cannot fork. Left off where a boot costs minutes (QEMU under TCG,
// whose copies test/e2e's TestFork and TestSnapshot check through the
// daemon).
func Copies() Option { return func(c *config) { c.copies = true } }

// Screen size of every box the suite makes.
const (
	width  = 1024
	height = 768
)

// suite is one Run.
type suite struct {
	root      *testing.T
	cfg       config
	newDriver Factory
	name      string // the driver's Name
}

// sbox is a box the suite made, with what it needs to talk to it.
type sbox struct {
	id, token, nonce string
	box              driver.Box
	client           *agentclient.Client
}

// Run runs the conformance suite on the drivers newDriver makes. Subtests
// share boxes where they can (the main box serves exec, screenshot,
// actions, files, adoption and Stop), so that a slow backend boots few.
func Run(t *testing.T, newDriver Factory, opts ...Option) {
	cfg := config{boxes: 3, createTimeout: 3 * time.Minute, readyTimeout: 3 * time.Minute}
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.stateDirs) == 0 {
		t.Fatal("drivertest.Run: no StateDirs: the leak check needs to know where the driver keeps boxes")
	}
	if cfg.boxes != 2 && cfg.boxes != 3 {
		t.Fatalf("drivertest.Run: Boxes(%d): want 2 or 3", cfg.boxes)
	}
	needs.Long(t, "boots desktops in real boxes")
	needs.Root(t)
	needs.Command(t, "losetup")
	if cfg.image == "" {
		cfg.image = DesktopImage(t, cfg.vm)
	}
	began := time.Now()
	defer func() { t.Logf("conformance suite: %s", time.Since(began).Round(time.Millisecond)) }()

	s := &suite{root: t, cfg: cfg, newDriver: newDriver}
	d := newDriver(t)
	s.name = d.Name()
	if !t.Run("Available", func(t *testing.T) { s.available(t, d) }) {
		t.FailNow()
	}
	t.Run("CreateRollsBack", func(t *testing.T) { s.createRollsBack(t, d) })

	var a *sbox
	if !t.Run("Create", func(t *testing.T) {
		a = s.create(t, d, "a", pageURL)
		s.waitDesktop(t, a)
	}) {
		t.FailNow()
	}
	t.Run("Exec", func(t *testing.T) { s.exec(t, a) })
	t.Run("Token", func(t *testing.T) { s.token(t, a) })
	t.Run("Screenshot", func(t *testing.T) { s.screenshot(t, a) })
	t.Run("Actions", func(t *testing.T) { s.actions(t, a) })
	t.Run("Files", func(t *testing.T) { s.files(t, a) })
	t.Run("PauseResume", func(t *testing.T) { s.pauseResume(t, d, a) })
	if cfg.copies {
		t.Run("Copies", func(t *testing.T) { s.copies(t, d, a) })
	}

	// adopted is the main box as a restarted daemon sees it; the rest of
	// the suite talks to the main box through it.
	adopted := a
	t.Run("Adopt", func(t *testing.T) {
		if b := s.adopt(t, a); b != nil {
			adopted = b
		}
	})

	if cfg.boxes == 3 {
		t.Run("CleanupLiveOrphan", func(t *testing.T) {
			b := s.create(t, d, "b", "")
			s.cleanup(t, b, adopted, true)
		})
		t.Run("Crash", func(t *testing.T) {
			c := s.create(t, d, "c", "")
			nb := s.crash(t, c)
			s.stop(t, c.id, nb, c.box)
		})
	} else {
		t.Run("CrashThenCleanup", func(t *testing.T) {
			b := s.create(t, d, "b", "")
			nb := s.crash(t, b)
			s.cleanup(t, b, adopted, false)
			s.stop(t, b.id, nb, b.box)
		})
	}

	t.Run("Stop", func(t *testing.T) {
		if !alive(adopted.box) {
			t.Fatal("the main box died before Stop")
		}
		t0 := time.Now()
		handles := []driver.Box{adopted.box}
		if adopted != a {
			handles = append(handles, a.box) // the handle of the daemon before the restart
		}
		s.stop(t, a.id, handles...)
		t.Logf("stop and leak check: %s", time.Since(t0).Round(time.Millisecond))
		// What the store still holds of the stopped box adopts as dead.
		if nb := s.adoptDeadState(t, a.box.State()); nb != nil {
			s.stop(t, a.id, nb)
		}
	})
}

// available checks the driver's identity and that Available (and, for a
// backend that probe-boots, Probe) passes on a host where the test's gates
// did.
func (s *suite) available(t *testing.T, d driver.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if d.Name() == "" {
		t.Error("Name is empty")
	}
	switch iso := d.Isolation(); iso {
	case driver.IsolationVM, driver.IsolationGVisor, driver.IsolationNamespace:
	default:
		t.Errorf("Isolation = %q, want one of %q, %q, %q", iso, driver.IsolationVM, driver.IsolationGVisor, driver.IsolationNamespace)
	}
	if err := d.Available(ctx); err != nil {
		t.Fatalf("Available on a host that passed the test's gates: %v", err)
	}
	if p, ok := d.(driver.Prober); ok {
		if err := p.Probe(ctx); err != nil {
			t.Fatalf("Probe on a host that passed the test's gates: %v", err)
		}
	}
}

// newSpec returns the spec of a new box: a fresh ID (tag says which of the
// suite's boxes it is), token and nonce; the nonce is in the box's
// environment as DRIVERTEST_NONCE.
func (s *suite) newSpec(tag, startURL string) driver.Spec {
	return driver.Spec{
		ID:    "dt" + tag + randomString(10),
		Shape: driver.Shape{Image: s.cfg.image},
		Session: driver.Session{
			Token:    randomString(32),
			Env:      map[string]string{"DRIVERTEST_NONCE": randomString(16)},
			Width:    width,
			Height:   height,
			DPI:      96,
			StartURL: startURL,
		},
	}
}

// create makes a box that lives until the end of Run at most (it is
// stopped then, whatever happened) and waits until its agent runs a
// command.
func (s *suite) create(t *testing.T, d driver.Driver, tag, startURL string) *sbox {
	t.Helper()
	spec := s.newSpec(tag, startURL)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.createTimeout)
	defer cancel()
	t0 := time.Now()
	b, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create %s: %v", spec.ID, err)
	}
	t.Logf("Create %s: %s", spec.ID, time.Since(t0).Round(time.Millisecond))
	sb := &sbox{id: spec.ID, token: spec.Token, nonce: spec.Env["DRIVERTEST_NONCE"], box: b,
		client: agentclient.New(b.DialAgent, spec.Token)}
	s.root.Cleanup(func() {
		sb.client.Close()
		if err := b.Stop(context.Background()); err != nil {
			s.root.Errorf("final Stop of %s: %v", sb.id, err)
		}
	})
	s.waitAgent(t, sb)
	return sb
}

// waitAgent waits until the box's agent runs a command: Create returns
// once the agent's channel accepts connections.
func (s *suite) waitAgent(t *testing.T, sb *sbox) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := sb.client.Exec(ctx, agentclient.ExecRequest{Argv: []string{"true"}}, nil)
		cancel()
		if err == nil && res.ExitCode == 0 {
			return
		}
		if !alive(sb.box) || time.Now().After(deadline) {
			t.Fatalf("box %s: the agent does not run commands: %+v, %v", sb.id, res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitDesktop waits until the agent reports its desktop ready, as the
// manager does before it calls a sandbox running.
func (s *suite) waitDesktop(t *testing.T, sb *sbox) {
	t.Helper()
	t0 := time.Now()
	deadline := t0.Add(s.cfg.readyTimeout)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := sb.client.Desktop.Info(ctx, connect.NewRequest(&desktoppb.InfoRequest{}))
		cancel()
		if err == nil && resp.Msg.Ready {
			if resp.Msg.Width != width || resp.Msg.Height != height {
				t.Errorf("desktop is %dx%d, want the spec's %dx%d", resp.Msg.Width, resp.Msg.Height, width, height)
			}
			t.Logf("desktop ready %s after Create", time.Since(t0).Round(time.Millisecond))
			return
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("not ready yet")
		}
		if !alive(sb.box) {
			t.Fatalf("box %s died while its desktop started (last: %v)", sb.id, last)
		}
		if time.Now().After(deadline) {
			t.Fatalf("box %s: desktop not ready in %s: %v", sb.id, s.cfg.readyTimeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// adopt has a new driver instance adopt the box from its State, kept the
// way the store keeps it (JSON), and checks that the agent answers through
// the adopted box and that it is the same box.
func (s *suite) adopt(t *testing.T, a *sbox) *sbox {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A file the old daemon's handle writes, the new one must read back:
	// an adopted box that only looks alike (a fresh one) fails here.
	marker := "/tmp/drivertest-adopt-" + a.nonce
	if _, err := a.client.Upload(ctx, marker, strings.NewReader(a.token)); err != nil {
		t.Fatalf("upload marker: %v", err)
	}
	st := a.box.State()
	if st.Driver != s.name {
		t.Errorf("State().Driver = %q, want the driver's name %q", st.Driver, s.name)
	}
	st = throughStore(t, st)
	var thaw func() error
	if s.cfg.freeze != nil {
		var err error
		if thaw, err = s.cfg.freeze(ctx, a.id); err != nil {
			t.Fatalf("freeze the guest: %v", err)
		}
		t.Log("the guest is held still while its host goes and a new one comes")
	}
	// The daemon that made the box dies: its connections to it end as
	// they are, the idle ones it kept open for reuse among them (no
	// goodbye reaches the agent: the client is closed only after).
	n, err := Sever(a.id)
	if err != nil {
		t.Fatal(err)
	}
	a.client.Close()
	t.Logf("the old daemon's %d connections to the box severed", n)
	d2 := s.newDriver(t)
	if err := d2.Available(ctx); err != nil {
		t.Fatalf("Available of a new driver instance: %v", err)
	}
	t0 := time.Now()
	b, err := d2.Adopt(ctx, st)
	if err != nil {
		t.Fatalf("Adopt of a running box: %v", err)
	}
	t.Logf("Adopt: %s", time.Since(t0).Round(time.Millisecond))
	nb := &sbox{id: a.id, token: a.token, nonce: a.nonce, box: b, client: agentclient.New(b.DialAgent, a.token)}
	s.root.Cleanup(func() {
		nb.client.Close()
		if err := b.Stop(context.Background()); err != nil {
			s.root.Errorf("final Stop of adopted %s: %v", a.id, err)
		}
	})
	select {
	case <-b.Wait():
		t.Fatal("a running box was adopted as dead")
	case <-time.After(time.Second):
	}
	type execResult struct {
		res agentclient.ExecResult
		err error
	}
	first := make(chan execResult, 1)
	go func() {
		res, err := nb.client.Exec(ctx, agentclient.ExecRequest{Command: `printf %s "$DRIVERTEST_NONCE"; cat ` + marker}, nil)
		first <- execResult{res, err}
	}()
	if thaw != nil {
		// The first request is on its way while the guest is still.
		time.Sleep(2 * time.Second)
		if err := thaw(); err != nil {
			t.Fatalf("let the guest run again: %v", err)
		}
	}
	var r execResult
	select {
	case r = <-first:
	case <-time.After(time.Minute):
		t.Fatal("exec through the adopted box: no answer a minute after the guest ran again")
	}
	if r.err != nil {
		t.Fatalf("exec through the adopted box: %v", r.err)
	}
	if got, want := string(r.res.Stdout), a.nonce+a.token; got != want || r.res.ExitCode != 0 {
		t.Errorf("exec through the adopted box: stdout %q exit %d, want %q exit 0 (the same box)", got, r.res.ExitCode, want)
	}
	if _, err := nb.client.Desktop.Screenshot(ctx, connect.NewRequest(&desktoppb.ScreenshotRequest{Format: "png"})); err != nil {
		t.Errorf("screenshot through the adopted box: %v", err)
	}
	if !alive(a.box) {
		t.Error("adopting the box through a new driver instance killed it (the old handle's Wait closed)")
	}
	return nb
}

// cleanup has a new driver instance (a daemon at start) run Cleanup with
// keep holding only the main box: orphan must be gone without a trace,
// its handle must see it die, and the main box must go on answering.
// live says whether orphan is still running.
func (s *suite) cleanup(t *testing.T, orphan, kept *sbox, live bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if live {
		s.requireVisible(t, orphan.id)
	}
	d3 := s.newDriver(t)
	t0 := time.Now()
	if err := d3.Cleanup(ctx, map[string]bool{kept.id: true}); err != nil {
		t.Errorf("Cleanup: %v", err)
	}
	t.Logf("Cleanup: %s", time.Since(t0).Round(time.Millisecond))
	s.assertNoTraces(t, orphan.id, "after Cleanup removed it")
	if live {
		select {
		case <-orphan.box.Wait():
		case <-time.After(30 * time.Second):
			t.Error("the orphan's handle: Wait not closed 30 s after Cleanup removed it")
		}
	}
	if !alive(kept.box) {
		t.Fatal("Cleanup killed the box it was told to keep (Wait closed)")
	}
	res, err := kept.client.Exec(ctx, agentclient.ExecRequest{Command: `printf %s "$DRIVERTEST_NONCE"`}, nil)
	if err != nil || string(res.Stdout) != kept.nonce {
		t.Errorf("the kept box after Cleanup: exec = %q, %v; want %q", res.Stdout, err, kept.nonce)
	}
	if live {
		if nb := s.adoptDeadState(t, orphan.box.State()); nb != nil {
			s.stop(t, orphan.id, nb)
		}
		s.stop(t, orphan.id, orphan.box)
	}
}

// crash kills every host process of the box (as the OOM killer or a crash
// would) and checks that its handle reports it dead, and that a new driver
// instance adopting it from its State does too. It returns the adopted
// handle (nil when Adopt refused the dead box), not stopped.
func (s *suite) crash(t *testing.T, sb *sbox) driver.Box {
	pids := s.requireVisible(t, sb.id)
	t0 := time.Now()
	for deadline := time.Now().Add(10 * time.Second); len(pids) > 0; pids = ProcessIDs(sb.id) {
		if time.Now().After(deadline) {
			t.Fatalf("processes of %s survive SIGKILL for 10 s: %v", sb.id, pids)
		}
		for _, pid := range pids {
			_ = killPid(pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-sb.box.Wait():
		t.Logf("Wait closed %s after the box's processes were killed", time.Since(t0).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Error("Wait not closed 30 s after every process of the box was killed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := sb.box.DialAgent(ctx); err == nil {
		c.Close()
		t.Error("DialAgent of a dead box succeeded")
	}
	return s.adoptDeadState(t, sb.box.State())
}

// adoptDeadState has a new driver instance adopt a box that is no longer
// running. Adopt may refuse (an error: Cleanup then removes what is left)
// or return a box whose Wait is closed at once, which it returns.
func (s *suite) adoptDeadState(t *testing.T, st driver.State) driver.Box {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := s.newDriver(t).Adopt(ctx, throughStore(t, st))
	if err != nil {
		t.Logf("Adopt of a dead box refused it: %v", err)
		return nil
	}
	s.root.Cleanup(func() { _ = b.Stop(context.Background()) })
	select {
	case <-b.Wait():
	case <-time.After(10 * time.Second):
		t.Error("Adopt of a dead box: Wait not closed after 10 s (a dead box reported alive)")
	}
	return b
}

// stop stops the box through each handle, twice, checks each reports it
// dead and unreachable, and that nothing of it is left.
func (s *suite) stop(t *testing.T, id string, handles ...driver.Box) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, b := range handles {
		if b == nil {
			continue
		}
		for n := 1; n <= 2; n++ {
			if err := b.Stop(ctx); err != nil {
				t.Errorf("handle %d of %s: Stop #%d: %v", i, id, n, err)
			}
		}
		select {
		case <-b.Wait():
		case <-time.After(10 * time.Second):
			t.Errorf("handle %d of %s: Wait not closed 10 s after Stop", i, id)
		}
		if c, err := b.DialAgent(ctx); err == nil {
			c.Close()
			t.Errorf("handle %d of %s: DialAgent after Stop succeeded", i, id)
		}
	}
	s.assertNoTraces(t, id, "after Stop")
}

// requireVisible checks that the scan sees the running box — at least one
// host process and one path under the state directories — so that the leak
// checks looking for the same things cannot pass by looking in the wrong
// place. It returns the box's processes.
func (s *suite) requireVisible(t *testing.T, id string) []int {
	t.Helper()
	tr, err := Scan(id, s.cfg.stateDirs, s.extraPaths(id))
	if err != nil {
		t.Errorf("scan: %v", err)
	}
	if len(tr.Processes) == 0 || len(tr.Paths) == 0 {
		t.Fatalf("the leak scan does not see the running box %s (want a process and a path under %v):%s", id, s.cfg.stateDirs, tr)
	}
	t.Logf("traces of running box %s:%s", id, tr)
	return ProcessIDs(id)
}

func (s *suite) extraPaths(id string) []string {
	if s.cfg.paths == nil {
		return nil
	}
	return s.cfg.paths(id)
}

// assertNoTraces fails t when anything of box id is left on the host.
func (s *suite) assertNoTraces(t *testing.T, id, when string) {
	t.Helper()
	tr, err := Scan(id, s.cfg.stateDirs, s.extraPaths(id))
	if err != nil {
		t.Errorf("scan: %v", err)
	}
	if !tr.Empty() {
		t.Errorf("%s, box %s left on the host:%s", when, id, tr)
	}
}

// alive reports whether b's Wait is still open.
func alive(b driver.Box) bool {
	select {
	case <-b.Wait():
		return false
	default:
		return true
	}
}

// throughStore returns st as the manager's store gives it back: encoded
// and decoded as JSON.
func throughStore(t *testing.T, st driver.State) driver.State {
	t.Helper()
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatalf("State does not encode as JSON: %v", err)
	}
	var back driver.State
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatalf("State does not decode from JSON: %v", err)
	}
	return back
}

// randomString returns n random characters of [a-z0-9], valid in sandbox
// IDs, so that the boxes of one run cannot be mistaken for another's.
func randomString(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// sampler scans the traces of id every few milliseconds until stopped and
// keeps the largest set it saw: what a Create had made when it was cut.
type sampler struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	most Traces
}

func startSampler(id string, stateDirs []string) *sampler {
	sm := &sampler{stop: make(chan struct{})}
	sm.wg.Add(1)
	go func() {
		defer sm.wg.Done()
		for {
			// Processes and paths only: a losetup per sample would slow
			// the Create under test.
			procs, _ := processes(id)
			tr := Traces{Processes: procs, Paths: paths(id, stateDirs, nil)}
			sm.mu.Lock()
			if tr.count() > sm.most.count() {
				sm.most = tr
			}
			sm.mu.Unlock()
			select {
			case <-sm.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return sm
}

// Stop ends the sampling and returns the most it saw.
func (sm *sampler) Stop() Traces {
	close(sm.stop)
	sm.wg.Wait()
	return sm.most
}
