package firecracker

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// pivotedScript is what the jailer does to a VMM, in shell, run by
// `unshare --mount --pid --fork`: in a mount and PID namespace of its own,
// the jail's root is bind-mounted on itself and pivot_root'ed into. The
// shell, PID 1 of its namespace as Firecracker is under the jailer's
// --new-pid-ns, stands in for the VMM: it needs no binary inside the jail
// after the pivot, only its builtins, and runs until its stdin closes. It
// writes /ready inside the jail once pivoted.
const pivotedScript = `set -e
mount --bind "$1" "$1"
cd "$1"
mkdir -p old
pivot_root . old
echo > /ready
read -r line || true`

// pivoted is a running stand-in VMM.
type pivoted struct {
	vmm int   // host pid of the PID namespace's init, the "Firecracker"
	all []int // every process in the jail: unshare (pivoted with its namespace) and the init
}

// startPivoted starts a stand-in VMM pivot_rooted into root, the way the
// jailer leaves Firecracker.
func startPivoted(t *testing.T, root string) pivoted {
	t.Helper()
	needs.Root(t)
	needs.Command(t, "unshare", "pivot_root", "mount", "sh")
	// --kill-child: unshare's death kills the namespace's init, and with
	// it the namespace.
	cmd := exec.Command("unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "--", "sh", "-c", pivotedScript, "sh", root)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		<-exited
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(root, "ready")); err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("stand-in VMM exited: %s", out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("stand-in VMM did not pivot_root into %s: %s", root, out)
		}
	}
	init := childrenOf(cmd.Process.Pid)
	if len(init) != 1 {
		t.Fatalf("unshare %d has children %v, want one: %s", cmd.Process.Pid, init, out)
	}
	return pivoted{vmm: init[0], all: []int{cmd.Process.Pid, init[0]}}
}

// childrenOf returns the pids of pid's children.
func childrenOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if f := strings.Fields(string(b[i+1:])); i > 0 && len(f) > 1 && f[1] == strconv.Itoa(pid) {
			if c, err := strconv.Atoi(e.Name()); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// TestJailedProcessesPivotRoot: a VMM the jailer pivot_root'ed into its
// jail is found by its sandbox ID — /proc/PID/root reads "/" for it, so a
// check of that link misses it — also once its jail directory has been
// deleted; and Cleanup kills the orphan's processes before it removes its
// jail, leaving the VM it keeps alone.
func TestJailedProcessesPivotRoot(t *testing.T) {
	d := New(Config{ChrootBase: t.TempDir(), FirecrackerBin: "/x/firecracker"})
	pids := map[string][]int{}
	for _, id := range []string{"keep1", "orphan1"} {
		if err := os.MkdirAll(d.paths(id).Root, 0o700); err != nil {
			t.Fatal(err)
		}
		pids[id] = startPivoted(t, d.paths(id).Root).all
	}
	// The condition: the link a chroot check reads says nothing.
	for _, pid := range pids["orphan1"] {
		if root, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/root"); err != nil || root != "/" {
			t.Fatalf("/proc/%d/root of a pivot_rooted process = %q, %v; want \"/\"", pid, root, err)
		}
	}
	got := jailedProcesses(d.jailBase())
	for id, want := range pids {
		if g := slices.Sorted(slices.Values(got[id])); !slices.Equal(g, slices.Sorted(slices.Values(want))) {
			t.Errorf("jailed processes of %s = %v, want %v (all found: %v)", id, g, want, got)
		}
	}
	// Another driver (another daemon, a test) with a chroot base of its
	// own neither sees nor kills these VMs.
	other := New(Config{ChrootBase: t.TempDir(), FirecrackerBin: "/x/firecracker"})
	if got := jailedProcesses(other.jailBase()); len(got) > 0 {
		t.Errorf("a driver with another chroot base sees %v", got)
	}
	if err := other.Cleanup(context.Background(), nil); err != nil {
		t.Errorf("Cleanup of another base: %v", err)
	}
	if err := d.Cleanup(context.Background(), map[string]bool{"keep1": true}); err != nil {
		t.Errorf("Cleanup: %v", err)
	}
	for _, pid := range pids["orphan1"] {
		if _, alive := processStart(pid); alive {
			t.Errorf("orphan's process %d still running after Cleanup", pid)
		}
	}
	if _, err := os.Stat(d.paths("orphan1").JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan's jail: %v, want removed", err)
	}
	for _, pid := range pids["keep1"] {
		if _, alive := processStart(pid); !alive {
			t.Errorf("kept VM's process %d killed by Cleanup", pid)
		}
	}
	// A jail deleted under its running VM (as the old orphan check did)
	// still names the VM's processes.
	if err := os.RemoveAll(d.paths("keep1").JailDir); err != nil {
		t.Fatal(err)
	}
	if g := jailedProcesses(d.jailBase())["keep1"]; len(g) != len(pids["keep1"]) {
		t.Errorf("processes of a VM whose jail is gone: %v, want %v", g, pids["keep1"])
	}
	if err := d.Cleanup(context.Background(), nil); err != nil {
		t.Errorf("Cleanup: %v", err)
	}
	for _, pid := range pids["keep1"] {
		if _, alive := processStart(pid); alive {
			t.Errorf("process %d of a VM with a deleted jail survives Cleanup", pid)
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	mi := `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
29 22 0:25 / /srv rw - xfs /dev/vdb rw
30 29 0:25 /cubicle /srv/cubi\040le rw - xfs /dev/vdb rw
31 22 254:0 /var/lib/x /mnt/bind rw - ext4 /dev/vda rw
garbage
`
	ms := parseMountinfo([]byte(mi))
	if len(ms) != 4 || ms[2].point != "/srv/cubi le" || ms[2].root != "/cubicle" {
		t.Fatalf("parsed %+v", ms)
	}
	for _, tc := range []struct {
		path, dev, rel string
	}{
		{"/srv/cubicle/firecracker", "0:25", "/cubicle/firecracker"},
		{"/srv/cubi le/firecracker", "0:25", "/cubicle/firecracker"},
		{"/srvx/a", "254:0", "/srvx/a"},
		{"/mnt/bind/firecracker", "254:0", "/var/lib/x/firecracker"},
		{"/", "254:0", "/"},
	} {
		dev, rel, ok := fsLocation(ms, tc.path)
		if !ok || dev != tc.dev || rel != tc.rel {
			t.Errorf("fsLocation(%s) = %s %s %v, want %s %s", tc.path, dev, rel, ok, tc.dev, tc.rel)
		}
	}
	// The VMM's own table: its "/" is the jail's bind mount.
	vmm := "40 39 0:25 /cubicle/firecracker/ab12/root / rw - xfs /dev/vdb rw\n41 40 0:25 /cubicle/firecracker/ab12/root/dev/kvm /dev/kvm rw - xfs /dev/vdb rw\n"
	m, ok := rootMount(parseMountinfo([]byte(vmm)))
	if id, idOK := jailID("/cubicle/firecracker", m.root); !ok || !idOK || id != "ab12" {
		t.Errorf("jail of the VMM's root mount %+v: %q %v", m, id, idOK)
	}
	for _, tc := range []struct {
		p, want string
	}{
		{"/b/ab12/root", "ab12"},
		{"/b/ab12/root//deleted", "ab12"},
		{"/b/ab12/root (deleted)", "ab12"},
		{"/b/ab12/root/x", ""},
		{"/b/AB/root", ""},
		{"/bb/ab12/root", ""},
		{"/b/ab12", ""},
	} {
		if id, ok := jailID("/b", tc.p); id != tc.want || ok != (tc.want != "") {
			t.Errorf("jailID(/b, %q) = %q %v, want %q", tc.p, id, ok, tc.want)
		}
	}
}

// FuzzParseMountinfo: a mount table read from /proc; no input may panic,
// and every path parsed from it is what the line said, unescaped.
func FuzzParseMountinfo(f *testing.F) {
	f.Add([]byte("22 1 254:0 / / rw - ext4 /dev/vda rw\n"))
	f.Add([]byte("30 29 0:25 /a\\040b /srv/x\\134y rw - xfs /dev/vdb rw\n"))
	f.Add([]byte("1 2 3:4 \\0 \\ \n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ms := parseMountinfo(data)
		for _, m := range ms {
			if !strings.Contains(m.dev, ":") {
				t.Fatalf("entry without a device: %+v", m)
			}
		}
		if len(ms) > 0 {
			fsLocation(ms, "/srv/cubicle/firecracker")
			rootMount(ms)
		}
	})
}
