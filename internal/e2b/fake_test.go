package e2b

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// The real manager must satisfy the interface this package consumes.
var _ Manager = (*sandbox.Manager)(nil)

// t0 is the fake clock's time.
var t0 = time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)

// fakeManager is an in-memory Manager. List filters metadata the way the
// real manager does (a missing key reads as the empty value), so tests see
// whether the server applies E2B's stricter rule itself.
type fakeManager struct {
	mu         sync.Mutex
	sbs        map[string]sandbox.Sandbox
	n          int
	created    []sandbox.CreateRequest
	timeouts   []int
	destroyed  []string
	paused     []string // ids Pause was called for
	resumed    []int    // the timeouts Resume was called with
	pauseErr   error    // what Pause answers, when set
	forkErr    error    // what Fork answers, when set
	forks      []int    // the counts Fork was called with
	createErr  error
	getErr     error
	panicOnGet bool
	snaps      []fakeSnap // in creation order
	snapErr    error      // what CreateSnapshot answers, when set

	// usage is what Usage has of each sandbox (metrics_test.go).
	usage map[string][]sandbox.UsageSample
	// logs, logOwners and logQueries are for Logs (logs_test.go).
	logs       map[string]*consolelog.Ring
	logOwners  map[string]string
	logQueries []consolelog.Query
}

// fakeSnap is a snapshot of the fake and its owner.
type fakeSnap struct {
	sandbox.Snapshot
	owner string
}

func newFakeManager() *fakeManager {
	return &fakeManager{sbs: map[string]sandbox.Sandbox{}}
}

// add puts a sandbox in the fake as is.
func (f *fakeManager) add(sb sandbox.Sandbox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	f.sbs[sb.ID] = sb
}

func (f *fakeManager) Create(ctx context.Context, req sandbox.CreateRequest, wait bool) (sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, req)
	if f.createErr != nil {
		return sandbox.Sandbox{}, f.createErr
	}
	if req.FromSnapshot != "" {
		if _, ok := f.snapLocked(req.Owner, req.FromSnapshot); !ok {
			return sandbox.Sandbox{}, errdefs.NotFound("snapshot %s not found", req.FromSnapshot)
		}
	}
	if !wait {
		return sandbox.Sandbox{}, fmt.Errorf("fake: create without wait")
	}
	f.n++
	backend := req.Backend
	if backend == "" {
		backend = "gvisor"
	}
	sb := sandbox.Sandbox{
		ID: fmt.Sprintf("sbx%017d", f.n), State: sandbox.StateRunning, Template: req.Template,
		Backend: backend, CreatedAt: t0, ExpiresAt: t0.Add(time.Duration(req.TimeoutSeconds) * time.Second),
		Metadata: maps.Clone(req.Metadata),
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	f.sbs[sb.ID] = sb
	return sb, nil
}

func (f *fakeManager) List(ctx context.Context, flt sandbox.Filter) []sandbox.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sandbox.Sandbox
	for _, sb := range f.sbs {
		if flt.State != "" && sb.State != flt.State {
			continue
		}
		ok := true
		for k, v := range flt.Metadata {
			if sb.Metadata[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, sb)
		}
	}
	return out
}

func (f *fakeManager) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panicOnGet {
		panic("fake: get")
	}
	if f.getErr != nil {
		return sandbox.Sandbox{}, f.getErr
	}
	sb, ok := f.sbs[id]
	if !ok {
		return sandbox.Sandbox{}, errdefs.NotFound("sandbox %s not found", id)
	}
	return sb, nil
}

func (f *fakeManager) Destroy(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return errdefs.NotFound("sandbox %s not found", id)
	}
	f.destroyed = append(f.destroyed, id)
	sb.State = sandbox.StateStopped
	f.sbs[id] = sb
	return nil
}

func (f *fakeManager) SetTimeout(ctx context.Context, id string, seconds int) (sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return sandbox.Sandbox{}, errdefs.NotFound("sandbox %s not found", id)
	}
	if sb.State != sandbox.StateRunning && sb.State != sandbox.StateStarting {
		return sandbox.Sandbox{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	f.timeouts = append(f.timeouts, seconds)
	sb.ExpiresAt = t0.Add(time.Duration(seconds) * time.Second)
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeManager) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return sandbox.Sandbox{}, errdefs.NotFound("sandbox %s not found", id)
	}
	if f.pauseErr != nil {
		return sandbox.Sandbox{}, f.pauseErr
	}
	if sb.State != sandbox.StateRunning {
		return sandbox.Sandbox{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	f.paused = append(f.paused, id)
	sb.State = sandbox.StatePaused
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeManager) Resume(ctx context.Context, id string, seconds int) (sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return sandbox.Sandbox{}, errdefs.NotFound("sandbox %s not found", id)
	}
	if sb.State != sandbox.StatePaused {
		return sandbox.Sandbox{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	f.resumed = append(f.resumed, seconds)
	sb.State = sandbox.StateRunning
	sb.ExpiresAt = t0.Add(time.Duration(seconds) * time.Second)
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeManager) Fork(ctx context.Context, id, owner string, count int) ([]sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	f.forks = append(f.forks, count)
	if f.forkErr != nil {
		return nil, f.forkErr
	}
	if sb.State != sandbox.StateRunning {
		return nil, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	var out []sandbox.Sandbox
	for range count {
		f.n++
		c := sb
		c.ID = fmt.Sprintf("sbx%017d", f.n)
		c.Metadata = maps.Clone(sb.Metadata)
		f.sbs[c.ID] = c
		out = append(out, c)
	}
	return out, nil
}

func (f *fakeManager) CreateSnapshot(ctx context.Context, id, owner, name string, md map[string]string) (sandbox.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	switch {
	case !ok:
		return sandbox.Snapshot{}, errdefs.NotFound("sandbox %s not found", id)
	case f.snapErr != nil:
		return sandbox.Snapshot{}, f.snapErr
	case sb.State != sandbox.StateRunning:
		return sandbox.Snapshot{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	s := sandbox.Snapshot{ID: fmt.Sprintf("snap%016d", len(f.snaps)), Name: name, SandboxID: id,
		CreatedAt: t0.Add(time.Duration(len(f.snaps)) * time.Second), Metadata: md}
	f.snaps = append(f.snaps, fakeSnap{s, owner})
	return s, nil
}

func (f *fakeManager) snapLocked(owner, ref string) (int, bool) {
	for i, s := range f.snaps {
		if s.owner == owner && (s.ID == ref || s.Name == ref) {
			return i, true
		}
	}
	return 0, false
}

func (f *fakeManager) ListSnapshots(ctx context.Context, owner, sandboxID string) []sandbox.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sandbox.Snapshot
	for _, s := range f.snaps {
		if s.owner == owner && (sandboxID == "" || s.SandboxID == sandboxID) {
			out = append(out, s.Snapshot)
		}
	}
	return out
}

func (f *fakeManager) DeleteSnapshot(ctx context.Context, owner, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.snapLocked(owner, ref)
	if !ok {
		return errdefs.NotFound("snapshot %s not found", ref)
	}
	f.snaps = slices.Delete(f.snaps, i, i+1)
	return nil
}

// testKey and testTokenKey are the API key and token key of test servers.
const testKey = "e2b_0123456789abcdef"

var testTokenKey = []byte("token-key-for-tests")

// newTestServer returns a Server on a fake manager with the test key, the
// test token key and a fixed clock; edit changes the config first.
func newTestServer(t *testing.T, edit func(*Config)) (*Server, *fakeManager) {
	t.Helper()
	cfg := Config{APIKeys: []string{"other-key", testKey}, TokenKey: testTokenKey}
	if edit != nil {
		edit(&cfg)
	}
	f := newFakeManager()
	s := New(cfg, f, nil)
	s.now = func() time.Time { return t0 }
	return s, f
}

// do sends one request through s with the test key (unless headers has an
// auth header of its own, or noKey).
func do(t *testing.T, h http.Handler, method, target, body string, headers map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, r)
	if headers == nil {
		req.Header.Set("X-API-KEY", testKey)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// keys returns the sorted keys of a JSON object.
func keys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}
