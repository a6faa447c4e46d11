package drivertest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestScan leaves each kind of trace a driver can leave, for a box ID, and
// checks that Scan reports it under the right kind and reports nothing once
// it is undone: the suite's leak check can fail, for every kind.
func TestScan(t *testing.T) {
	needs.Root(t)
	needs.Command(t, "losetup", "sh", "sleep", "ip")
	state := t.TempDir()
	tests := []struct {
		name string
		kind func(Traces) []string
		// leave makes the trace and returns how to undo it; extra paths
		// it makes are passed to Scan as Paths would be.
		leave func(t *testing.T, id string, extra *[]string) (undo func())
	}{
		{"process by command line", func(tr Traces) []string { return tr.Processes }, func(t *testing.T, id string, extra *[]string) func() {
			return start(t, exec.Command("sh", "-c", "sleep 300", id))
		}},
		{"process by environment", func(tr Traces) []string { return tr.Processes }, func(t *testing.T, id string, extra *[]string) func() {
			cmd := exec.Command("sleep", "300")
			cmd.Env = []string{"A=b", "CUBICLE_SANDBOX_ID=" + id, "C=d"}
			return start(t, cmd)
		}},
		{"process by cgroup", func(tr Traces) []string { return tr.Processes }, func(t *testing.T, id string, extra *[]string) func() {
			cg := testCgroup(t, id)
			cmd := exec.Command("sleep", "300")
			stop := start(t, cmd)
			if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
				stop()
				t.Fatal(err)
			}
			return func() { stop(); removeCgroup(t, cg) }
		}},
		{"cgroup", func(tr Traces) []string { return tr.Cgroups }, func(t *testing.T, id string, extra *[]string) func() {
			cg := testCgroup(t, id)
			return func() { removeCgroup(t, cg) }
		}},
		{"mount", func(tr Traces) []string { return tr.Mounts }, func(t *testing.T, id string, extra *[]string) func() {
			mp := filepath.Join(t.TempDir(), "box-"+id)
			os.Mkdir(mp, 0o755)
			if err := unix.Mount("tmpfs", mp, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			return func() { unix.Unmount(mp, 0) }
		}},
		{"loop device of a deleted file", func(tr Traces) []string { return tr.Loops }, func(t *testing.T, id string, extra *[]string) func() {
			f := filepath.Join(t.TempDir(), id+".img")
			if err := os.WriteFile(f, make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("losetup", "--find", "--show", f).Output()
			if err != nil {
				t.Fatal(err)
			}
			os.Remove(f)
			dev := string(out[:len(out)-1])
			return func() { exec.Command("losetup", "--detach", dev).Run() }
		}},
		{"path under a state directory", func(tr Traces) []string { return tr.Paths }, func(t *testing.T, id string, extra *[]string) func() {
			p := filepath.Join(state, "runtime-root", id+"_sandbox:"+id+".lock")
			os.MkdirAll(filepath.Dir(p), 0o700)
			os.WriteFile(p, nil, 0o600)
			return func() { os.Remove(p) }
		}},
		{"extra path", func(tr Traces) []string { return tr.Paths }, func(t *testing.T, id string, extra *[]string) func() {
			p := filepath.Join(state, "extra-"+id[:4])
			os.WriteFile(p, nil, 0o600)
			*extra = []string{p}
			return func() { os.Remove(p) }
		}},
		{"unix socket of a removed file", func(tr Traces) []string { return tr.Sockets }, func(t *testing.T, id string, extra *[]string) func() {
			p := filepath.Join(t.TempDir(), id+".sock")
			ln, err := net.Listen("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			os.Remove(p)
			return func() { ln.Close() }
		}},
		{"network namespace", func(tr Traces) []string { return tr.Links }, func(t *testing.T, id string, extra *[]string) func() {
			name := "cubicle-" + id
			if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
				t.Fatalf("ip netns add: %v: %s", err, out)
			}
			return func() { exec.Command("ip", "netns", "delete", name).Run() }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "dtscan" + randomString(8)
			var extra []string
			if tr, err := Scan(id, []string{state}, extra); err != nil || !tr.Empty() {
				t.Fatalf("before: %v, %v", tr, err)
			}
			undo := tt.leave(t, id, &extra)
			tr, err := Scan(id, []string{state}, extra)
			if err != nil {
				t.Error(err)
			}
			if len(tt.kind(tr)) == 0 {
				t.Errorf("Scan did not report the %s: %s", tt.name, tr)
			}
			undo()
			if tr, err := waitEmpty(id, []string{state}, extra); err != nil || !tr.Empty() {
				t.Errorf("after undoing it: %s, %v", tr, err)
			}
		})
	}
}

func start(t *testing.T, cmd *exec.Cmd) func() {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return func() { cmd.Process.Kill(); cmd.Wait() }
}

// testCgroup makes a pids cgroup named for id (cgroup v2: at the root).
func testCgroup(t *testing.T, id string) string {
	t.Helper()
	base := "/sys/fs/cgroup/pids"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		base = "/sys/fs/cgroup"
	}
	cg := filepath.Join(base, "drivertest", id)
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	return cg
}

func removeCgroup(t *testing.T, cg string) {
	for i := 0; i < 50; i++ {
		if err := os.Remove(cg); err == nil || os.IsNotExist(err) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the killed process is leaving it
	}
	os.Remove(filepath.Dir(cg))
}

// waitEmpty scans until nothing is found, for a second at most: undoing a
// trace (a killed process exiting) takes a moment here, not in the suite.
func waitEmpty(id string, stateDirs, extra []string) (Traces, error) {
	for i := 0; ; i++ {
		tr, err := Scan(id, stateDirs, extra)
		if err != nil || tr.Empty() || i == 50 {
			return tr, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSever checks that Sever ends this process's connections to a box's
// sockets, and only those.
func TestSever(t *testing.T) {
	id := "dtsever" + randomString(8)
	dir := t.TempDir()
	listen := func(name string) net.Listener {
		ln, err := net.Listen("unix", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
			}
		}()
		return ln
	}
	box, other := listen(id+".sock"), listen("other.sock")
	dial := func(ln net.Listener) net.Conn {
		c, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	toBox, toOther := dial(box), dial(other)
	n, err := Sever(id)
	if err != nil || n != 1 {
		t.Fatalf("Sever = %d, %v; want 1 connection", n, err)
	}
	toBox.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := toBox.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
		t.Errorf("read on a severed connection: %v, want EOF", err)
	}
	if _, err := toOther.Write([]byte("x")); err != nil {
		t.Errorf("another connection was severed too: %v", err)
	}
}
