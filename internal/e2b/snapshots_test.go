package e2b

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// TestSnapshots checks E2B's snapshot templates on the wire: made from a
// sandbox (201 {snapshotID, names}), listed a page at a time and by
// sandbox or name, started from as a templateID, and deleted as a
// template; each key sees only its own.
func TestSnapshots(t *testing.T) {
	s, f := newTestServer(t, func(c *Config) { c.Backend = "gvisor" })
	f.add(running("sb1"))
	f.add(running("sb2"))
	paused := running("sb3")
	paused.State = sandbox.StatePaused
	f.add(paused)

	info := func(rec interface{ Bytes() []byte }) snapshotInfo {
		t.Helper()
		var out snapshotInfo
		if err := json.Unmarshal(rec.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	rec := do(t, s, "POST", "/sandboxes/sb1/snapshots", "", nil)
	if rec.Code != 201 {
		t.Fatalf("create without a body: %d %s", rec.Code, rec.Body)
	}
	first := info(rec.Body)
	if first.SnapshotID == "" || first.Names == nil || len(first.Names) != 0 {
		t.Errorf("unnamed snapshot %s", rec.Body)
	}
	rec = do(t, s, "POST", "/sandboxes/sb2/snapshots", `{"name":"alice-in"}`, nil)
	if rec.Code != 201 {
		t.Fatalf("create named: %d %s", rec.Code, rec.Body)
	}
	named := info(rec.Body)
	if diff := cmp.Diff([]string{"alice-in"}, named.Names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	do(t, s, "POST", "/sandboxes/sb1/snapshots", `{"name":"bob"}`, map[string]string{"X-API-KEY": "other-key"})
	for _, tt := range []struct {
		path, body string
		status     int
		msg        string
	}{
		{"/sandboxes/nope/snapshots", "", 404, "nope"},
		{"/sandboxes/sb3/snapshots", "", 409, "paused"},
		{"/sandboxes/sb1/snapshots", `{"name":7}`, 400, "name"},
		{"/sandboxes/sb1/snapshots", `not json`, 400, "JSON"},
		// Sandbox.create("desktop") would start the template.
		{"/sandboxes/sb1/snapshots", `{"name":"desktop"}`, 400, "name of a template"},
	} {
		rec := do(t, s, "POST", tt.path, tt.body, nil)
		checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.msg)
	}
	f.snapErr = errdefs.New(errdefs.ErrNotSupported, "the gvisor backend cannot snapshot sandboxes yet; qemu can")
	rec = do(t, s, "POST", "/sandboxes/sb1/snapshots", "", nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 501, "cannot snapshot")
	f.snapErr = nil

	list := func(query string, key string) ([]snapshotInfo, string) {
		t.Helper()
		var h map[string]string
		if key != "" {
			h = map[string]string{"X-API-KEY": key}
		}
		rec := do(t, s, "GET", "/snapshots"+query, "", h)
		if rec.Code != 200 {
			t.Fatalf("list %s: %d %s", query, rec.Code, rec.Body)
		}
		var out []snapshotInfo
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		return out, rec.Header().Get("X-Next-Token")
	}
	if got, next := list("", ""); len(got) != 2 || next != "" || got[0].SnapshotID != first.SnapshotID {
		t.Errorf("list: %+v next %q", got, next)
	}
	if got, _ := list("", "other-key"); len(got) != 1 || got[0].Names[0] != "bob" {
		t.Errorf("the other key's list: %+v", got)
	}
	if got, _ := list("?sandboxID=sb2", ""); len(got) != 1 || got[0].SnapshotID != named.SnapshotID {
		t.Errorf("list of sb2: %+v", got)
	}
	if got, _ := list("?name=alice-in", ""); len(got) != 1 || got[0].SnapshotID != named.SnapshotID {
		t.Errorf("list by name: %+v", got)
	}
	page1, next := list("?limit=1", "")
	if len(page1) != 1 || next == "" || page1[0].SnapshotID != first.SnapshotID {
		t.Fatalf("page 1: %+v next %q", page1, next)
	}
	if page2, next := list("?limit=1&nextToken="+next, ""); len(page2) != 1 || next != "" || page2[0].SnapshotID != named.SnapshotID {
		t.Errorf("page 2: %+v next %q", page2, next)
	}

	// Sandbox.create(snapshot): the templateID names it, and the
	// snapshot's backend is used, not the configured one.
	rec = do(t, s, "POST", "/sandboxes", `{"templateID":"alice-in","timeout":60}`, nil)
	if rec.Code != 201 {
		t.Fatalf("create from the snapshot: %d %s", rec.Code, rec.Body)
	}
	if got := f.created[len(f.created)-1]; got.FromSnapshot != "alice-in" || got.Template != "" || got.Backend != "" || got.TimeoutSeconds != 60 {
		t.Errorf("create from the snapshot asked %+v", got)
	}
	var body map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if body["templateID"] != "alice-in" {
		t.Errorf("answered templateID %v, want the name the client used", body["templateID"])
	}
	rec = do(t, s, "POST", "/sandboxes", `{"templateID":"bob"}`, nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 400, "unknown template")
	rec = do(t, s, "POST", "/sandboxes", `{"templateID":"Not A Name"}`, nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 400, "unknown template")
	// A template is still a template.
	if rec := do(t, s, "POST", "/sandboxes", `{"templateID":"desktop"}`, nil); rec.Code != 201 || f.created[len(f.created)-1].FromSnapshot != "" || f.created[len(f.created)-1].Backend != "gvisor" {
		t.Errorf("create from a template: %d, asked %+v", rec.Code, f.created[len(f.created)-1])
	}

	// Deleted as a template.
	rec = do(t, s, "DELETE", "/templates/alice-in", "", map[string]string{"X-API-KEY": "other-key"})
	checkError(t, rec.Code, rec.Body.Bytes(), 404, "alice-in")
	if rec := do(t, s, "DELETE", "/templates/alice-in", "", nil); rec.Code != 204 {
		t.Errorf("delete: %d %s", rec.Code, rec.Body)
	}
	rec = do(t, s, "DELETE", "/templates/alice-in", "", nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 404, "alice-in")
	rec = do(t, s, "DELETE", "/templates/desktop", "", nil)
	checkError(t, rec.Code, rec.Body.Bytes(), 403, "image")
	if got, _ := list("", ""); len(got) != 1 || got[0].SnapshotID != first.SnapshotID {
		t.Errorf("after delete: %+v", got)
	}
}
