package drivertest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Traces is what the host holds of one box, found by looking for its ID
// in every place a driver can leave something. Each field lists what was
// found, one human-readable line per thing.
type Traces struct {
	Processes []string // "PID: cmdline (why)": cmdline, environment or cgroup names the box
	Mounts    []string // /proc/self/mountinfo lines that name the box
	Loops     []string // losetup lines whose backing file names the box
	Paths     []string // paths under the driver's state directories, or given by Paths, that exist
	Sockets   []string // bound unix sockets (/proc/net/unix) whose path names the box
	Cgroups   []string // cgroup directories named for the box
	Links     []string // network devices or namespaces named for the box
}

// Empty reports whether nothing was found.
func (tr Traces) Empty() bool { return tr.count() == 0 }

func (tr Traces) count() int {
	return len(tr.Processes) + len(tr.Mounts) + len(tr.Loops) + len(tr.Paths) + len(tr.Sockets) + len(tr.Cgroups) + len(tr.Links)
}

// String lists the traces by kind.
func (tr Traces) String() string {
	var b strings.Builder
	for _, k := range []struct {
		name  string
		items []string
	}{
		{"processes", tr.Processes}, {"mounts", tr.Mounts}, {"loop devices", tr.Loops},
		{"paths", tr.Paths}, {"unix sockets", tr.Sockets}, {"cgroups", tr.Cgroups}, {"network", tr.Links},
	} {
		if len(k.items) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n  %s:", k.name)
		for _, it := range k.items {
			fmt.Fprintf(&b, "\n    %s", it)
		}
	}
	if b.Len() == 0 {
		return "(none)"
	}
	return b.String()
}

// Scan collects the traces of the box id. stateDirs are searched for any
// entry whose path below them mentions id (box directories, runtime state,
// lock files); extra are paths that must not exist (checked as given).
// Processes are matched by their command line, by CUBICLE_SANDBOX_ID=id in
// their environment (what every process a driver starts in a box carries,
// and the only host-visible mark of a runc container's processes), or by a
// cgroup path component containing id. The calling process is never
// counted.
func Scan(id string, stateDirs, extra []string) (Traces, error) {
	if id == "" {
		return Traces{}, errors.New("scan: empty id")
	}
	var tr Traces
	var errs []error
	var err error
	if tr.Processes, err = processes(id); err != nil {
		errs = append(errs, err)
	}
	if tr.Mounts, err = linesMentioning("/proc/self/mountinfo", id); err != nil {
		errs = append(errs, err)
	}
	if tr.Loops, err = loopDevices(id); err != nil {
		errs = append(errs, err)
	}
	tr.Paths = paths(id, stateDirs, extra)
	if tr.Sockets, err = unixSockets(id); err != nil {
		errs = append(errs, err)
	}
	tr.Cgroups = cgroupDirs(id)
	tr.Links = netLinks(id)
	return tr, errors.Join(errs...)
}

// ProcessIDs returns the pids of host processes Scan counts as the box's.
func ProcessIDs(id string) []int {
	var pids []int
	forEachProcess(func(pid int, why string) { pids = append(pids, pid) }, id)
	return pids
}

func processes(id string) ([]string, error) {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		return nil, fmt.Errorf("scan processes: %w", err)
	}
	var out []string
	forEachProcess(func(pid int, why string) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		line := strings.TrimSpace(string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
		if len(line) > 300 {
			line = line[:300] + "…"
		}
		out = append(out, fmt.Sprintf("%d: %s (%s)", pid, line, why))
	}, id)
	return out, nil
}

// forEachProcess calls f for every live, non-zombie process that belongs
// to the box id, saying why it does.
func forEachProcess(f func(pid int, why string), id string) {
	self := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	env := []byte("CUBICLE_SANDBOX_ID=" + id + "\x00")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || zombie(pid) {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		if cmd, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil && bytes.Contains(cmd, []byte(id)) {
			f(pid, "command line")
			continue
		}
		if environ, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil && bytes.Contains(append(environ, 0), env) {
			f(pid, "environment")
			continue
		}
		if cg, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil && cgroupNames(cg, id) {
			f(pid, "cgroup")
		}
	}
}

// cgroupNames reports whether a /proc/PID/cgroup file puts the process in a
// cgroup with a path component containing id.
func cgroupNames(data []byte, id string) bool {
	for _, line := range strings.Split(string(data), "\n") {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, comp := range strings.Split(parts[2], "/") {
			if strings.Contains(comp, id) {
				return true
			}
		}
	}
	return false
}

func zombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // gone
	}
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || i+2 >= len(data) || data[i+2] == 'Z' || data[i+2] == 'X'
}

func linesMentioning(path, id string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", path, err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), id) {
			out = append(out, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("scan %s: %w", path, err)
	}
	return out, nil
}

// loopDevices lists, as losetup shows them, the loop devices whose backing
// file's path mentions id. A deleted backing file still shows its old path
// (with " (deleted)"), so a box directory removed under a live loop device
// is still found.
func loopDevices(id string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		return nil, fmt.Errorf("scan loop devices: losetup: %w", err)
	}
	var found []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, id) {
			found = append(found, strings.Join(strings.Fields(line), " "))
		}
	}
	return found, nil
}

// paths lists what exists of extra, and every entry under the state
// directories whose path relative to its directory mentions id.
func paths(id string, stateDirs, extra []string) []string {
	var out []string
	for _, p := range extra {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	for _, dir := range stateDirs {
		_ = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
			if err != nil || p == dir {
				return nil
			}
			rel, _ := filepath.Rel(dir, p)
			if strings.Contains(rel, id) {
				out = append(out, p)
				if de.IsDir() {
					return fs.SkipDir // one line for a whole box directory
				}
			}
			return nil
		})
	}
	sort.Strings(out)
	return out
}

// unixSockets lists bound unix sockets of this network namespace whose path
// mentions id; a socket outlives its file while a process holds it.
func unixSockets(id string) ([]string, error) {
	lines, err := linesMentioning("/proc/net/unix", id)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range lines {
		f := strings.Fields(l)
		out = append(out, f[len(f)-1])
	}
	return out, nil
}

// cgroupDirs lists the cgroup directories (v1 hierarchies or v2) named for
// the box, down to a depth drivers use (/sys/fs/cgroup/CTRL/PARENT/ID).
func cgroupDirs(id string) []string {
	var out []string
	const root = "/sys/fs/cgroup"
	_ = filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if rel != "." && strings.Count(rel, "/") >= 4 {
			return fs.SkipDir
		}
		if strings.Contains(de.Name(), id) {
			out = append(out, p)
			return fs.SkipDir
		}
		return nil
	})
	return out
}

// netLinks lists network devices of this namespace and named network
// namespaces whose names mention id, or its first 8 characters (device
// names have at most 15).
func netLinks(id string) []string {
	short := id
	if len(short) > 8 {
		short = short[:8]
	}
	var out []string
	for _, dir := range []string{"/sys/class/net", "/run/netns"} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.Contains(e.Name(), id) || strings.Contains(e.Name(), short) {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

// Sever shuts down every unix-socket connection of this process whose peer
// is a socket path mentioning id, and returns how many it shut down. It is
// what a daemon's death does to its connections to a box: the suite calls
// it before a new driver instance adopts the box, as after a restart. (A
// QEMU chardev socket serves one client at a time, so the old connection
// would otherwise keep the new one waiting.) Shutdown, not close: the file
// descriptors stay the runtime's, only the connections end.
func Sever(id string) (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, fmt.Errorf("sever: %w", err)
	}
	n := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			continue
		}
		if u, ok := sa.(*unix.SockaddrUnix); ok && strings.Contains(u.Name, id) {
			if unix.Shutdown(fd, unix.SHUT_RDWR) == nil {
				n++
			}
		}
	}
	return n, nil
}
