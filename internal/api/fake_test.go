package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/proto/desktop"
	"github.com/cubicle-dev/cubicle/proto/desktop/desktopconnect"
	"github.com/cubicle-dev/cubicle/proto/filesystem"
	"github.com/cubicle-dev/cubicle/proto/filesystem/filesystemconnect"
	"github.com/cubicle-dev/cubicle/proto/process"
	"github.com/cubicle-dev/cubicle/proto/process/processconnect"
)

const (
	testKey    = "test-key-0123456789"
	runningID  = "sbrunning"
	stoppedID  = "sbstopped"
	headlessID = "sbheadless" // running, without a desktop
	agentToken = "agent-token"
)

// fakeManager is a Manager over an in-memory set of sandboxes.
type fakeManager struct {
	mu         sync.Mutex
	sandboxes  map[string]sandbox.Sandbox
	agent      *agentclient.Client
	err        error // returned by every call that can fail, when set
	resumeErr  error // returned by Resume, the sandbox left paused, when set
	lastCreate sandbox.CreateRequest
	lastWait   bool
	lastFilter sandbox.Filter
	lastTO     int
	ending     map[string]chan struct{}
	touched    int                       // Touch calls
	agentCalls int                       // Agent calls (each one is activity)
	volumes    map[string]sandbox.Volume // by owner + "/" + name
	snapshots  map[string]snapOf         // by ID
	recordings map[string]recOf          // by ID (recordings_test.go)
	lastSnap   struct {
		id, owner, name string
		metadata        map[string]string
	}
	lastVolume struct {
		owner, name string
		sizeMB      int
	}
	lastLogs struct { // logs_test.go
		id, owner string
		q         consolelog.Query
	}
}

func newFakeManager() *fakeManager {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	mk := func(id string, st sandbox.State) sandbox.Sandbox {
		return sandbox.Sandbox{ID: id, State: st, Template: "desktop", Backend: "runc", Isolation: "namespace",
			Resolution: sandbox.Resolution{Width: 1024, Height: 768}, CreatedAt: now, ExpiresAt: now.Add(time.Hour),
			LastActiveAt: now, Metadata: map[string]string{}, Desktop: ptr(true)}
	}
	headless := mk(headlessID, sandbox.StateRunning)
	headless.Desktop = ptr(false)
	return &fakeManager{sandboxes: map[string]sandbox.Sandbox{
		runningID:  mk(runningID, sandbox.StateRunning),
		stoppedID:  mk(stoppedID, sandbox.StateStopped),
		headlessID: headless,
	}, ending: map[string]chan struct{}{runningID: make(chan struct{}), headlessID: make(chan struct{})}}
}

func (m *fakeManager) Create(_ context.Context, req sandbox.CreateRequest, wait bool) (sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastCreate, m.lastWait = req, wait
	if m.err != nil {
		return sandbox.Sandbox{}, m.err
	}
	sb := sandbox.Sandbox{ID: "sbnew", State: sandbox.StateRunning, Template: req.Template, Metadata: req.Metadata, Desktop: ptr(true)}
	if !wait {
		sb.State = sandbox.StateStarting
	}
	return sb, nil
}

func (m *fakeManager) List(_ context.Context, f sandbox.Filter) []sandbox.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastFilter = f
	var out []sandbox.Sandbox
	for _, id := range []string{runningID, stoppedID} {
		if sb := m.sandboxes[id]; f.State == "" || sb.State == f.State {
			out = append(out, sb)
		}
	}
	return out
}

func (m *fakeManager) Get(_ context.Context, id string) (sandbox.Sandbox, error) {
	if id == "panic" {
		panic("boom: secret detail")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return sandbox.Sandbox{}, m.err
	}
	sb, ok := m.sandboxes[id]
	if !ok {
		return sb, errdefs.NotFound("sandbox %s not found", id)
	}
	return sb, nil
}

func (m *fakeManager) Destroy(ctx context.Context, id string) error {
	_, err := m.Get(ctx, id)
	return err
}

// stop marks a sandbox stopped and tells its watchers, as a destroy does.
func (m *fakeManager) stop(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb := m.sandboxes[id]
	sb.State = sandbox.StateStopped
	m.sandboxes[id] = sb
	if c := m.ending[id]; c != nil {
		close(c)
		delete(m.ending, id)
	}
}

func (m *fakeManager) Watch(ctx context.Context, id string) (*agentclient.Client, <-chan struct{}, error) {
	c, err := m.watchAgent(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return c, m.ending[id], nil
}

func (m *fakeManager) Touch(context.Context, string) {
	m.mu.Lock()
	m.touched++
	m.mu.Unlock()
}

func (m *fakeManager) Fork(ctx context.Context, id, owner string, count int) ([]sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	if sb.State != sandbox.StateRunning {
		return nil, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	out := make([]sandbox.Sandbox, count)
	for i := range out {
		c := sb
		c.ID = fmt.Sprintf("%sf%d", id, len(m.sandboxes))
		m.sandboxes[c.ID] = c
		out[i] = c
	}
	return out, nil
}

func (m *fakeManager) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok {
		return sandbox.Sandbox{}, errdefs.NotFound("sandbox %s not found", id)
	}
	if sb.State != sandbox.StateRunning {
		return sandbox.Sandbox{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	sb.State = sandbox.StatePaused
	m.sandboxes[id] = sb
	return sb, nil
}

func (m *fakeManager) Resume(ctx context.Context, id string, seconds int) (sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok {
		return sandbox.Sandbox{}, errdefs.NotFound("sandbox %s not found", id)
	}
	if sb.State != sandbox.StatePaused {
		return sandbox.Sandbox{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	if m.resumeErr != nil {
		return sandbox.Sandbox{}, m.resumeErr
	}
	sb.State = sandbox.StateRunning
	m.sandboxes[id] = sb
	return sb, nil
}

func (m *fakeManager) SetTimeout(ctx context.Context, id string, seconds int) (sandbox.Sandbox, error) {
	m.mu.Lock()
	m.lastTO = seconds
	m.mu.Unlock()
	return m.Get(ctx, id)
}

func (m *fakeManager) Agent(ctx context.Context, id string) (*agentclient.Client, error) {
	m.mu.Lock()
	m.agentCalls++
	m.mu.Unlock()
	return m.watchAgent(ctx, id)
}

// watchAgent is Agent without counting activity.
func (m *fakeManager) watchAgent(ctx context.Context, id string) (*agentclient.Client, error) {
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != sandbox.StateRunning {
		return nil, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	return m.agent, nil
}

func (m *fakeManager) Backends(context.Context) []sandbox.BackendInfo {
	return []sandbox.BackendInfo{{Name: "runc", Available: true, Isolation: "namespace"}}
}
func (m *fakeManager) DefaultBackend() string    { return "runc" }
func (m *fakeManager) Pools() []sandbox.PoolInfo { return []sandbox.PoolInfo{} }

func (m *fakeManager) Capacity() sandbox.Capacity {
	return sandbox.Capacity{MaxSandboxes: 10, Running: 1}
}

// The fake's volumes keep only what the API layer shows: the manager's
// own rules (names, sizes, quotas, attachment) are sandbox's tests'.
func (m *fakeManager) CreateVolume(_ context.Context, owner, name string, sizeMB int) (sandbox.Volume, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastVolume.owner, m.lastVolume.name, m.lastVolume.sizeMB = owner, name, sizeMB
	if m.err != nil {
		return sandbox.Volume{}, m.err
	}
	if m.volumes == nil {
		m.volumes = map[string]sandbox.Volume{}
	}
	if _, ok := m.volumes[owner+"/"+name]; ok {
		return sandbox.Volume{}, errdefs.Conflict("volume %s already exists", name)
	}
	v := sandbox.Volume{Name: name, SizeMB: sizeMB, CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	m.volumes[owner+"/"+name] = v
	return v, nil
}

func (m *fakeManager) ListVolumes(_ context.Context, owner string) []sandbox.Volume {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []sandbox.Volume
	for k, v := range m.volumes {
		if strings.HasPrefix(k, owner+"/") {
			out = append(out, v)
		}
	}
	return out
}

func (m *fakeManager) GetVolume(_ context.Context, owner, name string) (sandbox.Volume, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.volumes[owner+"/"+name]
	if !ok {
		return sandbox.Volume{}, errdefs.NotFound("volume %s not found", name)
	}
	return v, nil
}

func (m *fakeManager) DeleteVolume(_ context.Context, owner, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.volumes[owner+"/"+name]
	switch {
	case !ok:
		return errdefs.NotFound("volume %s not found", name)
	case v.AttachedTo != "":
		return errdefs.Conflict("volume %s is attached to sandbox %s", name, v.AttachedTo)
	}
	delete(m.volumes, owner+"/"+name)
	return nil
}

// snapOf is a fake snapshot and the key it belongs to.
type snapOf struct {
	sandbox.Snapshot
	owner string
}

// The fake's snapshots keep only what the API layer shows, as its
// volumes do.
func (m *fakeManager) CreateSnapshot(_ context.Context, id, owner, name string, md map[string]string) (sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastSnap.id, m.lastSnap.owner, m.lastSnap.name, m.lastSnap.metadata = id, owner, name, md
	if m.err != nil {
		return sandbox.Snapshot{}, m.err
	}
	sb, ok := m.sandboxes[id]
	switch {
	case !ok:
		return sandbox.Snapshot{}, errdefs.NotFound("sandbox %s not found", id)
	case sb.State != sandbox.StateRunning:
		return sandbox.Snapshot{}, errdefs.Conflict("sandbox %s is %s", id, sb.State)
	}
	if m.snapshots == nil {
		m.snapshots = map[string]snapOf{}
	}
	s := sandbox.Snapshot{ID: fmt.Sprintf("snap%d", len(m.snapshots)), Name: name, SandboxID: id, Template: sb.Template,
		Backend: sb.Backend, Resolution: sb.Resolution, SizeBytes: 1 << 20, CreatedAt: sb.CreatedAt, Metadata: md}
	if s.Metadata == nil {
		s.Metadata = map[string]string{}
	}
	m.snapshots[s.ID] = snapOf{s, owner}
	return s, nil
}

func (m *fakeManager) ListSnapshots(_ context.Context, owner, sandboxID string) []sandbox.Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []sandbox.Snapshot
	for _, s := range m.snapshots {
		if s.owner == owner && (sandboxID == "" || s.SandboxID == sandboxID) {
			out = append(out, s.Snapshot)
		}
	}
	return out
}

func (m *fakeManager) findSnap(owner, ref string) (snapOf, bool) {
	for _, s := range m.snapshots {
		if s.owner == owner && (s.ID == ref || s.Name == ref) {
			return s, true
		}
	}
	return snapOf{}, false
}

func (m *fakeManager) GetSnapshot(_ context.Context, owner, ref string) (sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.findSnap(owner, ref)
	if !ok {
		return sandbox.Snapshot{}, errdefs.NotFound("snapshot %s not found", ref)
	}
	return s.Snapshot, nil
}

func (m *fakeManager) DeleteSnapshot(_ context.Context, owner, ref string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.findSnap(owner, ref)
	if !ok {
		return errdefs.NotFound("snapshot %s not found", ref)
	}
	delete(m.snapshots, s.ID)
	return nil
}

// fakeAgent is an in-sandbox agent: real Connect handlers over test
// implementations, and the /files endpoints, on an httptest server.
type fakeAgent struct {
	mu       sync.Mutex
	files    map[string][]byte
	lastShot *desktop.ScreenshotRequest
	lastAct  *desktop.ActRequest
	lastProc *process.StartRequest
	lastUser string // Authorization of the last Start
	stdin    []byte // written by SendInput
	stdinEOF chan struct{}
	closeIn  sync.Once
	vnc      fakeVNC
}

func (a *fakeAgent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(desktopconnect.NewDesktopHandler(&fakeDesktop{a: a}))
	mux.Handle(processconnect.NewProcessHandler(&fakeProcess{a: a}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&fakeFS{a: a}))
	mux.HandleFunc("/files", a.serveFiles)
	mux.HandleFunc("GET /forward", a.forward) // VNC, or DevTools (cdp_test.go)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(agentclient.TokenHeader) != agentToken {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (a *fakeAgent) serveFiles(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.Method {
	case http.MethodPost:
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		a.files[p] = b
		w.Header().Set("X-Cubicle-Size", itoa(len(b)))
	case http.MethodGet:
		b, ok := a.files[p]
		if !ok {
			http.Error(w, "no such file "+p, http.StatusNotFound)
			return
		}
		_, _ = w.Write(b)
	}
}

type fakeDesktop struct {
	desktopconnect.UnimplementedDesktopHandler
	a    *fakeAgent
	clip string // clipboard_set's text, under a.mu
}

func (d *fakeDesktop) Screenshot(_ context.Context, req *connect.Request[desktop.ScreenshotRequest]) (*connect.Response[desktop.ScreenshotResponse], error) {
	d.a.mu.Lock()
	d.a.lastShot = req.Msg
	d.a.mu.Unlock()
	return connect.NewResponse(shotFor(req.Msg)), nil
}

func shotFor(r *desktop.ScreenshotRequest) *desktop.ScreenshotResponse {
	f := r.GetFormat()
	if f == "" {
		f = "png"
	}
	return &desktop.ScreenshotResponse{Format: f, Width: 1024, Height: 768, Data: []byte("IMG-" + f)}
}

func (d *fakeDesktop) Act(_ context.Context, req *connect.Request[desktop.ActRequest]) (*connect.Response[desktop.ActResponse], error) {
	d.a.mu.Lock()
	d.a.lastAct = req.Msg
	defer d.a.mu.Unlock()
	resp := &desktop.ActResponse{FailedIndex: -1}
	for i, act := range req.Msg.GetActions() {
		if act.X != nil && act.GetX() >= 1024 {
			resp.FailedIndex, resp.Error, resp.ErrorCode = int32(i), "point outside the screen", "invalid_argument"
			break
		}
		if act.GetType() == "wait" && act.GetDurationMs() == 59998 {
			resp.FailedIndex, resp.Error, resp.ErrorCode = int32(i), "the X display went away", "unavailable"
			break
		}
		if act.GetType() == "wait" && act.GetDurationMs() == 59999 {
			resp.FailedIndex, resp.Error, resp.ErrorCode = int32(i), "X connection lost at /tmp/.X11-unix", "internal"
			break
		}
		res := &desktop.ActionResult{Type: act.GetType()}
		switch act.GetType() {
		case "cursor_position":
			res.X, res.Y = 5, 0
		case "screen_size":
			res.Width, res.Height = 1024, 768
		case "screenshot":
			res.Screenshot = shotFor(act.GetScreenshot())
		case "windows":
			res.Windows = []*desktop.Window{{Id: 7, Title: "Chromium", Class: "chromium", Width: 800, Height: 600, Focused: true}}
		case "clipboard_set":
			d.clip = act.GetText()
		case "clipboard_get":
			res.Text = d.clip
		}
		resp.Results = append(resp.Results, res)
	}
	return connect.NewResponse(resp), nil
}

type fakeProcess struct {
	processconnect.UnimplementedProcessHandler
	a *fakeAgent
}

type chunk struct {
	stream string
	data   string
}

// script returns the output and exit code of a fake command.
func script(cfg *process.ProcessConfig) ([]chunk, int) {
	cmd := cfg.GetCmd()
	if cmd == "/bin/sh" && len(cfg.GetArgs()) == 2 {
		cmd = cfg.GetArgs()[1]
	} else {
		return []chunk{{"stdout", strings.Join(append([]string{cmd}, cfg.GetArgs()...), " ") + "\n"}}, 0
	}
	switch cmd {
	case "echo hi":
		return []chunk{{"stdout", "hi\n"}}, 0
	case "fail":
		return []chunk{{"stdout", "out\n"}, {"stderr", "bad\n"}}, 3
	case "big":
		var cs []chunk
		for range 10 {
			cs = append(cs, chunk{"stdout", strings.Repeat("x", 10)})
		}
		return cs, 0
	case "utf8":
		// "é€" split inside characters, then an invalid byte.
		return []chunk{{"stdout", "\xc3"}, {"stdout", "\xa9\xe2"}, {"stdout", "\x82\xac"}, {"stderr", "\xff!"}}, 0
	case "env":
		return []chunk{{"stdout", cfg.GetEnvs()["FOO"] + " " + cfg.GetCwd()}}, 0
	}
	return nil, 127
}

func (p *fakeProcess) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	p.a.mu.Lock()
	p.a.lastProc = req.Msg
	p.a.lastUser = req.Header().Get("Authorization")
	p.a.mu.Unlock()
	send := func(ev *process.ProcessEvent) error { return st.Send(&process.StartResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 4242}}}); err != nil {
		return err
	}
	out, code := script(req.Msg.GetProcess())
	exited := true
	switch args := req.Msg.GetProcess().GetArgs(); {
	case len(args) == 2 && args[1] == "sleep":
		<-ctx.Done()
		return ctx.Err()
	case len(args) == 2 && args[1] == "cat":
		select {
		case <-p.a.stdinEOF:
		case <-ctx.Done():
			return ctx.Err()
		}
		p.a.mu.Lock()
		out, code = []chunk{{"stdout", string(p.a.stdin)}}, 0
		p.a.mu.Unlock()
	case len(args) == 2 && args[1] == "hang":
		ms, _ := strconv.Atoi(req.Header().Get("X-Cubicle-Process-Timeout-Ms"))
		if ms == 0 {
			return connect.NewError(connect.CodeInvalidArgument, errorString("no timeout"))
		}
		time.Sleep(time.Duration(ms) * time.Millisecond)
		out, code, exited = []chunk{{"stdout", "partial"}}, -1, false
	}
	for _, c := range out {
		d := &process.ProcessEvent_DataEvent{}
		if c.stream == "stdout" {
			d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte(c.data)}
		} else {
			d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte(c.data)}
		}
		if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}); err != nil {
			return err
		}
	}
	return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{
		ExitCode: int32(code), Exited: exited, Status: "exit status " + itoa(code)}}})
}

func (p *fakeProcess) SendInput(_ context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p.a.mu.Lock()
	defer p.a.mu.Unlock()
	p.a.stdin = append(p.a.stdin, req.Msg.GetInput().GetStdin()...)
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (p *fakeProcess) CloseStdin(context.Context, *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p.a.closeIn.Do(func() { close(p.a.stdinEOF) })
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

type fakeFS struct {
	filesystemconnect.UnimplementedFilesystemHandler
	a *fakeAgent
}

func (f *fakeFS) ListDir(_ context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	f.a.mu.Lock()
	defer f.a.mu.Unlock()
	dir := req.Msg.GetPath()
	resp := &filesystem.ListDirResponse{}
	found := false
	for p, b := range f.a.files {
		if path.Dir(p) != dir {
			continue
		}
		found = true
		resp.Entries = append(resp.Entries, &filesystem.EntryInfo{
			Name: path.Base(p), Path: p, Type: filesystem.FileType_FILE_TYPE_FILE, Size: int64(len(b)), Mode: 0o644,
			ModifiedTime: timestamppb.New(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)),
		})
	}
	if !found && dir != "/" {
		return nil, connect.NewError(connect.CodeNotFound, errorString("directory not found: "+dir))
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeFS) Remove(_ context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	f.a.mu.Lock()
	defer f.a.mu.Unlock()
	if _, ok := f.a.files[req.Msg.GetPath()]; !ok {
		return nil, connect.NewError(connect.CodeNotFound, errorString("no such file: "+req.Msg.GetPath()))
	}
	delete(f.a.files, req.Msg.GetPath())
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

type errorString string

func (e errorString) Error() string { return string(e) }

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// testEnv is an API handler over a fake manager and a fake agent.
type testEnv struct {
	t       *testing.T
	mgr     *fakeManager
	agent   *fakeAgent
	metrics *metrics.Metrics
	logs    *syncBuffer
	h       http.Handler
	srv     *server
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newTestEnv(t *testing.T, cfg Config) *testEnv {
	t.Helper()
	if cfg.APIKeys == nil {
		cfg.APIKeys = []string{"other-key", testKey}
	}
	fa := &fakeAgent{files: map[string][]byte{}, stdinEOF: make(chan struct{})}
	agentSrv := httptest.NewServer(fa.handler())
	t.Cleanup(agentSrv.Close)
	addr := agentSrv.Listener.Addr().String()
	client := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}, agentToken)
	t.Cleanup(client.Close)

	mgr := newFakeManager()
	mgr.agent = client
	logs := &syncBuffer{}
	m := metrics.New()
	srv := newServer(cfg, mgr, m, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return &testEnv{t: t, mgr: mgr, agent: fa, metrics: m, logs: logs, h: srv, srv: srv}
}

// do sends a request with the test API key; headers are name, value pairs
// and override it.
func (e *testEnv) do(method, target string, body io.Reader, headers ...string) *httptest.ResponseRecorder {
	e.t.Helper()
	r := httptest.NewRequest(method, target, body)
	r.Header.Set("X-API-Key", testKey)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			r.Header.Del(headers[i])
			continue
		}
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

// errorOf decodes an error body, failing the test when it is not one.
func errorOf(t *testing.T, w *httptest.ResponseRecorder) apiError {
	t.Helper()
	var body errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Error.Code == "" {
		t.Fatalf("body %q is not an error body (err %v)", w.Body.String(), err)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type = %q, want application/json", ct)
	}
	return body.Error
}

// wantError checks an answer's status and error code.
func wantError(t *testing.T, w *httptest.ResponseRecorder, status int, code string) apiError {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body.String())
	}
	e := errorOf(t, w)
	if e.Code != code {
		t.Errorf("error code = %q, want %q (message %q)", e.Code, code, e.Message)
	}
	return e
}

// decode decodes a JSON answer with status 200 (or want).
func decode[T any](t *testing.T, w *httptest.ResponseRecorder, want int) T {
	t.Helper()
	if w.Code != want {
		t.Fatalf("status = %d, want %d; body %s", w.Code, want, w.Body.String())
	}
	var v T
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %q: %v", w.Body.String(), err)
	}
	return v
}

func ptr[T any](v T) *T { return &v }
