package firecracker

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// How a jailed Firecracker is recognised, and why not by /proc/PID/root.
//
// The jailer gives Firecracker a mount namespace of its own, bind-mounts
// the jail's root directory (BASE/ID/root) on itself and pivot_roots into
// it. For such a process /proc/PID/root reads "/" — the path of its root
// seen from its own namespace — so a check of that link finds no VM at
// all, and Cleanup deleted jails under running VMs. What does name the
// jail is the process's own mount table: in /proc/PID/mountinfo its "/"
// mount is that bind mount, and the mount's root field is the jail
// directory's path within its file system (with "//deleted" appended once
// the directory is gone). Together with the file system's device number
// that identifies the jail whatever namespace looks at it, survives the
// jail's deletion (so a VMM whose jail was removed under it is still
// found), and cannot be claimed by an ordinary process: making a mount
// namespace and mounts needs CAP_SYS_ADMIN. It is also scoped to this
// driver's chroot base, so a second daemon (or a test) with another base
// never touches this one's VMs. A process merely chroot'ed into a jail (in
// the daemon's namespace) is still recognised by its root link.

// mountEntry is one line of a mountinfo file.
type mountEntry struct {
	dev   string // major:minor of the file system
	root  string // the mount's root, as a path within the file system
	point string // where it is mounted, in the namespace of the process
}

// parseMountinfo parses /proc/PID/mountinfo (proc(5)): the fields
// "ID PARENT MAJ:MIN ROOT MOUNTPOINT ..." of each line, with the octal
// escapes of ROOT and MOUNTPOINT (\040 for a space, ...) undone. Lines that
// do not parse are skipped.
func parseMountinfo(data []byte) []mountEntry {
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || !strings.Contains(f[2], ":") {
			continue
		}
		out = append(out, mountEntry{dev: f[2], root: unescapeMount(f[3]), point: unescapeMount(f[4])})
	}
	return out
}

// unescapeMount undoes the kernel's \ooo escapes in a mountinfo path.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// fsLocation returns the file system (device) and the path within it of
// the absolute, clean path p, by the mount table mounts of the namespace p
// is named in: the last-mounted entry whose mount point is the longest
// prefix of p holds it.
func fsLocation(mounts []mountEntry, p string) (dev, rel string, ok bool) {
	best := -1
	for i, m := range mounts {
		if !pathWithin(p, m.point) {
			continue
		}
		if best < 0 || len(m.point) >= len(mounts[best].point) {
			best = i
		}
	}
	if best < 0 {
		return "", "", false
	}
	m := mounts[best]
	return m.dev, filepath.Join(m.root, strings.TrimPrefix(p, m.point)), true
}

// pathWithin reports whether p is dir or below it.
func pathWithin(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// rootMount returns the entry of a mount table that is mounted at "/"
// (the last one: later mounts hide earlier ones).
func rootMount(mounts []mountEntry) (mountEntry, bool) {
	var e mountEntry
	found := false
	for _, m := range mounts {
		if m.point == "/" {
			e, found = m, true
		}
	}
	return e, found
}

// jailID returns the sandbox ID of a jail path BASE/ID/root under base (a
// path within a file system, as mountinfo gives it, possibly with the
// kernel's "//deleted" or " (deleted)" mark of a removed directory).
func jailID(base, p string) (string, bool) {
	p = strings.TrimSuffix(strings.TrimSuffix(p, "//deleted"), " (deleted)")
	rel, ok := strings.CutPrefix(p, strings.TrimSuffix(base, "/")+"/")
	if !ok {
		return "", false
	}
	id, rest, _ := strings.Cut(rel, "/")
	if rest != "root" || validID(id) != nil {
		return "", false
	}
	return id, true
}

// jailedProcesses returns, by sandbox ID, the live processes in a jail
// BASE/ID/root under base: pivot_rooted into it by the jailer (recognised
// by their mount table, see above) or chroot'ed into it. They are found
// even when their jail directory is already gone.
func jailedProcesses(base string) map[string][]int {
	out := map[string][]int{}
	if b, err := filepath.EvalSymlinks(base); err == nil {
		base = b
	}
	base = filepath.Clean(base)
	self, _ := os.ReadFile("/proc/self/mountinfo")
	baseDev, baseRel, haveBase := fsLocation(parseMountinfo(self), base)
	selfNS, _ := os.Readlink("/proc/self/ns/mnt")
	// Every process of a mount namespace has the same root mount: read
	// each namespace's table once.
	byNS := map[string]string{} // namespace -> ID, "" for none
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		// Of a process whose root directory was removed, the link reads
		// "/ (deleted)" or "PATH (deleted)".
		if root, err := os.Readlink(filepath.Join(dir, "root")); err == nil && strings.TrimSuffix(root, " (deleted)") != "/" {
			if id, ok := jailID(base, root); ok {
				out[id] = append(out[id], pid)
			}
			continue
		}
		ns, err := os.Readlink(filepath.Join(dir, "ns", "mnt"))
		if err != nil || ns == selfNS || !haveBase {
			continue
		}
		id, seen := byNS[ns]
		if !seen {
			mi, _ := os.ReadFile(filepath.Join(dir, "mountinfo"))
			if m, ok := rootMount(parseMountinfo(mi)); ok && m.dev == baseDev {
				id, _ = jailID(baseRel, m.root)
			}
			byNS[ns] = id
		}
		if id != "" {
			out[id] = append(out[id], pid)
		}
	}
	return out
}
