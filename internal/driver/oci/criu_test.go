package oci

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestRuncCheckpointHere is the proof behind runc's "cannot pause": a
// real `runc checkpoint` of a running runc box fails on this host, for
// the reason CanPause gives (CRIU's own error, in runc's dump log), and
// the box runs on untouched. Where CRIU does checkpoint the box, the test
// fails: runc pause can then be built, and must be.
func TestRuncCheckpointHere(t *testing.T) {
	needs.Command(t, "criu")
	d, image := newTestDriver(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := "tcriubox1"
	b, err := d.Create(ctx, driver.Spec{ID: id, Shape: driver.Shape{Image: image},
		Session: driver.Session{Token: "tok123", Width: 1024, Height: 768}})
	if err != nil {
		t.Fatal(err)
	}
	pid := b.(*box).data.Pid
	defer func() {
		if err := b.Stop(context.Background()); err != nil {
			t.Error(err)
		}
		assertGone(t, d, id, pid)
	}()
	canErr := d.CanPause(ctx)
	t.Logf("CanPause: %v", canErr)
	images := t.TempDir()
	out, err := d.command(ctx, "checkpoint", "--image-path", images, "--work-path", images, id).CombinedOutput()
	if err == nil {
		t.Fatalf("runc checkpoint of a running box succeeded here: CRIU works on this host, and runc pause can be built (CanPause says: %v)", canErr)
	}
	dump, _ := os.ReadFile(filepath.Join(images, "dump.log"))
	t.Logf("runc checkpoint: %v: %s\ndump.log:\n%s", err, strings.TrimSpace(string(out)), dump)
	if canErr == nil {
		t.Fatal("CanPause says runc boxes pause, and runc checkpoint fails")
	}
	crErrs := criuErrors(dump, err)
	first, _, _ := strings.Cut(crErrs, ";")
	if len(dump) == 0 || !strings.Contains(canErr.Error(), first) {
		t.Errorf("CanPause's reason %q does not name what stopped runc checkpoint (%q)", canErr, crErrs)
	}
	if got := get(t, b, "/"); got != "ok tok123" {
		t.Errorf("after the failed checkpoint the agent answers %q", got)
	}
}

// TestCRIUErrors: the gist of CRIU's output.
func TestCRIUErrors(t *testing.T) {
	out := "Warn  (criu/kerndat.c:1):  something\n(00.006031) Error (criu/util.c:642): exited, status=1\nError (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds\nError (criu/crtools.c:260): Could not initialize kernel features detection.\n"
	if got, want := criuErrors([]byte(out), nil), "vdso: Unexpected rt vDSO area bounds; Could not initialize kernel features detection."; got != want {
		t.Errorf("criuErrors = %q, want %q", got, want)
	}
}
