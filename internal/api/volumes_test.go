package api

import (
	"strings"
	"testing"

	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// TestVolumesAPI checks the wire side of /v1/volumes: bodies are strict,
// names in paths are checked before the manager is asked, each key gets
// its own volumes, and a create passes its volumes on.
func TestVolumesAPI(t *testing.T) {
	e := newTestEnv(t, Config{CreateRate: rate.Inf})
	owner := sandbox.KeyOwner(testKey)

	w := e.do("POST", "/v1/volumes", strings.NewReader(`{"name": "profile-alice", "size_mb": 512}`))
	v := decode[sandbox.Volume](t, w, 201)
	if v.Name != "profile-alice" || v.SizeMB != 512 || w.Header().Get("Location") != "/v1/volumes/profile-alice" {
		t.Errorf("created %+v at %q", v, w.Header().Get("Location"))
	}
	if e.mgr.lastVolume.owner != owner {
		t.Errorf("volume made for %q, want the key's owner %q", e.mgr.lastVolume.owner, owner)
	}
	for _, tt := range []struct{ body, code string }{
		{`{"name": "x"}`, codeInvalid},
		{`{"name": "x", "size_mb": 64, "extra": 1}`, codeInvalid},
		{`{"name": "x", "size_mb": "64"}`, codeInvalid},
		{`not json`, codeInvalid},
	} {
		wantError(t, e.do("POST", "/v1/volumes", strings.NewReader(tt.body)), 400, tt.code)
	}
	wantError(t, e.do("POST", "/v1/volumes", strings.NewReader(`{"name": "profile-alice", "size_mb": 64}`)), 409, codeConflict)

	list := decode[struct{ Volumes []sandbox.Volume }](t, e.do("GET", "/v1/volumes", nil), 200)
	if len(list.Volumes) != 1 || list.Volumes[0].Name != "profile-alice" {
		t.Errorf("list %+v", list)
	}
	other := decode[struct{ Volumes []sandbox.Volume }](t, e.do("GET", "/v1/volumes", nil, "X-API-Key", "other-key"), 200)
	if len(other.Volumes) != 0 {
		t.Errorf("another key lists %+v", other)
	}
	if got := e.do("GET", "/v1/volumes", nil, "X-API-Key", "other-key").Body.String(); !strings.Contains(got, `"volumes":[]`) {
		t.Errorf("an empty list is %s, want an empty array", got)
	}
	wantError(t, e.do("GET", "/v1/volumes/profile-alice", nil, "X-API-Key", "other-key"), 404, codeNotFound)
	decode[sandbox.Volume](t, e.do("GET", "/v1/volumes/profile-alice", nil), 200)
	for _, bad := range []string{"Profile", "a..b", strings.Repeat("a", 64)} {
		wantError(t, e.do("GET", "/v1/volumes/"+bad, nil), 404, codeNotFound)
		wantError(t, e.do("DELETE", "/v1/volumes/"+bad, nil), 404, codeNotFound)
	}

	// A create passes its volumes on; bad ones are refused before.
	decode[sandbox.Sandbox](t, e.do("POST", "/v1/sandboxes", strings.NewReader(`{"volumes": [{"name": "profile-alice", "path": "/home/user"}]}`)), 201)
	if got := e.mgr.lastCreate.Volumes; len(got) != 1 || got[0] != (sandbox.VolumeMount{Name: "profile-alice", Path: "/home/user"}) {
		t.Errorf("create passed volumes %+v", got)
	}
	e.mgr.lastCreate = sandbox.CreateRequest{}
	for _, body := range []string{
		`{"volumes": [{"name": "v", "path": "home"}]}`,
		`{"volumes": [{"name": "v", "path": "/"}]}`,
		`{"volumes": [{"name": "v", "path": "/home/../etc"}]}`,
		`{"volumes": [{"name": "v", "path": "/proc/x"}]}`,
		`{"volumes": [{"name": "v", "path": "/etc"}]}`,
		`{"volumes": [{"name": "V", "path": "/data"}]}`,
		`{"volumes": [{"name": "v", "path": "/data", "mode": "ro"}]}`,
		`{"volumes": [{"name": "v", "path": "/a"}, {"name": "v", "path": "/b"}]}`,
		`{"volumes": [{"name": "v", "path": "/a"}, {"name": "w", "path": "/a/b"}]}`,
		`{"volumes": {"name": "v"}}`,
	} {
		wantError(t, e.do("POST", "/v1/sandboxes", strings.NewReader(body)), 400, codeInvalid)
	}
	if len(e.mgr.lastCreate.Volumes) != 0 {
		t.Errorf("a refused create reached the manager: %+v", e.mgr.lastCreate)
	}

	if w := e.do("DELETE", "/v1/volumes/profile-alice", nil, "X-API-Key", "other-key"); w.Code != 404 {
		t.Errorf("another key deletes: %d", w.Code)
	}
	if w := e.do("DELETE", "/v1/volumes/profile-alice", nil); w.Code != 204 {
		t.Errorf("delete: %d %s", w.Code, w.Body.String())
	}
	wantError(t, e.do("GET", "/v1/volumes/profile-alice", nil), 404, codeNotFound)
}
