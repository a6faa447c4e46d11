package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
	"github.com/cubicle-dev/cubicle/internal/needs"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
	"github.com/cubicle-dev/cubicle/proto/desktop/desktopconnect"
)

// The manager's unit tests use fakeDriver, a test double named as such: its
// boxes are in-process HTTP servers answering the agent's Info RPC. The real
// backends are exercised by the driver conformance and end-to-end tests.

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type readyAgent struct {
	desktopconnect.UnimplementedDesktopHandler
	shutdowns *atomic.Int32 // Shutdown calls
	d         *fakeDriver
	id        string
}

// appliedSession is what a fake box's ApplySession was given, and the
// token the call carried.
type appliedSession struct {
	req       *desktoppb.ApplySessionRequest
	callToken string
}

// Rekey records a fork's re-key, refused when the driver says so.
func (a readyAgent) Rekey(_ context.Context, req *connect.Request[desktoppb.RekeyRequest]) (*connect.Response[desktoppb.RekeyResponse], error) {
	a.d.mu.Lock()
	defer a.d.mu.Unlock()
	if a.d.failRekey {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("fake: refused"))
	}
	if a.d.rekeyed == nil {
		a.d.rekeyed = map[string]rekeyed{}
	}
	a.d.rekeyed[a.id] = rekeyed{req: req.Msg, callToken: req.Header().Get("X-Cubicle-Token")}
	return connect.NewResponse(&desktoppb.RekeyResponse{}), nil
}

// rekeyed is what a fake box's Rekey was given, and the token the call
// carried.
type rekeyed struct {
	req       *desktoppb.RekeyRequest
	callToken string
}

// ApplySession acts out the agent's: once per box, refused when the
// driver says so.
func (a readyAgent) ApplySession(_ context.Context, req *connect.Request[desktoppb.ApplySessionRequest]) (*connect.Response[desktoppb.ApplySessionResponse], error) {
	a.d.mu.Lock()
	defer a.d.mu.Unlock()
	if a.d.failApply {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("fake: refused"))
	}
	if _, ok := a.d.applied[a.id]; ok {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("fake: this sandbox already has its session"))
	}
	if a.d.applied == nil {
		a.d.applied = map[string]appliedSession{}
	}
	a.d.applied[a.id] = appliedSession{req: req.Msg, callToken: req.Header().Get("X-Cubicle-Token")}
	if b := a.d.boxes[a.id]; a.d.dieOnApply && b != nil {
		// The box dies as the session is applied: its answer still
		// arrives, its Wait is closed.
		b.once.Do(func() { close(b.dead) })
	}
	return connect.NewResponse(&desktoppb.ApplySessionResponse{}), nil
}

func (a readyAgent) Shutdown(context.Context, *connect.Request[desktoppb.ShutdownRequest]) (*connect.Response[desktoppb.ShutdownResponse], error) {
	a.shutdowns.Add(1)
	return connect.NewResponse(&desktoppb.ShutdownResponse{}), nil
}

func (a readyAgent) Info(context.Context, *connect.Request[desktoppb.InfoRequest]) (*connect.Response[desktoppb.InfoResponse], error) {
	usable := true
	if a.d != nil {
		usable = a.d.infoCalls.Add(1) > a.d.usableAfter
	}
	return connect.NewResponse(&desktoppb.InfoResponse{Ready: true, Usable: usable, Width: 1024, Height: 768}), nil
}

// headlessAgent is the agent of a sandbox whose image has no X server.
type headlessAgent struct {
	desktopconnect.UnimplementedDesktopHandler
}

func (headlessAgent) Info(context.Context, *connect.Request[desktoppb.InfoRequest]) (*connect.Response[desktoppb.InfoResponse], error) {
	return connect.NewResponse(&desktoppb.InfoResponse{Headless: true}), nil
}

type fakeDriver struct {
	t          *testing.T
	dir        string
	headless   bool  // boxes have no desktop
	neverReady bool  // boxes' desktops never become ready
	failErr    error // Create fails with this when set
	// hold, when set, keeps Create waiting until it is closed, so a
	// test can see a sandbox that is still starting.
	hold chan struct{}
	// stopFails is how many Stop calls fail (then succeed), as an
	// unmount that is busy for a while would.
	stopFails int
	noVolumes bool // the backend cannot attach volumes
	failApply bool // ApplySession is refused
	// dieOnApply makes a box die as its ApplySession answers.
	dieOnApply bool
	failRekey  bool               // Rekey is refused
	rekeyed    map[string]rekeyed // by box ID
	shutdowns  atomic.Int32
	applied    map[string]appliedSession // by box ID
	// usableAfter is how many Info calls answer ready but not usable
	// (the windows of the session still coming up); infoCalls counts.
	usableAfter int32
	infoCalls   atomic.Int32

	specs map[string]driver.Spec // what each Create was given, by ID

	mu    sync.Mutex
	boxes map[string]*fakeBox // live boxes
}

func newFakeDriver(t *testing.T) *fakeDriver {
	return &fakeDriver{t: t, dir: t.TempDir(), boxes: map[string]*fakeBox{}}
}

func (d *fakeDriver) Name() string                    { return "gvisor" }
func (d *fakeDriver) Isolation() string               { return driver.IsolationGVisor }
func (d *fakeDriver) Available(context.Context) error { return nil }

func (d *fakeDriver) AttachesVolumes() bool { return !d.noVolumes }

func (d *fakeDriver) Create(ctx context.Context, spec driver.Spec) (driver.Box, error) {
	d.mu.Lock()
	if d.specs == nil {
		d.specs = map[string]driver.Spec{}
	}
	d.specs[spec.ID] = spec
	hold := d.hold
	d.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if d.failErr != nil {
		return nil, d.failErr
	}
	sock := filepath.Join(d.dir, spec.ID+".sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	switch {
	case d.neverReady:
		mux.Handle(desktopconnect.NewDesktopHandler(desktopconnect.UnimplementedDesktopHandler{}))
	case d.headless:
		mux.Handle(desktopconnect.NewDesktopHandler(headlessAgent{}))
	default:
		mux.Handle(desktopconnect.NewDesktopHandler(readyAgent{shutdowns: &d.shutdowns, d: d, id: spec.ID}))
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	b := &fakeBox{d: d, id: spec.ID, sock: sock, srv: srv, dead: make(chan struct{})}
	d.mu.Lock()
	d.boxes[spec.ID] = b
	d.mu.Unlock()
	return b, nil
}

func (d *fakeDriver) Adopt(ctx context.Context, st driver.State) (driver.Box, error) {
	var id string
	if err := json.Unmarshal(st.Data, &id); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return nil, fmt.Errorf("box %s is gone", id)
	}
	return b, nil
}

func (d *fakeDriver) Cleanup(ctx context.Context, keep map[string]bool) error {
	d.mu.Lock()
	var orphans []*fakeBox
	for id, b := range d.boxes {
		if !keep[id] {
			orphans = append(orphans, b)
		}
	}
	d.mu.Unlock()
	for _, b := range orphans {
		b.Stop(ctx)
	}
	return nil
}

func (d *fakeDriver) live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.boxes)
}

type fakeBox struct {
	d    *fakeDriver
	id   string
	sock string
	srv  *http.Server
	once sync.Once
	dead chan struct{}
}

func (b *fakeBox) DialAgent(ctx context.Context) (net.Conn, error) {
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", b.sock)
}

func (b *fakeBox) State() driver.State {
	data, _ := json.Marshal(b.id)
	return driver.State{Version: 1, Driver: "gvisor", Data: data}
}

func (b *fakeBox) Wait() <-chan struct{} { return b.dead }

// crash simulates the box dying on its own.
func (b *fakeBox) crash() {
	b.once.Do(func() { b.srv.Close(); close(b.dead) })
}

func (b *fakeBox) Stop(context.Context) error {
	b.crash()
	b.d.mu.Lock()
	if b.d.stopFails > 0 {
		b.d.stopFails--
		b.d.mu.Unlock()
		return errors.New("unmount: device or resource busy")
	}
	delete(b.d.boxes, b.id)
	b.d.mu.Unlock()
	return nil
}

func newTestManager(t *testing.T, d *fakeDriver, dataDir string, clock Clock) *Manager {
	t.Helper()
	m, err := New(context.Background(), Config{
		DataDir:        dataDir,
		Drivers:        map[string]driver.Driver{"gvisor": d},
		DefaultBackend: "auto",
		Images:         func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes:   2,
		IdleTimeout:    time.Minute,
		MaxLifetime:    time.Hour,
		ReapInterval:   time.Hour, // tests call Reap themselves
		Clock:          clock,
		Metrics:        metrics.New(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCreateGetDestroy(t *testing.T) {
	d := newFakeDriver(t)
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m := newTestManager(t, d, t.TempDir(), clock)
	defer m.Close()
	ctx := context.Background()

	sb, err := m.Create(ctx, CreateRequest{Metadata: map[string]string{"k": "v"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != StateRunning || sb.Backend != "gvisor" || sb.Template != "desktop" {
		t.Fatalf("got %+v", sb)
	}
	if len(sb.ID) != 26 {
		t.Errorf("id %q: want 26 chars of base32 (128 bits)", sb.ID)
	}
	if got, want := sb.ExpiresAt.Sub(sb.CreatedAt), time.Hour; got != want {
		t.Errorf("lifetime = %v, want %v", got, want)
	}
	if got := m.List(ctx, Filter{Metadata: map[string]string{"k": "v"}}); len(got) != 1 {
		t.Errorf("metadata filter: got %d sandboxes, want 1", len(got))
	}
	if got := m.List(ctx, Filter{Metadata: map[string]string{"k": "x"}}); len(got) != 0 {
		t.Errorf("metadata filter mismatch: got %d sandboxes, want 0", len(got))
	}
	if _, err := m.Agent(ctx, sb.ID); err != nil {
		t.Fatalf("Agent: %v", err)
	}
	_, ending, err := m.Watch(ctx, sb.ID)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	select {
	case <-ending:
		t.Fatal("ending closed while running")
	default:
	}
	if err := m.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ending:
	default:
		t.Error("ending still open after destroy")
	}
	if _, _, err := m.Watch(ctx, sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Watch on stopped sandbox: %v, want conflict", err)
	}
	if d.live() != 0 {
		t.Errorf("live boxes after destroy = %d, want 0", d.live())
	}
	got, err := m.Get(ctx, sb.ID)
	if err != nil || got.State != StateStopped {
		t.Fatalf("after destroy: %+v, %v", got, err)
	}
	if _, err := m.Agent(ctx, sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Agent on stopped sandbox: %v, want conflict", err)
	}
	if err := m.Destroy(ctx, sb.ID); err != nil {
		t.Errorf("second destroy: %v, want nil (idempotent)", err)
	}
	if _, err := m.Get(ctx, "nosuchid"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get unknown: %v, want not found", err)
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	d := newFakeDriver(t)
	d.failErr = errors.New("boom")
	m := newTestManager(t, d, t.TempDir(), &fakeClock{now: time.Now()})
	defer m.Close()
	_, err := m.Create(context.Background(), CreateRequest{}, true)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("err = %v, want unavailable", err)
	}
	if n := len(m.List(context.Background(), Filter{})); n != 0 {
		t.Errorf("%d sandboxes listed after failed create, want 0", n)
	}
	recs, _ := m.store.all()
	if len(recs) != 0 {
		t.Errorf("%d store records after failed create, want 0", len(recs))
	}
	// A full disk is said as such, without the host's paths.
	d.failErr = &os.PathError{Op: "mkdir", Path: "/var/lib/cubicle/oci/gvisor/x", Err: syscall.ENOSPC}
	_, err = m.Create(context.Background(), CreateRequest{}, true)
	if msg := errdefs.UserMessage(err); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(msg, "data directory is full") || strings.Contains(msg, "/var/lib") {
		t.Errorf("create on a full disk: %v (message %q)", err, msg)
	}
}

// TestCreateFailureOnFullDisk: runsc and mkfs.ext4 say a full disk only as
// an exit status, so the manager looks at the data directory itself.
func TestCreateFailureOnFullDisk(t *testing.T) {
	needs.Root(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "cubicle-test", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	d := newFakeDriver(t)
	d.failErr = errors.New("runsc run: exit status 128")
	m := newTestManager(t, d, dir, &fakeClock{now: time.Now()})
	defer m.Close()
	_, err := m.Create(context.Background(), CreateRequest{}, true)
	if msg := errdefs.UserMessage(err); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(msg, "data directory is full") || strings.Contains(msg, "runsc") {
		t.Errorf("create failing on a 4 MiB data dir: %v (message %q)", err, msg)
	}
	if recs, _ := m.store.all(); len(recs) != 0 {
		t.Errorf("%d store records after the failed create, want 0", len(recs))
	}
}

func TestCapacity(t *testing.T) {
	d := newFakeDriver(t)
	m := newTestManager(t, d, t.TempDir(), &fakeClock{now: time.Now()})
	defer m.Close()
	ctx := context.Background()
	for range 2 {
		if _, err := m.Create(ctx, CreateRequest{}, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Create(ctx, CreateRequest{}, true); !errors.Is(err, errdefs.ErrCapacity) {
		t.Fatalf("third create: %v, want capacity exhausted", err)
	}
	if c := m.Capacity(); c.Running != 2 || c.MaxSandboxes != 2 {
		t.Errorf("capacity = %+v", c)
	}
}

func TestReaper(t *testing.T) {
	tests := []struct {
		name      string
		req       CreateRequest
		advance   time.Duration
		touch     string // "agent" (an API call) or "watch"/"touch" halfway
		wantState State
	}{
		{"fresh stays", CreateRequest{}, 30 * time.Second, "", StateRunning},
		{"idle reaped", CreateRequest{}, 61 * time.Second, "", StateStopped},
		{"activity resets idle", CreateRequest{}, 61 * time.Second, "agent", StateRunning},
		{"watching is not activity", CreateRequest{}, 61 * time.Second, "watch", StateStopped},
		{"touch resets idle", CreateRequest{}, 61 * time.Second, "touch", StateRunning},
		{"custom idle", CreateRequest{IdleTimeoutSeconds: 10}, 11 * time.Second, "", StateStopped},
		{"expired", CreateRequest{TimeoutSeconds: 20, IdleTimeoutSeconds: 3600}, 21 * time.Second, "", StateStopped},
		{"timeout capped by max lifetime", CreateRequest{TimeoutSeconds: 7200, IdleTimeoutSeconds: 7200}, 61 * time.Minute, "", StateStopped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newFakeDriver(t)
			clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			m := newTestManager(t, d, t.TempDir(), clock)
			defer m.Close()
			ctx := context.Background()
			sb, err := m.Create(ctx, tt.req, true)
			if err != nil {
				t.Fatal(err)
			}
			half := tt.advance / 2
			clock.Advance(half)
			switch tt.touch {
			case "agent":
				if _, err := m.Agent(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
			case "watch":
				if _, _, err := m.Watch(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
			case "touch":
				m.Touch(ctx, sb.ID)
			}
			m.Reap()
			clock.Advance(tt.advance - half)
			m.Reap()
			waitState(t, m, sb.ID, tt.wantState)
			if tt.wantState == StateStopped && d.live() != 0 {
				t.Errorf("live boxes = %d after reap, want 0", d.live())
			}
		})
	}
}

func TestRetentionPurgesRecords(t *testing.T) {
	d := newFakeDriver(t)
	clock := &fakeClock{now: time.Now()}
	m := newTestManager(t, d, t.TempDir(), clock)
	defer m.Close()
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	clock.Advance(11 * time.Minute)
	m.Reap()
	if _, err := m.Get(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after retention: %v, want not found", err)
	}
}

func TestDeadBoxReaped(t *testing.T) {
	d := newFakeDriver(t)
	m := newTestManager(t, d, t.TempDir(), &fakeClock{now: time.Now()})
	defer m.Close()
	sb, err := m.Create(context.Background(), CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	b := d.boxes[sb.ID]
	d.mu.Unlock()
	b.crash()
	waitState(t, m, sb.ID, StateStopped)
	if d.live() != 0 {
		t.Errorf("dead box not cleaned: %d live", d.live())
	}
}

func TestRestartReadopts(t *testing.T) {
	d := newFakeDriver(t)
	dataDir := t.TempDir()
	clock := &fakeClock{now: time.Now()}
	m := newTestManager(t, d, dataDir, clock)
	ctx := context.Background()
	a, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// While the daemon is away, b's box dies.
	d.mu.Lock()
	bb := d.boxes[b.ID]
	delete(d.boxes, b.ID)
	d.mu.Unlock()
	bb.crash()
	// And the daemon had died in the middle of a create and of a destroy.
	st, err := openStore(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for id, state := range map[string]State{"halfmade": StateStarting, "halfgone": StateStopping} {
		if err := st.put(&record{Sandbox: Sandbox{ID: id, State: state, Backend: "gvisor"}}); err != nil {
			t.Fatal(err)
		}
	}
	st.close()

	m2 := newTestManager(t, d, dataDir, clock)
	defer m2.Close()
	if got, err := m2.Get(ctx, "halfmade"); err != nil || got.State != StateFailed || !strings.Contains(got.Error, "while the sandbox was starting") {
		t.Errorf("create cut by the restart: %+v %v, want failed with the reason", got, err)
	}
	if got, err := m2.Get(ctx, "halfgone"); err != nil || got.State != StateStopped {
		t.Errorf("destroy cut by the restart: %+v %v, want stopped", got, err)
	}
	if got, err := m2.Get(ctx, a.ID); err != nil || got.State != StateRunning {
		t.Fatalf("a after restart: %+v %v", got, err)
	}
	if _, err := m2.Agent(ctx, a.ID); err != nil {
		t.Errorf("a not usable after restart: %v", err)
	}
	if got, err := m2.Get(ctx, b.ID); err != nil || got.State != StateStopped {
		t.Fatalf("b after restart: %+v %v, want stopped", got, err)
	}
	if d.live() != 1 {
		t.Errorf("live boxes = %d, want 1", d.live())
	}
}

func waitState(t *testing.T, m *Manager, id string, want State) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sb, err := m.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("state = %s, want %s", sb.State, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOwnerQuotas(t *testing.T) {
	d := newFakeDriver(t)
	dataDir := t.TempDir()
	clock := &fakeClock{now: time.Now()}
	mk := func() *Manager {
		m, err := New(context.Background(), Config{
			DataDir: dataDir, Drivers: map[string]driver.Driver{"gvisor": d}, DefaultBackend: "auto",
			Images:       func(string) (string, error) { return "/nonexistent", nil },
			MaxSandboxes: 10, MaxPerOwner: 2, OwnerCreateRate: 1, OwnerCreateBurst: 3,
			IdleTimeout: time.Minute, MaxLifetime: time.Hour, ReapInterval: time.Hour, Clock: clock, Metrics: metrics.New(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := mk()
	ctx := context.Background()
	alice, bob := KeyOwner("alice-key"), KeyOwner("bob-key")
	if alice == bob || strings.Contains(alice, "alice") {
		t.Fatalf("owners %q, %q: want distinct digests without the key", alice, bob)
	}
	a1, err := m.Create(ctx, CreateRequest{Owner: alice}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, CreateRequest{Owner: alice}, true); err != nil {
		t.Fatal(err)
	}
	// Alice is at her limit; Bob and the keyless are not limited by it.
	if _, err := m.Create(ctx, CreateRequest{Owner: alice}, true); !errors.Is(err, errdefs.ErrCapacity) || !strings.Contains(err.Error(), "API key") {
		t.Fatalf("alice's third: %v, want capacity exhausted for the key", err)
	}
	if _, err := m.Create(ctx, CreateRequest{Owner: bob}, true); err != nil {
		t.Fatalf("bob: %v", err)
	}
	for range 3 {
		if _, err := m.Create(ctx, CreateRequest{}, true); err != nil {
			t.Fatalf("no owner: %v", err)
		}
	}
	// Alice's creates were 3 (the refused one counts): her burst is spent.
	if err := m.Destroy(ctx, a1.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, CreateRequest{Owner: alice}, true); !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("alice's fourth create within the second: %v, want rate limited", err)
	}
	clock.Advance(1100 * time.Millisecond)
	a3, err := m.Create(ctx, CreateRequest{Owner: alice}, true)
	if err != nil {
		t.Fatalf("alice after a destroy and a second: %v", err)
	}
	// The owner is kept across a restart: the quota still holds.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(10 * time.Second)
	m2 := mk()
	defer m2.Close()
	if _, err := m2.Get(ctx, a3.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Create(ctx, CreateRequest{Owner: alice}, true); !errors.Is(err, errdefs.ErrCapacity) {
		t.Fatalf("alice's third after a restart: %v, want capacity exhausted", err)
	}
}

// TestStopRetried: a stop that cannot free everything leaves the sandbox
// failed, with the reason; reaper passes try again until it works, and the
// sandbox then is stopped and nothing of it is left.
func TestStopRetried(t *testing.T) {
	d := newFakeDriver(t)
	clock := &fakeClock{now: time.Now()}
	m := newTestManager(t, d, t.TempDir(), clock)
	defer m.Close()
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	d.stopFails = 2
	d.mu.Unlock()
	if err := m.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := m.Get(ctx, sb.ID)
	if got.State != StateFailed || !strings.Contains(got.Error, "busy") || d.live() != 1 {
		t.Fatalf("after a failed stop: %+v, %d live boxes", got, d.live())
	}
	m.Reap() // fails again
	waitFor := func(cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal("timed out")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.stopFails == 0 })
	// The record outlives the retention while its leftovers remain.
	clock.Advance(48 * time.Hour)
	waitFor(func() bool { m.mu.Lock(); defer m.mu.Unlock(); return !m.entries[sb.ID].retrying })
	m.Reap() // succeeds
	waitFor(func() bool { got, _ := m.Get(ctx, sb.ID); return got.State == StateStopped })
	if d.live() != 0 {
		t.Errorf("%d boxes left after the retried stop", d.live())
	}
	if got, _ := m.Get(ctx, sb.ID); got.Error != "" {
		t.Errorf("error kept after a stop that worked: %q", got.Error)
	}
}

// TestSharedCreateRate checks that a cluster's shared budget decides a
// key's creates while it answers, with the key's rate and burst, and that
// the node's own limit takes over while it cannot be reached.
func TestSharedCreateRate(t *testing.T) {
	d := newFakeDriver(t)
	clock := &fakeClock{now: time.Now()}
	m, err := New(context.Background(), Config{
		DataDir: t.TempDir(), Drivers: map[string]driver.Driver{"gvisor": d}, DefaultBackend: "auto",
		Images:       func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes: 10, OwnerCreateRate: 1, OwnerCreateBurst: 2,
		IdleTimeout: time.Minute, MaxLifetime: time.Hour, ReapInterval: time.Hour, Clock: clock, Metrics: metrics.New(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	alice := KeyOwner("alice-key")
	var answer struct {
		ok  bool
		err error
	}
	var asked []string
	m.SetSharedRate(func(_ context.Context, owner string, r float64, burst int) (bool, error) {
		asked = append(asked, fmt.Sprintf("%s %g %d", owner, r, burst))
		return answer.ok, answer.err
	})
	// The cluster says no: refused, though this node's budget is full.
	if _, err := m.Create(ctx, CreateRequest{Owner: alice}, true); !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("create the cluster refused: %v, want rate limited", err)
	}
	if want := alice + " 1 2"; len(asked) != 1 || asked[0] != want {
		t.Errorf("asked %q, want [%q]", asked, want)
	}
	// The cluster says yes, more often than this node's burst allows.
	answer.ok = true
	for i := range 3 {
		if _, err := m.Create(ctx, CreateRequest{Owner: alice}, true); err != nil {
			t.Fatalf("create %d the cluster allowed: %v", i, err)
		}
	}
	// A create without a key is not counted anywhere.
	if _, err := m.Create(ctx, CreateRequest{}, true); err != nil || len(asked) != 4 {
		t.Fatalf("keyless create: %v, asked %d times", err, len(asked))
	}
	// The cluster unreachable: this node's own burst of 2, then 429.
	answer.err = errors.New("etcd away")
	for i, want := range []error{nil, nil, errdefs.ErrRateLimited} {
		if _, err := m.Create(ctx, CreateRequest{Owner: alice}, true); !errors.Is(err, want) && (want != nil || err != nil) {
			t.Fatalf("create %d without the cluster: %v, want %v", i, err, want)
		}
	}
}

// TestHeadless checks that a sandbox whose agent reports no desktop is
// ready as soon as the agent answers, and says it has no desktop, while a
// desktop sandbox says it has one; both survive a restart so.
func TestHeadless(t *testing.T) {
	ctx := context.Background()
	for _, headless := range []bool{false, true} {
		d := newFakeDriver(t)
		d.headless = headless
		dir := t.TempDir()
		m := newTestManager(t, d, dir, wallClock{})
		sb, err := m.Create(ctx, CreateRequest{}, true)
		if err != nil {
			t.Fatalf("headless=%v: create: %v", headless, err)
		}
		if sb.State != StateRunning || sb.Desktop == nil || *sb.Desktop == headless {
			t.Errorf("headless=%v: created %+v, want running with Desktop %v", headless, sb, !headless)
		}
		// Not known before the agent has said. The box is held in its
		// start, or a fast fake could be ready before Create returns.
		hold := make(chan struct{})
		d.mu.Lock()
		d.hold = hold
		d.mu.Unlock()
		if starting, err := m.Create(ctx, CreateRequest{}, false); err != nil || starting.State != StateStarting || starting.Desktop != nil {
			t.Errorf("headless=%v: a starting sandbox = %+v, %v; want starting, desktop not said", headless, starting, err)
		}
		d.mu.Lock()
		d.hold = nil
		d.mu.Unlock()
		close(hold)
		m.Close()
		m = newTestManager(t, d, dir, wallClock{})
		if got, err := m.Get(ctx, sb.ID); err != nil || got.State != StateRunning || got.Desktop == nil || *got.Desktop == headless {
			t.Errorf("headless=%v: after restart %+v, %v", headless, got, err)
		}
		m.Close()
	}
}

// TestRecordWithoutDesktop checks that records written before sandboxes
// could be headless read as having a desktop once running, and that a
// sandbox not yet started says nothing.
func TestRecordWithoutDesktop(t *testing.T) {
	for _, c := range []struct {
		json string
		want string // "true", "false" or "unknown"
	}{
		{`{"sandbox":{"id":"old","state":"running"}}`, "true"},
		{`{"sandbox":{"id":"old","state":"stopped"}}`, "true"},
		{`{"sandbox":{"id":"old","state":"starting"}}`, "unknown"},
		{`{"sandbox":{"id":"new","state":"running","desktop":false}}`, "false"},
		{`{"sandbox":{"id":"new","state":"running","desktop":true}}`, "true"},
	} {
		r, err := decodeRecord([]byte(c.json))
		if err != nil {
			t.Fatal(err)
		}
		got := "unknown"
		if r.Sandbox.Desktop != nil {
			got = strconv.FormatBool(*r.Sandbox.Desktop)
		}
		if got != c.want {
			t.Errorf("decodeRecord(%s): desktop %s, want %s", c.json, got, c.want)
		}
	}
}

// TestSandboxGaugeNeverEmpty scrapes cubicle_sandboxes while the manager
// updates it (as every state change of any sandbox does): each scrape must
// see the one running sandbox, never a gauge that was cleared to be rebuilt.
func TestSandboxGaugeNeverEmpty(t *testing.T) {
	d := newFakeDriver(t)
	m := newTestManager(t, d, t.TempDir(), wallClock{})
	defer m.Close()
	if _, err := m.Create(context.Background(), CreateRequest{}, true); err != nil {
		t.Fatal(err)
	}
	running := func() float64 {
		mfs, err := m.m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "cubicle_sandboxes" {
				continue
			}
			for _, metric := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range metric.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["state"] == "running" && labels["backend"] == "gvisor" {
					return metric.GetGauge().GetValue()
				}
			}
		}
		return 0
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				m.updateGauges()
			}
		}
	}()
	bad := 0
	for i := 0; i < 3000; i++ {
		if v := running(); v != 1 {
			bad++
		}
	}
	close(stop)
	<-done
	if bad > 0 {
		t.Errorf("%d of 3000 scrapes saw other than 1 running sandbox", bad)
	}
}

// TestAbandonedCreate checks that a create whose caller goes away before the
// sandbox is ready is undone at once: it holds no slot and no box, and no
// record of it remains (nobody learned its ID).
func TestAbandonedCreate(t *testing.T) {
	d := newFakeDriver(t)
	d.neverReady = true
	m := newTestManager(t, d, t.TempDir(), wallClock{})
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := m.Create(ctx, CreateRequest{}, true)
	if !errors.Is(err, errdefs.ErrTimeout) {
		t.Fatalf("create = %v, want ErrTimeout", err)
	}
	if n := m.Capacity().Running; n != 0 {
		t.Errorf("%d slots held after the caller went away, want 0", n)
	}
	if n := d.live(); n != 0 {
		t.Errorf("%d boxes left running", n)
	}
	if sbs := m.List(context.Background(), Filter{}); len(sbs) != 0 {
		t.Errorf("sandboxes listed: %+v", sbs)
	}
	if recs, err := m.store.all(); err != nil || len(recs) != 0 {
		t.Errorf("records stored: %d, %v", len(recs), err)
	}
	if n := testutil.ToFloat64(m.m.CreateFailures.WithLabelValues("gvisor")); n != 0 {
		t.Errorf("cubicle_create_failures_total = %v for a create its caller abandoned, want 0", n)
	}
	// The slot is free for the next create.
	d.neverReady = false
	if _, err := m.Create(context.Background(), CreateRequest{}, true); err != nil {
		t.Errorf("next create: %v", err)
	}
}

// probingDriver is a fake backend that must probe-boot a guest
// (driver.Prober) and whose probe fails, as a Firecracker on a KVM that
// hangs guests would; it counts its Cleanup calls.
type probingDriver struct {
	*fakeDriver
	probes, cleanups atomic.Int32
}

func (d *probingDriver) Name() string      { return "firecracker" }
func (d *probingDriver) Isolation() string { return driver.IsolationVM }
func (d *probingDriver) Probe(context.Context) error {
	d.probes.Add(1)
	return errors.New("a probe boot did not reach the guest's init: FAKE")
}
func (d *probingDriver) Cleanup(ctx context.Context, keep map[string]bool) error {
	d.cleanups.Add(1)
	return d.fakeDriver.Cleanup(ctx, keep)
}

// TestProbeGate checks that a backend whose probe boot fails is passed over
// by "auto" with the reason, refused by name with it, reported unavailable
// with it, and still gets its orphans cleaned at start.
func TestProbeGate(t *testing.T) {
	fc := &probingDriver{fakeDriver: newFakeDriver(t)}
	gv := newFakeDriver(t)
	m, err := New(context.Background(), Config{
		DataDir: t.TempDir(), DefaultBackend: "auto",
		Drivers: map[string]driver.Driver{"firecracker": fc, "gvisor": gv},
		Images:  func(string) (string, error) { return "/nonexistent", nil },
		Metrics: metrics.New(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if n := fc.cleanups.Load(); n != 1 {
		t.Errorf("orphan cleanup of the probing backend ran %d times at start, want 1", n)
	}
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateRequest{}, true)
	if err != nil || sb.Backend != "gvisor" {
		t.Fatalf("auto create = %+v, %v; want it on gvisor", sb, err)
	}
	if _, err := m.Create(ctx, CreateRequest{Backend: "firecracker"}, true); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "FAKE") {
		t.Errorf("create on firecracker = %v, want unavailable with the probe's reason", err)
	}
	for _, b := range m.Backends(ctx) {
		if b.Name == "firecracker" && (b.Available || !strings.Contains(b.Reason, "did not reach the guest's init")) {
			t.Errorf("Backends: %+v, want firecracker unavailable with the probe's reason", b)
		}
	}
	if fc.live() != 0 {
		t.Error("a box was made on the backend whose probe failed")
	}
}
