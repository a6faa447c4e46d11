package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/metrics"
)

// newTemplateManager is a manager on d whose image resolver answers
// *rootfs (under mu) for every template.
func newTemplateManager(t *testing.T, d driver.Driver, dataDir string, mu *sync.Mutex, rootfs *string) *Manager {
	t.Helper()
	m, err := New(context.Background(), Config{
		DataDir: dataDir, Drivers: map[string]driver.Driver{"gvisor": d}, DefaultBackend: "auto",
		Images: func(string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return *rootfs, nil
		},
		MaxSandboxes: 8, IdleTimeout: time.Minute, MaxLifetime: time.Hour, ReapInterval: time.Hour, Metrics: metrics.New(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// templateBoxes are the boxes d created as boot templates: booted with
// the template marker and nothing of any create's session.
func templateBoxes(t *testing.T, d *fakeDriver) []driver.Spec {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []driver.Spec
	for _, s := range d.specs {
		if s.Session.Env[templateEnvName] == "1" {
			if len(s.Session.Env) != 1 || s.Session.StartURL != "" {
				t.Errorf("template box %s was booted with a create's session: env %v, start URL %q", s.ID, s.Session.Env, s.Session.StartURL)
			}
			out = append(out, s)
		}
	}
	return out
}

// TestBootTemplate: the first create of an image and shape boots a
// template box with no one's session, snapshots and stops it; every
// create restores that snapshot and makes the copy its own (re-key, then
// its own environment and start URL); a changed image makes a new
// template and the old one's files go.
func TestBootTemplate(t *testing.T) {
	ctx := context.Background()
	sd := &snapDriver{fakeDriver: newFakeDriver(t)}
	var mu sync.Mutex
	rootfs := "/images/desktop/v1"
	dataDir := t.TempDir()
	m := newTemplateManager(t, sd, dataDir, &mu, &rootfs)
	defer m.Close()

	a, err := m.Create(ctx, CreateRequest{Owner: "key-a", Env: map[string]string{"SECRET": "a"}, StartURL: "http://a.test/"}, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, CreateRequest{Owner: "key-b", Env: map[string]string{"SECRET": "b"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	tpls := templateBoxes(t, sd.fakeDriver)
	if len(tpls) != 1 {
		t.Fatalf("%d template boxes booted for two creates of one image and shape, want 1", len(tpls))
	}
	tpl := tpls[0]
	if tpl.Shape.Image != "/images/desktop/v1" {
		t.Errorf("template booted from %q, want the image's current version", tpl.Shape.Image)
	}
	sd.mu.Lock()
	_, tplLive := sd.boxes[tpl.ID]
	restored := append([]restoreCall(nil), sd.restored...)
	applied := map[string]appliedSession{a.ID: sd.applied[a.ID], b.ID: sd.applied[b.ID]}
	_, aRekeyed := sd.rekeyed[a.ID]
	_, bRekeyed := sd.rekeyed[b.ID]
	sd.mu.Unlock()
	if tplLive {
		t.Error("the template box still runs after its snapshot")
	}
	if len(restored) != 2 {
		t.Fatalf("%d restores, want one per create", len(restored))
	}
	if restored[0].spec.ID != a.ID || restored[1].spec.ID != b.ID {
		t.Errorf("restored %s and %s, want the two creates %s and %s", restored[0].spec.ID, restored[1].spec.ID, a.ID, b.ID)
	}
	for _, r := range restored {
		if r.from != tpl.ID || !strings.HasPrefix(r.dir, filepath.Join(dataDir, "templates")+"/") {
			t.Errorf("restore of %s from box %s in %s, want the template box %s under the data dir's templates", r.spec.ID, r.from, r.dir, tpl.ID)
		}
	}
	if !aRekeyed || !bRekeyed {
		t.Error("a copy of the template was not re-keyed")
	}
	if r := applied[a.ID].req; r == nil || r.Env["SECRET"] != "a" || r.StartUrl != "http://a.test/" || r.Token == "" {
		t.Errorf("a's session applied as %+v, want its env and start URL", r)
	}
	if r := applied[b.ID].req; r == nil || r.Env["SECRET"] != "b" || r.StartUrl != "" {
		t.Errorf("b's session applied as %+v, want its own env and no start URL", r)
	}
	if list := m.List(ctx, Filter{}); len(list) != 2 {
		t.Errorf("listed %d sandboxes, want the 2 creates (the template box is nobody's)", len(list))
	}
	oldDirs, _ := filepath.Glob(filepath.Join(dataDir, "templates", "*"))
	if len(oldDirs) != 1 {
		t.Fatalf("template directories %v, want one", oldDirs)
	}

	// The image changes: the next create boots a new template from it.
	mu.Lock()
	rootfs = "/images/desktop/v2"
	mu.Unlock()
	c, err := m.Create(ctx, CreateRequest{Owner: "key-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	tpls = templateBoxes(t, sd.fakeDriver)
	if len(tpls) != 2 {
		t.Fatalf("%d template boxes after the image changed, want 2", len(tpls))
	}
	var fresh driver.Spec
	for _, s := range tpls {
		if s.ID != tpl.ID {
			fresh = s
		}
	}
	if fresh.Shape.Image != "/images/desktop/v2" {
		t.Errorf("new template booted from %q, want v2", fresh.Shape.Image)
	}
	sd.mu.Lock()
	last := sd.restored[len(sd.restored)-1]
	sd.mu.Unlock()
	if last.spec.ID != c.ID || last.from != fresh.ID {
		t.Errorf("c restored from %s, want the new template %s", last.from, fresh.ID)
	}
	if _, err := os.Stat(oldDirs[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old template's directory %s is still there (%v)", oldDirs[0], err)
	}

	// A shape of its own is a template of its own; volumes boot cold.
	if _, err := m.Create(ctx, CreateRequest{Resolution: Resolution{Width: 800, Height: 600}}, true); err != nil {
		t.Fatal(err)
	}
	if n := len(templateBoxes(t, sd.fakeDriver)); n != 3 {
		t.Errorf("%d template boxes after a create of another screen size, want 3", n)
	}
	if _, err := m.CreateVolume(ctx, "key-a", "data", 64); err != nil {
		t.Fatal(err)
	}
	v, err := m.Create(ctx, CreateRequest{Owner: "key-a", Volumes: []VolumeMount{{Name: "data", Path: "/data"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	sd.mu.Lock()
	last = sd.restored[len(sd.restored)-1]
	sd.mu.Unlock()
	if last.spec.ID == v.ID {
		t.Error("a create with volumes was restored from a template; volumes are mounted at boot")
	}
}

// TestBootTemplateFailsCold: a template that cannot be saved makes its
// creates boot cold, with their own session at boot, leaves no files, and
// is not tried again at every create.
func TestBootTemplateFailsCold(t *testing.T) {
	ctx := context.Background()
	sd := &snapDriver{fakeDriver: newFakeDriver(t), snapErr: errors.New("checkpoint: no space left on device")}
	var mu sync.Mutex
	rootfs := "/images/desktop/v1"
	dataDir := t.TempDir()
	m := newTemplateManager(t, sd, dataDir, &mu, &rootfs)
	defer m.Close()
	for i := range 2 {
		sb, err := m.Create(ctx, CreateRequest{Env: map[string]string{"N": "x"}}, true)
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		sd.mu.Lock()
		spec, cold := sd.specs[sb.ID]
		sd.mu.Unlock()
		if !cold || spec.Session.Env["N"] != "x" {
			t.Errorf("create %d did not boot cold with its own session (%+v)", i, spec.Session)
		}
	}
	if n := len(templateBoxes(t, sd.fakeDriver)); n != 1 {
		t.Errorf("%d template boots, want 1: a failed one waits %v before the next", n, templateRetry)
	}
	if dirs, _ := filepath.Glob(filepath.Join(dataDir, "templates", "*")); len(dirs) != 0 {
		t.Errorf("a failed template left %v", dirs)
	}
	if n := sd.live(); n != 2 {
		t.Errorf("%d boxes live, want the 2 sandboxes (the template box stopped)", n)
	}
}

// TestCreateWaitsForUsable: a cold create answers once the agent calls
// its desktop usable (every window of the session up), not when its
// screen first answers.
func TestCreateWaitsForUsable(t *testing.T) {
	d := newFakeDriver(t)
	d.usableAfter = 5
	m := newTestManager(t, d, t.TempDir(), nil)
	defer m.Close()
	if _, err := m.Create(context.Background(), CreateRequest{}, true); err != nil {
		t.Fatal(err)
	}
	if n := d.infoCalls.Load(); n <= d.usableAfter {
		t.Errorf("create answered after %d Info calls; the desktop was usable only from call %d", n, d.usableAfter+1)
	}
}
