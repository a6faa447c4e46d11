package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// consoleDriver is a fakeDriver whose boxes keep a console log, a file
// the test writes as the box would.
type consoleDriver struct{ *fakeDriver }

func (d consoleDriver) Create(ctx context.Context, spec driver.Spec) (driver.Box, error) {
	b, err := d.fakeDriver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	path := d.console(spec.ID)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return nil, err
	}
	return consoleBox{fakeBox: b.(*fakeBox), path: path}, nil
}

func (d consoleDriver) console(id string) string { return filepath.Join(d.dir, id+".console") }

type consoleBox struct {
	*fakeBox
	path string
}

func (b consoleBox) OpenConsole() (*os.File, error) { return os.Open(b.path) }

// appendFile appends s to the file at path.
func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func TestLogs(t *testing.T) {
	fd := newFakeDriver(t)
	d := consoleDriver{fd}
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	dataDir := t.TempDir()
	m, err := New(context.Background(), Config{
		DataDir: dataDir, Drivers: map[string]driver.Driver{"gvisor": d}, DefaultBackend: "gvisor",
		Images:       func(string) (string, error) { return "/nonexistent", nil },
		MaxSandboxes: 2, MaxLifetime: time.Hour, ReapInterval: time.Hour, Clock: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	alice, bob := KeyOwner("alice-key"), KeyOwner("bob-key")
	sb, err := m.Create(ctx, CreateRequest{Owner: alice}, true)
	if err != nil {
		t.Fatal(err)
	}
	console := d.console(sb.ID)
	created := sb.CreatedAt

	// A backlog before any read: the runtime's complaint naming the data
	// directory, an agent line, and a program's line after it.
	clock.Advance(10 * time.Second)
	appendFile(t, console, "runsc: open "+dataDir+"/oci/x/bundle: denied\n"+
		"time=2026-01-01T00:00:03Z level=WARN msg=\"session: exited\" program=x11vnc status=\"exit status 1\"\n"+
		"Xvfb says hello\n")
	messages := func(owner string, q consolelog.Query) []LogEntry {
		t.Helper()
		got, err := m.Logs(ctx, sb.ID, owner, q)
		if err != nil {
			t.Fatalf("Logs: %v", err)
		}
		return got
	}
	at3 := time.Date(2026, 1, 1, 0, 0, 3, 0, time.UTC)
	want := []LogEntry{
		{Timestamp: created, Level: "info", Source: "console", Message: "runsc: open …/oci/x/bundle: denied"},
		{Timestamp: at3, Level: "warn", Source: "agent", Message: "session: exited",
			Fields: map[string]string{"program": "x11vnc", "status": "exit status 1"}},
		{Timestamp: at3.Add(time.Nanosecond), Level: "info", Source: "console", Message: "Xvfb says hello"},
	}
	if diff := cmp.Diff(want, messages(alice, consolelog.Query{})); diff != "" {
		t.Errorf("backlog (-want +got):\n%s", diff)
	}

	// Another owner does not see the sandbox; without keys, all do.
	if _, err := m.Logs(ctx, sb.ID, bob, consolelog.Query{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Logs of another owner: %v, want not found", err)
	}
	if _, err := m.Logs(ctx, "nosuch", alice, consolelog.Query{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Logs of an unknown sandbox: %v, want not found", err)
	}
	if got := messages("", consolelog.Query{}); len(got) != 3 {
		t.Errorf("without keys: %d lines, want 3", len(got))
	}

	// Lines printed later are stamped when they are read; the usage
	// loop's pass reads them too.
	clock.Advance(5 * time.Second)
	appendFile(t, console, "later\nunfinished")
	m.readConsoles()
	clock.Advance(5 * time.Second)
	got := messages(alice, consolelog.Query{Cursor: at3.Add(time.Second)})
	if len(got) != 1 || got[0].Message != "later" || !got[0].Timestamp.Equal(created.Add(15*time.Second)) {
		t.Errorf("later line: %+v, want \"later\" at read time %v", got, created.Add(15*time.Second))
	}

	// The console begun again from empty (a VM started anew): what was
	// unfinished ends, and the new file is read from its start.
	if err := os.WriteFile(console, []byte("rebooted\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got = messages(alice, consolelog.Query{Backward: true, Limit: 2})
	if len(got) != 2 || got[0].Message != "rebooted" || got[1].Message != "unfinished" {
		t.Errorf("after restart: %+v", got)
	}

	// Destroyed: the last lines are read before the box goes, and the
	// log is kept while the sandbox is listed.
	appendFile(t, console, "last words")
	if err := m.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got = messages(alice, consolelog.Query{Backward: true, Limit: 1})
	if len(got) != 1 || got[0].Message != "last words" {
		t.Errorf("after destroy: %+v, want the last words", got)
	}
	clock.Advance(time.Hour)
	m.Reap()
	if _, err := m.Logs(ctx, sb.ID, alice, consolelog.Query{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Logs after the record went: %v, want not found", err)
	}
}

func TestLogsWithoutConsole(t *testing.T) {
	d := newFakeDriver(t)
	m := newTestManager(t, d, t.TempDir(), &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	defer m.Close()
	sb, err := m.Create(context.Background(), CreateRequest{}, true)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Logs(context.Background(), sb.ID, "", consolelog.Query{})
	if err != nil || len(got) != 0 {
		t.Errorf("Logs of a box without a console: %v, %v; want none", got, err)
	}
}
