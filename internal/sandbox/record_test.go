package sandbox

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// goldenV1 is the record in testdata/record-v1.json, which the daemon
// of version 1 of the store wrote (json.Marshal of the REST types).
func goldenV1() *record {
	yes := true
	return &record{
		Sandbox: Sandbox{ID: "oldrec", State: StateRunning, Template: "desktop", Backend: "gvisor", Isolation: "gvisor",
			Resolution: Resolution{1280, 800}, CreatedAt: time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC),
			ExpiresAt: time.Date(2026, 11, 1, 11, 0, 0, 0, time.UTC), LastActiveAt: time.Date(2026, 11, 1, 10, 5, 0, 0, time.UTC),
			Metadata: map[string]string{"user": "alice"}, IP: "10.77.0.5", Desktop: &yes},
		Request: CreateRequest{Template: "desktop", Backend: "gvisor", Resolution: Resolution{1280, 800}, DPI: 120, VCPUs: 2, MemoryMB: 2048,
			TimeoutSeconds: 3600, IdleTimeoutSeconds: 600, StartURL: "http://site.test/", Env: map[string]string{"A": "1"},
			Metadata: map[string]string{"user": "alice"}, Network: Network{Allow: []string{"10.0.0.0/8"}}, Owner: "key-0123456789abcdef"},
		Token: "feedfacefeedface", IdleTimeout: 10 * time.Minute,
		DriverState: &driver.State{Version: 1, Driver: "gvisor", Data: json.RawMessage(`{"id":"oldrec","pid":1234}`)},
	}
}

// TestRecordVersions checks that a record an older daemon wrote reads as
// it was, that what this daemon writes reads back the same and is not
// the REST view, and that a record of a newer version is refused.
func TestRecordVersions(t *testing.T) {
	b, err := os.ReadFile("testdata/record-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	want := goldenV1()
	got, err := decodeRecord(b)
	if err != nil {
		t.Fatalf("decode version 1: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("version 1 record read as\n%+v\nwant\n%+v", got, want)
	}

	enc, err := encodeRecord(want)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(enc, &top); err != nil {
		t.Fatal(err)
	}
	if string(top["v"]) != "2" {
		t.Errorf("written record has version %s, want 2: %s", top["v"], enc)
	}
	for _, rest := range []string{"sandbox", "driver_state", "created_at"} {
		if _, ok := top[rest]; ok {
			t.Errorf("written record has the REST member %q: %s", rest, enc)
		}
	}
	again, err := decodeRecord(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, want) {
		t.Errorf("version 2 round trip gave\n%+v\nwant\n%+v", again, want)
	}

	for _, bad := range []string{`{"v":3,"id":"x"}`, `{"v":0}`, `{"v":"2"}`, `not json`} {
		if r, err := decodeRecord([]byte(bad)); err == nil {
			t.Errorf("decodeRecord(%s) = %+v, want an error", bad, r)
		}
	}
	if _, err := decodeRecord([]byte(`{"v":3}`)); err == nil || !strings.Contains(err.Error(), "newer cubicled") {
		t.Errorf("a newer record: %v, want it named as such", err)
	}
}

// TestUpgradeReadopts checks that a daemon finds the sandboxes a daemon
// of the version 1 store left running: it re-adopts them, and they work.
func TestUpgradeReadopts(t *testing.T) {
	d := newFakeDriver(t)
	dataDir := t.TempDir()
	m := newTestManager(t, d, dataDir, wallClock{})
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateRequest{Metadata: map[string]string{"k": "v"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// Rewrite its record the way the old daemon stored it: the golden
	// file with this sandbox's ID and driver state.
	var old map[string]any
	golden, err := os.ReadFile("testdata/record-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(golden, &old); err != nil {
		t.Fatal(err)
	}
	old["sandbox"].(map[string]any)["id"] = sb.ID
	old["sandbox"].(map[string]any)["expires_at"] = time.Now().Add(time.Hour)
	old["driver_state"].(map[string]any)["data"] = sb.ID
	b, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(dataDir+"/cubicle.db", 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketSandboxes).Put([]byte(sb.ID), b) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	m2 := newTestManager(t, d, dataDir, wallClock{})
	defer m2.Close()
	got, err := m2.Get(ctx, sb.ID)
	if err != nil || got.State != StateRunning || got.Metadata["user"] != "alice" {
		t.Fatalf("after the upgrade: %+v, %v; want running, with the old record's metadata", got, err)
	}
	if _, err := m2.Agent(ctx, sb.ID); err != nil {
		t.Errorf("not usable after the upgrade: %v", err)
	}
	if d.live() != 1 {
		t.Errorf("live boxes = %d, want 1", d.live())
	}
}
