package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/cubicle-dev/cubicle/internal/driver/oci"
)

// Where the backends leave things on the host, besides the daemon's data
// dir: what the host-side checks below look at.

// fcChrootBase is the Firecracker jailer's chroot base the daemon uses:
// per-VM jails (disk, kernel, sockets) live in BASE/<firecracker>/ID.
func fcChrootBase() string { return envOrDefault("CUBICLE_FIRECRACKER_CHROOT", "/srv/cubicle") }

// sandboxIfNames are the names the host end of sandbox id's veth or TAP
// would have (netpool: a prefix and 10 hex digits of the ID's SHA-256, as
// IFNAMSIZ allows 15 characters).
func sandboxIfNames(id string) []string {
	sum := sha256.Sum256([]byte(id))
	h := hex.EncodeToString(sum[:5])
	return []string{"cbv" + h, "cbt" + h}
}

// cgroupDirs lists the cgroups named id under the "cubicle" parent that
// runc, runsc and the Firecracker jailer make (cgroup v1: one per
// controller; v2: one).
func cgroupDirs(id string) []string {
	var out []string
	for _, pat := range []string{"/sys/fs/cgroup/*/cubicle/" + id, "/sys/fs/cgroup/cubicle/" + id} {
		m, _ := filepath.Glob(pat)
		out = append(out, m...)
	}
	return out
}

// fcJails lists the Firecracker jail directories of id.
func fcJails(id string) []string {
	m, _ := filepath.Glob(filepath.Join(fcChrootBase(), "*", id))
	return m
}

// backendTraces lists what of sandbox id the backend's own places still
// hold: a QEMU box's state directory (disk overlay, QMP and agent sockets,
// console), a Firecracker jail, cgroups, the sandbox's network devices.
func backendTraces(dataDir, backend, id string) []string {
	var left []string
	switch backend {
	case "qemu":
		if _, err := os.Stat(filepath.Join(dataDir, "qemu", id)); err == nil {
			left = append(left, "qemu state dir "+filepath.Join(dataDir, "qemu", id))
		}
		for _, p := range hostQEMU(id) {
			left = append(left, fmt.Sprintf("qemu process %d", p))
		}
	case "firecracker":
		for _, j := range fcJails(id) {
			left = append(left, "firecracker jail "+j)
		}
	case "gvisor", "runc":
		// runc keeps a directory per container, runsc ID_sandbox:ID.state
		// and .lock files.
		root := oci.DefaultRuntimeRoot(filepath.Join(dataDir, "oci", backend))
		if recs, _ := filepath.Glob(filepath.Join(root, id+"*")); len(recs) > 0 {
			left = append(left, "runtime state "+strings.Join(recs, " "))
		}
	}
	for _, c := range cgroupDirs(id) {
		left = append(left, "cgroup "+c)
	}
	for _, n := range sandboxIfNames(id) {
		if _, err := netlink.LinkByName(n); err == nil {
			left = append(left, "link "+n)
		}
	}
	if _, err := os.Stat("/run/netns/cubicle-" + id); err == nil {
		left = append(left, "netns /run/netns/cubicle-"+id)
	}
	for _, l := range loopsOf(id) {
		left = append(left, "loop device "+l)
	}
	return left
}

// hostState is a set of things on the host that sandboxes make, each
// described by a line that names it: processes, mounts, loop devices,
// network namespaces, links, nft rules, netpool leases, cgroups, jails and
// paths of a daemon's data dir. Comparing two states finds what appeared in
// between without knowing a sandbox's ID.
type hostState map[string]bool

// snapshotHost records the hostState of the daemon with data dir dataDir;
// the daemon's own process (daemonPid) is left out, since it restarts.
func snapshotHost(dataDir string, daemonPid int) hostState {
	s := hostState{}
	// Processes that belong to sandboxes: runtimes and VMMs name the data
	// dir (runsc --root, QEMU's sockets) or the jail, container processes
	// carry CUBICLE_SANDBOX_ID.
	dirs, _ := os.ReadDir("/proc")
	for _, e := range dirs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == daemonPid || pid == os.Getpid() {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if bytes.Contains(cmdline, []byte(dataDir+"/")) || bytes.Contains(cmdline, []byte(fcChrootBase()+"/")) ||
			bytes.Contains(environ, []byte("CUBICLE_SANDBOX_ID=")) {
			comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
			s[fmt.Sprintf("process %d %s: %.160s", pid, bytes.TrimSpace(comm), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))] = true
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	mountPoints := map[string]bool{}
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (strings.HasPrefix(f[4], dataDir+"/") || strings.HasPrefix(f[4], "/run/netns/cubicle-") || strings.HasPrefix(f[4], fcChrootBase()+"/")) {
			s["mount "+f[4]] = true
			mountPoints[f[4]] = true
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			s["loop device "+strings.Split(f, "/")[3]+" → "+strings.TrimSpace(string(b))] = true
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "cubicle-") {
				s["netns "+e.Name()] = true
			}
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if n := l.Attrs().Name; strings.HasPrefix(n, "cbv") || strings.HasPrefix(n, "cbt") {
				s["link "+n] = true
			}
		}
	}
	for _, r := range nftRules() {
		s["nft "+r] = true
	}
	for _, pat := range []string{"/sys/fs/cgroup/*/cubicle/*", "/sys/fs/cgroup/cubicle/*"} {
		m, _ := filepath.Glob(pat)
		for _, c := range m {
			if fi, err := os.Stat(c); err == nil && fi.IsDir() {
				s["cgroup "+c] = true
			}
		}
	}
	jails, _ := filepath.Glob(filepath.Join(fcChrootBase(), "*", "*"))
	for _, j := range jails {
		s["firecracker jail "+j] = true
	}
	filepath.WalkDir(dataDir, func(p string, e os.DirEntry, err error) error {
		if err == nil && p != dataDir && !(e.Type().IsRegular() && filepath.Dir(p) == dataDir) {
			// Files at the top (log, store, key) change but are the
			// daemon's; everything below belongs to sandboxes, drivers
			// and the pool.
			s["path "+p] = true
		}
		if err == nil && e.IsDir() && mountPoints[p] {
			return filepath.SkipDir // a sandbox's root file system: its mount is the trace
		}
		return nil
	})
	return s
}

// newSince lists what is in s but not in before, sorted; past 40 lines it
// says how many more.
func (s hostState) newSince(before hostState) []string {
	var out []string
	for k := range s {
		if !before[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	if len(out) > 40 {
		out = append(out[:40], fmt.Sprintf("… and %d more", len(out)-40))
	}
	return out
}

// nftHandle strips what changes in a listed rule without the rule
// changing: handles and counters.
var nftHandle = regexp.MustCompile(`\s+# handle \d+|\s+counter packets \d+ bytes \d+`)

// nftRules lists the rules and chains of cubicle's nft tables in this
// network namespace, one per line ("" when nft is missing or there are
// none).
func nftRules() []string {
	var out []string
	for _, fam := range []string{"inet", "bridge"} {
		b, err := exec.Command("nft", "list", "table", fam, "cubicle").Output()
		if err != nil {
			continue
		}
		chain := ""
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			l := strings.TrimSpace(nftHandle.ReplaceAllString(sc.Text(), ""))
			if strings.HasPrefix(l, "chain ") {
				chain = strings.TrimSuffix(l, " {")
			}
			if l == "" || l == "}" || strings.HasPrefix(l, "table ") {
				continue
			}
			out = append(out, fam+" "+chain+": "+l)
		}
	}
	return out
}

// tcpListener is a listening TCP socket of this network namespace.
type tcpListener struct {
	Addr  string // host:port
	Port  int
	Inode string
}

// tcpListeners parses /proc/net/tcp and tcp6 for sockets in LISTEN state.
func tcpListeners() ([]tcpListener, error) {
	var out []tcpListener
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" { // 0A: TCP_LISTEN
				continue
			}
			host, port, ok := strings.Cut(fs[1], ":")
			if !ok {
				continue
			}
			p, err := strconv.ParseUint(port, 16, 16)
			if err != nil {
				continue
			}
			ip, err := hex.DecodeString(host)
			if err != nil {
				continue
			}
			// /proc/net/tcp prints each 32-bit word of the address in
			// host (little-endian) order.
			for i := 0; i+4 <= len(ip); i += 4 {
				ip[i], ip[i+1], ip[i+2], ip[i+3] = ip[i+3], ip[i+2], ip[i+1], ip[i]
			}
			out = append(out, tcpListener{Addr: net.JoinHostPort(net.IP(ip).String(), strconv.Itoa(int(p))), Port: int(p), Inode: fs[9]})
		}
	}
	return out, nil
}

// socketOwners maps socket inodes to the pids holding them open.
func socketOwners() map[string][]int {
	out := map[string][]int{}
	dirs, _ := os.ReadDir("/proc")
	for _, e := range dirs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name()))
			if err == nil && strings.HasPrefix(l, "socket:[") {
				ino := strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")
				out[ino] = append(out[ino], pid)
			}
		}
	}
	return out
}
