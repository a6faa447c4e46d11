package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image"
)

// daemon is a canned stand-in for cubicled that records requests.
type daemon struct {
	mu   sync.Mutex
	reqs []seen
	srv  *httptest.Server
}

type seen struct {
	Method, Path string
	Query        map[string][]string
	Key          string
	Accept       string
	Body         []byte
}

const sandboxJSON = `{"id":"abc123","state":"running","template":"desktop","backend":"gvisor","isolation":"gvisor",
 "resolution":{"width":1024,"height":768},"created_at":"2030-01-01T11:00:00Z","expires_at":"2030-01-01T13:30:00Z",
 "last_active_at":"2030-01-01T11:59:00Z","metadata":{"owner":"me"}}`

func newDaemon(t *testing.T) *daemon {
	d := &daemon{}
	mux := http.NewServeMux()
	jsonAnswer := func(status int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}
	}
	notFound := `{"error":{"code":"not_found","message":"sandbox nope not found"}}`
	mux.HandleFunc("POST /v1/sandboxes", jsonAnswer(201, sandboxJSON))
	mux.HandleFunc("GET /v1/sandboxes", jsonAnswer(200, `{"sandboxes":[`+sandboxJSON+`]}`))
	mux.HandleFunc("GET /v1/sandboxes/abc123", jsonAnswer(200, sandboxJSON))
	mux.HandleFunc("GET /v1/sandboxes/nope", jsonAnswer(404, notFound))
	mux.HandleFunc("DELETE /v1/sandboxes/abc123", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.HandleFunc("DELETE /v1/sandboxes/nope", jsonAnswer(404, notFound))
	mux.HandleFunc("POST /v1/sandboxes/abc123/actions", jsonAnswer(200, `{"results":[{"type":"click"}],"duration_ms":3}`))
	mux.HandleFunc("GET /v1/sandboxes/abc123/screenshot", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "\xff\xd8JPEG")
	})
	mux.HandleFunc("POST /v1/sandboxes/abc123/exec", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") == "application/x-ndjson" {
			_, _ = io.WriteString(w, "{\"stdout\":\"hello\\n\"}\n{\"stderr\":\"oops\\n\"}\n{\"exit_code\":3}\n")
			return
		}
		_, _ = io.WriteString(w, `{"exit_code":3,"stdout":"hello\n","stderr":"oops\n","duration_ms":1}`)
	})
	mux.HandleFunc("PUT /v1/sandboxes/abc123/files", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_ = json.NewEncoder(w).Encode(map[string]any{"path": r.URL.Query().Get("path"), "size": len(b)})
	})
	mux.HandleFunc("GET /v1/sandboxes/abc123/files", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "file contents")
	})
	mux.HandleFunc("POST /v1/sandboxes/abc123/view", jsonAnswer(200, `{"url":"http://h/view/abc123?token=t","expires_at":"2030-01-01T12:10:00Z"}`))
	volJSON := `{"name":"profile","size_mb":1024,"used_mb":37,"created_at":"2030-01-01T10:00:00Z","attached_to":"abc123"}`
	mux.HandleFunc("POST /v1/volumes", jsonAnswer(201, volJSON))
	mux.HandleFunc("GET /v1/volumes", jsonAnswer(200, `{"volumes":[`+volJSON+`]}`))
	mux.HandleFunc("GET /v1/volumes/profile", jsonAnswer(200, volJSON))
	mux.HandleFunc("DELETE /v1/volumes/profile", jsonAnswer(409, `{"error":{"code":"conflict","message":"volume profile is attached to sandbox abc123"}}`))
	mux.HandleFunc("DELETE /v1/volumes/old", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	snapJSON := `{"id":"snap1","name":"logged-in","sandbox_id":"abc123","template":"desktop","backend":"qemu","resolution":{"width":1024,"height":768},"size_bytes":734003200,"created_at":"2030-01-01T10:00:00Z","metadata":{}}`
	mux.HandleFunc("POST /v1/sandboxes/abc123/snapshots", jsonAnswer(201, snapJSON))
	mux.HandleFunc("GET /v1/snapshots", jsonAnswer(200, `{"snapshots":[`+snapJSON+`]}`))
	mux.HandleFunc("GET /v1/snapshots/logged-in", jsonAnswer(200, snapJSON))
	mux.HandleFunc("DELETE /v1/snapshots/logged-in", jsonAnswer(409, `{"error":{"code":"conflict","message":"snapshot snap1 is in use: 1 sandboxes are starting from it"}}`))
	mux.HandleFunc("DELETE /v1/snapshots/old", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.HandleFunc("POST /v1/sandboxes/abc123/fork", jsonAnswer(201, `{"sandboxes":[{"id":"fork1","state":"running"},{"id":"fork2","state":"running"}]}`))
	mux.HandleFunc("GET /v1/info", jsonAnswer(200, `{"version":"v1.2.3","default_backend":"gvisor","backends":[{"name":"gvisor","available":true,"isolation":"gvisor"}],"capacity":{"max_sandboxes":8,"running":1}}`))
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		d.mu.Lock()
		d.reqs = append(d.reqs, seen{r.Method, r.URL.Path, r.URL.Query(), r.Header.Get("X-API-Key"), r.Header.Get("Accept"), b})
		d.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *daemon) last(t *testing.T) seen {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.reqs) == 0 {
		t.Fatal("no request")
	}
	return d.reqs[len(d.reqs)-1]
}

type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the CLI against d with env as the environment.
func runCLI(t *testing.T, d *daemon, env map[string]string, stdin string, args ...string) (result, *app) {
	t.Helper()
	if env == nil {
		env = map[string]string{"CUBICLE_URL": d.srv.URL, "CUBICLE_API_KEY": "k3y"}
	}
	var out, errOut bytes.Buffer
	a := newApp(strings.NewReader(stdin), &out, &errOut, func(k string) string { return env[k] })
	a.images = &fakeImages{}
	a.openURL = func(string) error { t.Fatal("openURL called"); return nil }
	code := run(context.Background(), a, args)
	return result{code, out.String(), errOut.String()}, a
}

func TestMain(m *testing.M) {
	now = func() time.Time { return time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC) }
	os.Exit(m.Run())
}

func jsonEq(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("body %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("body = %s\nwant %s", got, want)
	}
}

func TestCreate(t *testing.T) {
	d := newDaemon(t)
	r, _ := runCLI(t, d, nil, "", "create", "--template", "desktop", "--backend", "qemu", "--width", "1280", "--height", "800",
		"--dpi", "96", "--vcpus", "2", "--memory", "2048", "--timeout", "1h", "--idle-timeout", "600", "--start-url", "https://example.org",
		"--env", "A=1", "--env", "B=2", "--metadata", "owner=me", "--egress", "10.0.0.0/8", "--no-wait")
	if r.code != 0 || r.stdout != "abc123\n" {
		t.Fatalf("got %+v", r)
	}
	req := d.last(t)
	if req.Method != "POST" || req.Path != "/v1/sandboxes" || req.Query["wait"][0] != "false" || req.Key != "k3y" {
		t.Errorf("request = %+v", req)
	}
	jsonEq(t, req.Body, `{"template":"desktop","backend":"qemu","resolution":{"width":1280,"height":800},"dpi":96,"vcpus":2,
		"memory_mb":2048,"timeout_seconds":3600,"idle_timeout_seconds":600,"start_url":"https://example.org",
		"env":{"A":"1","B":"2"},"metadata":{"owner":"me"},"network":{"egress":{"allow":["10.0.0.0/8"]}}}`)

	r, _ = runCLI(t, d, nil, "", "create", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"isolation": "gvisor"`) {
		t.Errorf("--json: %+v", r)
	}
	if _, ok := d.last(t).Query["wait"]; ok {
		t.Error("wait=false sent without --no-wait")
	}

	r, _ = runCLI(t, d, nil, "", "create", "--egress", "bogus")
	if r.code != 2 || !strings.Contains(r.stderr, "error: --egress") {
		t.Errorf("bad egress: %+v", r)
	}
}

func TestListAndGet(t *testing.T) {
	d := newDaemon(t)
	r, _ := runCLI(t, d, nil, "", "ls", "--state", "running")
	if r.code != 0 {
		t.Fatalf("ls: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "ID STATE BACKEND RESOLUTION AGE EXPIRES IN" ||
		strings.Join(strings.Fields(lines[1]), " ") != "abc123 running gvisor 1024x768 1h 1h30m" {
		t.Errorf("ls output:\n%s", r.stdout)
	}
	if q := d.last(t).Query; q["state"][0] != "running" {
		t.Errorf("query = %v", q)
	}

	r, _ = runCLI(t, d, nil, "", "get", "abc123")
	if r.code != 0 || !strings.Contains(r.stdout, "state:") || !strings.Contains(r.stdout, "metadata:    owner=me") {
		t.Errorf("get: %+v", r)
	}

	r, _ = runCLI(t, d, nil, "", "get", "nope")
	if r.code != 1 || r.stderr != "error: sandbox nope not found (not_found)\n" {
		t.Errorf("get missing: %+v", r)
	}
}

func TestRemove(t *testing.T) {
	d := newDaemon(t)
	r, _ := runCLI(t, d, nil, "", "rm", "abc123", "nope")
	if r.code != 1 || r.stdout != "abc123\n" || !strings.Contains(r.stderr, "error: nope: sandbox nope not found (not_found)") {
		t.Errorf("rm: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "rm")
	if r.code != 2 {
		t.Errorf("rm without args: %+v", r)
	}
}

func TestDesktopCommands(t *testing.T) {
	d := newDaemon(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"click", "abc123", "10", "20", "--button", "right", "--count", "2"}, `{"actions":[{"type":"click","x":10,"y":20,"button":"right","count":2}]}`},
		{[]string{"click", "abc123", "10", "20"}, `{"actions":[{"type":"click","x":10,"y":20}]}`},
		{[]string{"move", "abc123", "1", "2"}, `{"actions":[{"type":"move","x":1,"y":2}]}`},
		{[]string{"drag", "abc123", "1", "2", "3", "4", "5", "6"}, `{"actions":[{"type":"drag","path":[[1,2],[3,4],[5,6]]}]}`},
		{[]string{"scroll", "abc123", "--direction", "up", "--amount", "5", "--x", "7", "--y", "8"}, `{"actions":[{"type":"scroll","direction":"up","amount":5,"x":7,"y":8}]}`},
		{[]string{"scroll", "abc123"}, `{"actions":[{"type":"scroll","direction":"down","amount":3}]}`},
		{[]string{"type", "abc123", "héllo wörld"}, `{"actions":[{"type":"type","text":"héllo wörld"}]}`},
		{[]string{"key", "abc123", "ctrl+shift+t"}, `{"actions":[{"type":"key","keys":"ctrl+shift+t"}]}`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r, _ := runCLI(t, d, nil, "", tt.args...)
			if r.code != 0 {
				t.Fatalf("got %+v", r)
			}
			req := d.last(t)
			if req.Path != "/v1/sandboxes/abc123/actions" {
				t.Errorf("path = %s", req.Path)
			}
			jsonEq(t, req.Body, tt.want)
		})
	}
	for _, bad := range [][]string{
		{"click", "abc123", "x", "1"}, {"drag", "abc123", "1", "2", "3"}, {"scroll", "abc123", "--direction", "sideways"},
		{"scroll", "abc123", "--x", "1"}, {"screenshot", "abc123", "--region", "1,2", "-o", "x.png"},
	} {
		if r, _ := runCLI(t, d, nil, "", bad...); r.code != 2 {
			t.Errorf("%v: code %d, want 2 (%s)", bad, r.code, r.stderr)
		}
	}
}

func TestScreenshot(t *testing.T) {
	d := newDaemon(t)
	out := filepath.Join(t.TempDir(), "shot.jpg")
	r, _ := runCLI(t, d, nil, "", "screenshot", "abc123", "-o", out, "--quality", "80", "--region", "0,0,100,50", "--cursor")
	if r.code != 0 {
		t.Fatalf("got %+v", r)
	}
	b, err := os.ReadFile(out)
	if err != nil || string(b) != "\xff\xd8JPEG" {
		t.Errorf("file = %q, %v", b, err)
	}
	q := d.last(t).Query
	want := map[string][]string{"format": {"jpeg"}, "quality": {"80"}, "x": {"0"}, "y": {"0"}, "w": {"100"}, "h": {"50"}, "cursor": {"true"}}
	if !reflect.DeepEqual(q, want) {
		t.Errorf("query = %v, want %v", q, want)
	}
	// No -o: the image goes to stdout (a buffer here, not a terminal).
	r, _ = runCLI(t, d, nil, "", "screenshot", "abc123")
	if r.code != 0 || r.stdout != "\xff\xd8JPEG" {
		t.Errorf("stdout screenshot: %+v", r)
	}
}

func TestExec(t *testing.T) {
	d := newDaemon(t)
	r, _ := runCLI(t, d, nil, "", "exec", "abc123", "--user", "root", "--cwd", "/tmp", "--env", "X=1", "--timeout", "1m", "--", "ls", "-la")
	if r.code != 3 || r.stdout != "hello\n" || r.stderr != "oops\n" {
		t.Errorf("exec: %+v", r)
	}
	req := d.last(t)
	if req.Accept != "application/x-ndjson" {
		t.Errorf("Accept = %q", req.Accept)
	}
	jsonEq(t, req.Body, `{"argv":["ls","-la"],"user":"root","cwd":"/tmp","env":{"X":"1"},"timeout_seconds":60}`)

	r, _ = runCLI(t, d, nil, "data", "exec", "-i", "abc123", "--", "wc -c")
	jsonEq(t, d.last(t).Body, `{"command":"wc -c","stdin":"data"}`)
	if r.code != 3 {
		t.Errorf("exec -i: %+v", r)
	}

	r, _ = runCLI(t, d, nil, "", "--json", "exec", "abc123", "--", "true")
	if r.code != 3 || !strings.Contains(r.stdout, `"exit_code": 3`) {
		t.Errorf("exec --json: %+v", r)
	}
}

func TestCopy(t *testing.T) {
	d := newDaemon(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(src, []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, _ := runCLI(t, d, nil, "", "cp", src, "abc123:/root/")
	if r.code != 0 || r.stdout != "abc123:/root/in.txt (5 bytes)\n" {
		t.Errorf("upload: %+v", r)
	}
	if req := d.last(t); req.Method != "PUT" || req.Query["path"][0] != "/root/in.txt" || string(req.Body) != "12345" {
		t.Errorf("upload request = %+v", req)
	}

	r, _ = runCLI(t, d, nil, "piped", "cp", "-", "abc123:/tmp/p")
	if r.code != 0 || string(d.last(t).Body) != "piped" {
		t.Errorf("upload stdin: %+v", r)
	}

	r, _ = runCLI(t, d, nil, "", "cp", "abc123:/root/out.txt", dir)
	got, err := os.ReadFile(filepath.Join(dir, "out.txt"))
	if r.code != 0 || err != nil || string(got) != "file contents" {
		t.Errorf("download: %+v, %q, %v", r, got, err)
	}
	r, _ = runCLI(t, d, nil, "", "cp", "abc123:/root/out.txt", "-")
	if r.code != 0 || r.stdout != "file contents" {
		t.Errorf("download stdout: %+v", r)
	}
}

func TestInfoViewAndEnv(t *testing.T) {
	d := newDaemon(t)
	r, _ := runCLI(t, d, nil, "", "info")
	if r.code != 0 || !strings.Contains(r.stdout, "v1.2.3") || !strings.Contains(r.stdout, "1 running of 8") {
		t.Errorf("info: %+v", r)
	}

	var opened string
	var out bytes.Buffer
	a := newApp(strings.NewReader(""), &out, io.Discard, func(string) string { return "" })
	a.openURL = func(u string) error { opened = u; return nil }
	code := run(context.Background(), a, []string{"--url", d.srv.URL, "--api-key", "flagkey", "view", "abc123", "--ttl", "10m", "--open"})
	if code != 0 || out.String() != "http://h/view/abc123?token=t\n" || opened != "http://h/view/abc123?token=t" {
		t.Errorf("view: code %d out %q opened %q", code, out.String(), opened)
	}
	req := d.last(t)
	if req.Key != "flagkey" {
		t.Errorf("key = %q, want the --api-key flag", req.Key)
	}
	jsonEq(t, req.Body, `{"ttl_seconds":600,"view_only":true}`)

	// Unreachable daemon: a plain error, exit 1.
	r, _ = runCLI(t, d, map[string]string{"CUBICLE_URL": "http://127.0.0.1:1"}, "", "--timeout", "2s", "info")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "error: ") {
		t.Errorf("unreachable: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "frobnicate")
	if r.code != 2 {
		t.Errorf("unknown command: %+v", r)
	}
}

// fakeImages records image operations instead of needing root.
type fakeImages struct {
	calls []string
}

func (f *fakeImages) Build(ctx context.Context, name string, recipe fs.FS, imageDir, cacheDir string, progress io.Writer) (image.Image, error) {
	if _, err := fs.Stat(recipe, "recipe.json"); err != nil {
		return image.Image{}, err
	}
	f.calls = append(f.calls, "build "+name+" "+imageDir+" "+cacheDir)
	return image.Image{Name: name, SizeBytes: 3 << 20}, nil
}

func (f *fakeImages) Import(ctx context.Context, name string, r io.Reader, imageDir string, opts image.ImportOptions) (image.Image, error) {
	b, _ := io.ReadAll(r)
	call := "import " + name + " " + string(b)
	if opts.KernelFrom != "" {
		call += " kernel=" + opts.KernelFrom
	}
	f.calls = append(f.calls, call)
	return image.Image{Name: name, SizeBytes: int64(len(b)), KernelFrom: opts.KernelFrom}, nil
}

func (f *fakeImages) List(imageDir string) ([]image.Image, error) {
	f.calls = append(f.calls, "list "+imageDir)
	return []image.Image{{Name: "desktop", Source: "recipe", SizeBytes: 1 << 30, CreatedAt: now().Add(-2 * time.Hour)}}, nil
}

func (f *fakeImages) Remove(imageDir, name string) error {
	f.calls = append(f.calls, "rm "+name)
	return nil
}

func (f *fakeImages) NeedRoot() error { return nil }

func TestImageCommands(t *testing.T) {
	d := newDaemon(t)
	env := map[string]string{"CUBICLE_IMAGE_DIR": "/srv/images"}
	tests := []struct {
		args     []string
		stdin    string
		wantCall string
		wantOut  string
		wantCode int
	}{
		// desktop extends desktop-lite, which is brought up to date first.
		{[]string{"image", "build", "desktop"}, "", "list /srv/images; build desktop-lite /srv/images /var/cache/cubicle; build desktop /srv/images /var/cache/cubicle", "desktop built", 0},
		{[]string{"image", "build", "desktop-lite"}, "", "list /srv/images; build desktop-lite /srv/images /var/cache/cubicle", "desktop-lite built", 0},
		{[]string{"image", "build", "nosuch"}, "", "", "", 2},
		{[]string{"image", "import", "mine", "-", "--image-dir", "/x"}, "tarball", "import mine tarball", "mine imported (7 B)", 0},
		// README's line: docker export $(docker create my-image) | cubicle image import my-image
		{[]string{"image", "import", "mine"}, "tarball", "import mine tarball", "mine imported (7 B)", 0},
		{[]string{"image", "import", "mine", "--kernel", "desktop2"}, "tar", "import mine tar kernel=desktop2", "VM kernel from desktop2", 0},
		{[]string{"image", "import"}, "", "", "", 2},
		{[]string{"image", "import", "a", "b", "c"}, "", "", "", 2},
		{[]string{"image", "ls"}, "", "list /srv/images", "desktop  recipe  1.0 GiB  2h", 0},
		{[]string{"image", "rm", "desktop"}, "", "rm desktop", "desktop", 0},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			a := newApp(strings.NewReader(tt.stdin), &out, &errOut, func(k string) string { return env[k] })
			fi := &fakeImages{}
			a.images = fi
			a.url = d.srv.URL
			code := run(context.Background(), a, tt.args)
			if code != tt.wantCode {
				t.Fatalf("code = %d, want %d (%s)", code, tt.wantCode, errOut.String())
			}
			if tt.wantCall != "" && strings.Join(fi.calls, "; ") != tt.wantCall {
				t.Errorf("calls = %q, want %q", fi.calls, tt.wantCall)
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("out = %q, want it to contain %q", out.String(), tt.wantOut)
			}
		})
	}
	if n := len(d.reqs); n != 0 {
		t.Errorf("image commands made %d daemon requests", n)
	}
}

func TestVolumeCommands(t *testing.T) {
	d := newDaemon(t)
	r, _ := runCLI(t, d, nil, "", "volume", "create", "profile", "1024")
	if r.code != 0 || r.stdout != "profile\n" {
		t.Fatalf("create: %+v", r)
	}
	if req := d.last(t); req.Method != "POST" || req.Path != "/v1/volumes" {
		t.Errorf("create sent %+v", req)
	} else {
		jsonEq(t, req.Body, `{"name":"profile","size_mb":1024}`)
	}
	if r, _ := runCLI(t, d, nil, "", "volume", "create", "profile", "big"); r.code != 2 {
		t.Errorf("create with a bad size: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "volume", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, "profile  1024 MiB  37 MiB  2h") || !strings.Contains(r.stdout, "abc123") {
		t.Errorf("ls: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "volume", "get", "profile", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"attached_to": "abc123"`) {
		t.Errorf("get --json: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "volume", "rm", "old", "profile")
	if r.code != 1 || r.stdout != "old\n" || !strings.Contains(r.stderr, "profile: ") || !strings.Contains(r.stderr, "attached to sandbox abc123") {
		t.Errorf("rm of a free and an attached volume: %+v", r)
	}

	r, _ = runCLI(t, d, nil, "", "create", "--volume", "profile:/home/user", "--volume", "data:/data")
	if r.code != 0 {
		t.Fatalf("create --volume: %+v", r)
	}
	jsonEq(t, d.last(t).Body, `{"volumes":[{"name":"profile","path":"/home/user"},{"name":"data","path":"/data"}]}`)
	for _, bad := range []string{"profile", "profile:home", ":/x"} {
		if r, _ := runCLI(t, d, nil, "", "create", "--volume", bad); r.code != 2 || !strings.Contains(r.stderr, "--volume") {
			t.Errorf("--volume %s: %+v", bad, r)
		}
	}
}

func TestSnapshotCommands(t *testing.T) {
	d := newDaemon(t)
	r, _ := runCLI(t, d, nil, "", "snapshot", "create", "abc123", "--name", "logged-in", "--metadata", "step=2")
	if r.code != 0 || r.stdout != "snap1\n" {
		t.Fatalf("create: %+v", r)
	}
	if req := d.last(t); req.Method != "POST" || req.Path != "/v1/sandboxes/abc123/snapshots" {
		t.Errorf("create sent %+v", req)
	} else {
		jsonEq(t, req.Body, `{"name":"logged-in","metadata":{"step":"2"}}`)
	}
	r, _ = runCLI(t, d, nil, "", "snapshot", "ls", "--sandbox", "abc123")
	if r.code != 0 || !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, "snap1  logged-in  abc123   qemu     1024x768    700.0 MiB") {
		t.Errorf("ls: %+v", r)
	}
	if req := d.last(t); url.Values(req.Query).Get("sandbox_id") != "abc123" {
		t.Errorf("ls --sandbox sent %+v", req)
	}
	r, _ = runCLI(t, d, nil, "", "snapshot", "get", "logged-in", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"size_bytes": 734003200`) {
		t.Errorf("get --json: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "snapshot", "rm", "old", "logged-in")
	if r.code != 1 || r.stdout != "old\n" || !strings.Contains(r.stderr, "logged-in: ") || !strings.Contains(r.stderr, "in use") {
		t.Errorf("rm of a free and a busy snapshot: %+v", r)
	}
	r, _ = runCLI(t, d, nil, "", "create", "--from-snapshot", "logged-in", "--timeout", "10m")
	if r.code != 0 {
		t.Fatalf("create --from-snapshot: %+v", r)
	}
	jsonEq(t, d.last(t).Body, `{"from_snapshot":"logged-in","timeout_seconds":600}`)
	r, _ = runCLI(t, d, nil, "", "fork", "abc123", "--count", "2")
	if r.code != 0 || r.stdout != "fork1\nfork2\n" {
		t.Errorf("fork: %+v", r)
	}
	jsonEq(t, d.last(t).Body, `{"count":2}`)
}
