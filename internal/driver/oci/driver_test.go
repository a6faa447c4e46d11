package oci

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// imageRootFS returns the desktop image's rootfs from $CUBICLE_IMAGE_DIR
// (default /var/lib/cubicle/images), or skips.
func imageRootFS(t *testing.T) string {
	dir := os.Getenv("CUBICLE_IMAGE_DIR")
	if dir == "" {
		dir = "/var/lib/cubicle/images"
	}
	return needs.Image(t, filepath.Join(dir, "desktop"))
}

// buildTestAgent builds testdata/testagent as a static binary.
func buildTestAgent(t *testing.T) string {
	t.Helper()
	needs.Command(t, "go")
	bin := filepath.Join(t.TempDir(), "testagent")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/testagent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build test agent: %v\n%s", err, out)
	}
	return bin
}

// newTestDriver returns a driver for runtime with a fresh state directory.
func newTestDriver(t *testing.T, runtime string) (*Driver, string) {
	t.Helper()
	needs.Runtime(t, runtime) //depcheck:caller
	image := imageRootFS(t)
	// Every box gets a disk-limited layer, as cubicled's default does.
	d := New(Config{Runtime: runtime, StateDir: filepath.Join(t.TempDir(), "st"), AgentBinary: buildTestAgent(t), DiskMB: 256})
	if err := d.Available(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever a failed test left: remove it so the machine stays clean.
		if err := d.Cleanup(context.Background(), nil); err != nil {
			t.Errorf("final Cleanup: %v", err)
		}
		os.RemoveAll(d.runtimeRoot())
	})
	return d, image
}

var runtimes = []string{"runsc", "runc"}

func get(t *testing.T, b driver.Box, path string) string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return b.DialAgent(ctx) },
	}, Timeout: 20 * time.Second}
	resp, err := c.Get("http://agent" + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "HTTP " + resp.Status + ": " + string(body)
	}
	return string(body)
}

// assertGone checks that nothing of box id is left: no container in the
// runtime, no mount or directory under the state directory, no process.
func assertGone(t *testing.T, d *Driver, id string, pid int) {
	t.Helper()
	cs, err := d.list(context.Background())
	if err != nil {
		t.Errorf("list: %v", err)
	}
	for _, c := range cs {
		if c.ID == id {
			t.Errorf("container %s still listed: %+v", id, c)
		}
	}
	if mps, _ := MountsUnder(d.boxDir(id)); len(mps) > 0 {
		t.Errorf("mounts left: %v", mps)
	}
	if _, err := os.Stat(d.boxDir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("box dir %s: %v, want gone", d.boxDir(id), err)
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if b, err := os.ReadFile(l); err == nil && strings.HasPrefix(string(b), d.boxDir(id)) {
			t.Errorf("loop device left: %s → %s", l, b)
		}
	}
	if pid > 0 && alive(pid) {
		t.Errorf("pid %d still alive", pid)
	}
	// The runtime's own records: runc's state directory, runsc's state
	// and lock files, and the cgroups either made for the box.
	left, _ := filepath.Glob(filepath.Join(d.runtimeRoot(), id+"*"))
	for _, pat := range []string{"/sys/fs/cgroup/*/cubicle/" + id, "/sys/fs/cgroup/cubicle/" + id} {
		cg, _ := filepath.Glob(pat)
		left = append(left, cg...)
	}
	if len(left) > 0 {
		t.Errorf("runtime records left: %v", left)
	}
	if procs := processesMentioning(id); len(procs) > 0 {
		t.Errorf("processes left: %v", procs)
	}
}

// processesMentioning returns the command lines of live processes whose
// arguments contain s.
func processesMentioning(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		cmd := strings.ReplaceAll(string(data), "\x00", " ")
		if strings.Contains(cmd, s) && !strings.Contains(cmd, "go test") && !strings.Contains(cmd, ".test") {
			out = append(out, e.Name()+": "+cmd)
		}
	}
	return out
}

func TestBox(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			id := "t" + strings.ReplaceAll(rt, "runsc", "gv") + "box1"
			start := time.Now()
			b, err := d.Create(ctx, driver.Spec{
				ID:    id,
				Shape: driver.Shape{Image: image},
				Session: driver.Session{
					Token: "tok123", Env: map[string]string{"FOO": "bar"},
					Width: 1024, Height: 768, StartURL: "about:blank",
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: Create took %v", rt, time.Since(start))
			pid := b.(*box).data.Pid
			for _, pw := range [][2]string{
				{"/", "ok tok123"},
				{"/env?k=FOO", "bar"},
				{"/env?k=CUBICLE_WIDTH", "1024"},
				{"/env?k=CUBICLE_HEIGHT", "768"},
				{"/env?k=CUBICLE_DPI", "96"},
				{"/env?k=CUBICLE_SANDBOX_ID", id},
				{"/env?k=HOME", "/root"},
				{"/hostname", hostname(id)},
				{"/write?p=/etc/cubicle-box-was-here", ""},
				{"/read?p=/etc/cubicle-box-was-here", "written"},
				{"/write?p=/opt/cubicle/bin/cubicle-agent", "HTTP 500 Internal Server Error: open /opt/cubicle/bin/cubicle-agent: read-only file system\n"},
			} {
				path, want := pw[0], pw[1]
				if got := get(t, b, path); got != want && !(strings.HasPrefix(path, "/write?p=/opt") && strings.HasPrefix(got, "HTTP 500")) {
					t.Errorf("GET %s = %q, want %q", path, got, want)
				}
			}
			if got := get(t, b, "/read?p=/etc/cubicle/session.json"); !strings.Contains(got, `"xvfb"`) {
				t.Errorf("session.json = %q", got)
			}
			if _, err := os.Stat(filepath.Join(image, "etc/cubicle-box-was-here")); err == nil {
				t.Errorf("a write in the box reached the shared image")
			}

			// Adopt from the state, as a restarted daemon would.
			b2, err := d.Adopt(ctx, b.State())
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-b2.Wait():
				t.Fatal("adopted box is dead")
			default:
			}
			if got := get(t, b2, "/"); got != "ok tok123" {
				t.Errorf("adopted GET / = %q", got)
			}
			b2.(*box).stopWatch()

			if err := b.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-b.Wait():
			default:
				t.Error("Wait not closed after Stop")
			}
			assertGone(t, d, id, pid)
			if err := b.Stop(ctx); err != nil {
				t.Errorf("second Stop: %v", err)
			}
			// An adopted handle of a stopped box is dead and stops cleanly.
			b3, err := d.Adopt(ctx, b.State())
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-b3.Wait():
			default:
				t.Error("Adopt of a stopped box: Wait not closed")
			}
			if err := b3.Stop(ctx); err != nil {
				t.Errorf("Stop of adopted dead box: %v", err)
			}
		})
	}
}

func TestBoxExitClosesWait(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx := context.Background()
			b, err := d.Create(ctx, driver.Spec{ID: "texit" + rt[3:], Shape: driver.Shape{Image: image}, Session: driver.Session{Token: "x"}})
			if err != nil {
				t.Fatal(err)
			}
			pid := b.(*box).data.Pid
			get(t, b, "/exit")
			select {
			case <-b.Wait():
			case <-time.After(30 * time.Second):
				t.Fatal("Wait not closed 30s after the agent exited")
			}
			if _, err := b.DialAgent(ctx); err == nil {
				t.Error("DialAgent on a dead box succeeded")
			}
			if err := b.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			assertGone(t, d, "texit"+rt[3:], pid)
		})
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := d.Create(ctx, driver.Spec{ID: "tbadimage", Shape: driver.Shape{Image: "/nonexistent/rootfs"}}); err == nil {
				t.Fatal("Create with a missing image succeeded")
			}
			assertGone(t, d, "tbadimage", 0)
			if _, err := d.Create(ctx, driver.Spec{ID: "Bad/ID", Shape: driver.Shape{Image: image}}); err == nil {
				t.Fatal("Create with a bad ID succeeded")
			}
			// The container starts, but the agent exits before listening.
			_, err := d.Create(ctx, driver.Spec{ID: "tagentdies", Shape: driver.Shape{Image: image}, Session: driver.Session{Env: map[string]string{"TESTAGENT_EXIT": "1"}}})
			if err == nil {
				t.Fatal("Create with a dying agent succeeded")
			}
			t.Logf("dying agent: %v", err)
			assertGone(t, d, "tagentdies", 0)
		})
	}
}

func TestCleanupRemovesOrphans(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx := context.Background()
			keep, err := d.Create(ctx, driver.Spec{ID: "tkeep", Shape: driver.Shape{Image: image}})
			if err != nil {
				t.Fatal(err)
			}
			defer keep.Stop(ctx)
			orphan, err := d.Create(ctx, driver.Spec{ID: "torphan", Shape: driver.Shape{Image: image}})
			if err != nil {
				t.Fatal(err)
			}
			pid := orphan.(*box).data.Pid
			orphan.(*box).stopWatch() // forget it, as a crashed daemon would
			// A box directory whose disk was mounted when the daemon died.
			stale := filepath.Join(d.cfg.StateDir, "tstale")
			os.MkdirAll(filepath.Join(stale, "layer"), 0o755)
			if err := mountDisk(ctx, filepath.Join(stale, "disk.ext4"), filepath.Join(stale, "layer"), 64); err != nil {
				t.Fatal(err)
			}
			if err := d.Cleanup(ctx, map[string]bool{"tkeep": true}); err != nil {
				t.Fatal(err)
			}
			assertGone(t, d, "torphan", pid)
			assertGone(t, d, "tstale", 0)
			if got := get(t, keep, "/"); got != "ok " {
				t.Errorf("kept box: GET / = %q", got)
			}
		})
	}
}

func TestAvailableErrors(t *testing.T) {
	d := New(Config{Runtime: "crun"})
	if err := d.Available(context.Background()); !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("unknown runtime: %v", err)
	}
	d = New(Config{Runtime: "runsc", RuntimePath: "/nonexistent/runsc", StateDir: t.TempDir(), AgentBinary: "/bin/true"})
	if err := d.Available(context.Background()); !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("missing runtime: %v", err)
	} else {
		t.Log(err)
	}
}

func TestAdoptRejectsForeignState(t *testing.T) {
	d := New(Config{Runtime: "runc", StateDir: "/var/lib/cubicle/oci/runc"})
	for name, st := range map[string]driver.State{
		"other driver": {Version: 1, Driver: "gvisor", Data: []byte(`{"id":"a","dir":"/var/lib/cubicle/oci/runc/a"}`)},
		"version":      {Version: 99, Driver: "runc", Data: []byte(`{}`)},
		"dir escape":   {Version: 1, Driver: "runc", Data: []byte(`{"id":"a","dir":"/etc"}`)},
		"bad id":       {Version: 1, Driver: "runc", Data: []byte(`{"id":"../a","dir":"/var/lib/cubicle/oci/runc/../a"}`)},
	} {
		if _, err := d.Adopt(context.Background(), st); err == nil {
			t.Errorf("%s: Adopt accepted %+v", name, st)
		}
	}
}

// TestCleanupRemovesRunscLocks: runsc leaves "<id>_sandbox:<id>.lock" in
// its root when its sandbox was killed -9 (the soak harness found two);
// orphan cleanup removes those of containers it does not keep.
func TestCleanupRemovesRunscLocks(t *testing.T) {
	needs.Runtime(t, "runsc")
	d, _ := newTestDriver(t, "runsc")
	root := d.runtimeRoot()
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	const gone, kept = "aaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbb"
	for _, id := range []string{gone, kept} {
		if err := os.WriteFile(filepath.Join(root, id+"_sandbox:"+id+".lock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(root, "unrelated.lock")
	os.WriteFile(other, nil, 0o600)
	if err := d.Cleanup(context.Background(), map[string]bool{kept: true}); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		filepath.Join(root, gone+"_sandbox:"+gone+".lock"): false,
		filepath.Join(root, kept+"_sandbox:"+kept+".lock"): true,
		other: true,
	} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(path), err == nil, want)
		}
	}
}

// TestStopWithoutRuntimeRecords: a box whose runtime records are
// unreadable (a state file cut short, as a full disk once left runsc's)
// is one its runtime can neither reach nor end. Stop must end it all the
// same, and leave nothing.
func TestStopWithoutRuntimeRecords(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx := context.Background()
			id := "tnorecords" + rt[3:]
			b, err := d.Create(ctx, driver.Spec{ID: id, Shape: driver.Shape{Image: image}, Session: driver.Session{Token: "x"}})
			if err != nil {
				t.Fatal(err)
			}
			pid := b.(*box).data.Pid
			state := filepath.Join(d.runtimeRoot(), id+"_sandbox:"+id+".state")
			if rt == "runc" {
				state = filepath.Join(d.runtimeRoot(), id, "state.json")
			}
			if err := os.WriteFile(state, []byte(`{"id":`), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := d.state(ctx, id); err == nil {
				t.Fatalf("the runtime still reads %s: the test breaks nothing", state)
			}
			if err := b.Stop(ctx); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			assertGone(t, d, id, pid)
		})
	}
}
