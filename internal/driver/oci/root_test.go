package oci

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestRuntimeRootChoice: the runtime root is off the state directory, one
// per state directory, unless an earlier daemon's containers are still
// recorded in STATEDIR/runtime-root (then its successor adopts them there).
func TestRuntimeRootChoice(t *testing.T) {
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	ra, rb := New(Config{Runtime: "runsc", StateDir: a}).runtimeRoot(), New(Config{Runtime: "runsc", StateDir: b}).runtimeRoot()
	if ra == rb {
		t.Errorf("two state directories share the runtime root %s", ra)
	}
	if strings.HasPrefix(ra, a) || filepath.Dir(ra) != RuntimeRootBase {
		t.Errorf("runtime root of %s is %s, want one under %s", a, ra, RuntimeRootBase)
	}
	if got := New(Config{Runtime: "runsc", StateDir: a + "/"}).runtimeRoot(); got != ra {
		t.Errorf("%s/ has the root %s, %s has %s", a, got, a, ra)
	}
	legacy := filepath.Join(a, "runtime-root")
	os.MkdirAll(legacy, 0o700)
	os.WriteFile(filepath.Join(legacy, "x_sandbox:x.lock"), nil, 0o600)
	if got := New(Config{Runtime: "runsc", StateDir: a}).runtimeRoot(); got != ra {
		t.Errorf("a legacy root holding only a lock file is chosen: %s", got)
	}
	os.WriteFile(filepath.Join(legacy, "x_sandbox:x.state"), []byte("{}"), 0o600)
	if got := New(Config{Runtime: "runsc", StateDir: a}).runtimeRoot(); got != legacy {
		t.Errorf("with a container recorded in %s the root is %s", legacy, got)
	}
	if got := New(Config{Runtime: "runsc", StateDir: a, RuntimeRoot: "/run/x"}).runtimeRoot(); got != "/run/x" {
		t.Errorf("a configured root is replaced by %s", got)
	}
}

// TestPruneRoots: the roots of state directories that are gone go, unless
// they still record a container; a root of a state directory that is
// there, and a directory that is no root of ours, stay.
func TestPruneRoots(t *testing.T) {
	needs.Root(t)
	tmp := t.TempDir()
	mk := func(name string, recorded bool) (*Driver, string) {
		d := New(Config{Runtime: "runsc", StateDir: filepath.Join(tmp, name)})
		if err := os.MkdirAll(d.cfg.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := d.claimRoot(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d.runtimeRoot()) })
		os.WriteFile(filepath.Join(d.runtimeRoot(), "y_sandbox:y.lock"), nil, 0o600)
		if recorded {
			os.WriteFile(filepath.Join(d.runtimeRoot(), "y_sandbox:y.state"), []byte("{}"), 0o600)
		}
		return d, d.runtimeRoot()
	}
	_, live := mk("live", false)
	gone, goneRoot := mk("gone", false)
	goneRec, goneRecRoot := mk("gone-recorded", true)
	os.RemoveAll(gone.cfg.StateDir)
	os.RemoveAll(goneRec.cfg.StateDir)
	foreign := filepath.Join(RuntimeRootBase, "not-ours-"+filepath.Base(tmp))
	os.MkdirAll(foreign, 0o700)
	t.Cleanup(func() { os.RemoveAll(foreign) })
	if err := pruneRoots(); err != nil {
		t.Fatal(err)
	}
	for root, want := range map[string]bool{live: true, goneRoot: false, goneRecRoot: true, foreign: true} {
		if _, err := os.Stat(root); (err == nil) != want {
			t.Errorf("%s: exists=%v, want %v", root, err == nil, want)
		}
	}
}
