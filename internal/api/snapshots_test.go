package api

import (
	"strings"
	"testing"

	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// TestSnapshotsAPI checks the wire side of snapshots: bodies are strict,
// references in paths are checked before the manager is asked, each key
// gets its own snapshots, and a create passes from_snapshot on.
func TestSnapshotsAPI(t *testing.T) {
	e := newTestEnv(t, Config{CreateRate: rate.Inf})
	owner := sandbox.KeyOwner(testKey)

	// No body, an empty one and a full one.
	w := e.do("POST", "/v1/sandboxes/"+runningID+"/snapshots", nil)
	first := decode[sandbox.Snapshot](t, w, 201)
	if first.SandboxID != runningID || w.Header().Get("Location") != "/v1/snapshots/"+first.ID || e.mgr.lastSnap.owner != owner {
		t.Errorf("created %+v at %q for %q", first, w.Header().Get("Location"), e.mgr.lastSnap.owner)
	}
	w = e.do("POST", "/v1/sandboxes/"+runningID+"/snapshots", strings.NewReader(`{"name": "logged-in", "metadata": {"step": "2"}}`))
	named := decode[sandbox.Snapshot](t, w, 201)
	if e.mgr.lastSnap.name != "logged-in" || e.mgr.lastSnap.metadata["step"] != "2" || named.Name != "logged-in" {
		t.Errorf("named snapshot: %+v, manager asked %+v", named, e.mgr.lastSnap)
	}
	for _, body := range []string{`{"name": 3}`, `{"nmae": "x"}`, `[]`, `not json`} {
		wantError(t, e.do("POST", "/v1/sandboxes/"+runningID+"/snapshots", strings.NewReader(body)), 400, codeInvalid)
	}
	wantError(t, e.do("POST", "/v1/sandboxes/nope/snapshots", nil), 404, codeNotFound)
	wantError(t, e.do("POST", "/v1/sandboxes/"+stoppedID+"/snapshots", nil), 409, codeConflict)

	list := decode[struct{ Snapshots []sandbox.Snapshot }](t, e.do("GET", "/v1/snapshots", nil), 200)
	if len(list.Snapshots) != 2 {
		t.Errorf("list %+v", list)
	}
	bySandbox := decode[struct{ Snapshots []sandbox.Snapshot }](t, e.do("GET", "/v1/snapshots?sandbox_id="+headlessID, nil), 200)
	if len(bySandbox.Snapshots) != 0 {
		t.Errorf("list of another sandbox's %+v", bySandbox)
	}
	for _, q := range []string{"sandbox_id=Bad!", "sandbox_id=a&sandbox_id=b"} {
		wantError(t, e.do("GET", "/v1/snapshots?"+q, nil), 400, codeInvalid)
	}
	if got := e.do("GET", "/v1/snapshots", nil, "X-API-Key", "other-key").Body.String(); !strings.Contains(got, `"snapshots":[]`) {
		t.Errorf("another key's list is %s, want an empty array", got)
	}
	if got := decode[sandbox.Snapshot](t, e.do("GET", "/v1/snapshots/logged-in", nil), 200); got.ID != named.ID {
		t.Errorf("get by name: %+v", got)
	}
	decode[sandbox.Snapshot](t, e.do("GET", "/v1/snapshots/"+first.ID, nil), 200)
	wantError(t, e.do("GET", "/v1/snapshots/"+first.ID, nil, "X-API-Key", "other-key"), 404, codeNotFound)
	for _, bad := range []string{"Snap", "a..b", strings.Repeat("a", 64)} {
		wantError(t, e.do("GET", "/v1/snapshots/"+bad, nil), 404, codeNotFound)
		wantError(t, e.do("DELETE", "/v1/snapshots/"+bad, nil), 404, codeNotFound)
	}

	// A create passes from_snapshot on; a malformed one is refused before.
	decode[sandbox.Sandbox](t, e.do("POST", "/v1/sandboxes", strings.NewReader(`{"from_snapshot": "logged-in", "timeout_seconds": 60}`)), 201)
	if got := e.mgr.lastCreate; got.FromSnapshot != "logged-in" || got.Owner != owner || got.TimeoutSeconds != 60 {
		t.Errorf("create passed %+v", got)
	}
	e.mgr.lastCreate = sandbox.CreateRequest{}
	for _, body := range []string{`{"from_snapshot": "Bad Name"}`, `{"from_snapshot": 7}`, `{"from_snapshot": "` + strings.Repeat("a", 64) + `"}`} {
		wantError(t, e.do("POST", "/v1/sandboxes", strings.NewReader(body)), 400, codeInvalid)
	}
	if e.mgr.lastCreate.FromSnapshot != "" {
		t.Errorf("a refused create reached the manager: %+v", e.mgr.lastCreate)
	}

	if w := e.do("DELETE", "/v1/snapshots/logged-in", nil, "X-API-Key", "other-key"); w.Code != 404 {
		t.Errorf("another key deletes: %d", w.Code)
	}
	if w := e.do("DELETE", "/v1/snapshots/logged-in", nil); w.Code != 204 {
		t.Errorf("delete: %d %s", w.Code, w.Body.String())
	}
	wantError(t, e.do("GET", "/v1/snapshots/logged-in", nil), 404, codeNotFound)
}
