package oci

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// Paths inside the box.
const (
	// AgentPath is where the host's agent binary is bind-mounted read-only.
	AgentPath = "/opt/cubicle/bin/cubicle-agent"
	// RunDir is the box's view of the per-sandbox host directory the agent
	// creates its socket in.
	RunDir = "/run/cubicle"
	// AgentSocket is the agent's listening socket inside the box; the host
	// reaches it as SANDBOXDIR/run/agent.sock.
	AgentSocket = RunDir + "/agent.sock"
	// SessionConfig is the image's desktop session config the agent reads.
	SessionConfig = "/etc/cubicle/session.json"
)

// Defaults for zero Spec fields.
const (
	DefaultVCPUs     = 2
	DefaultMemoryMB  = 2048
	DefaultPidsLimit = 1024
	// gvisorPidsFactor scales the pids limit under runsc, where it counts
	// host tasks rather than guest processes (see ociSpec).
	gvisorPidsFactor = 8
	DefaultWidth     = 1280
	DefaultHeight    = 800
	DefaultDPI       = 96
	shmSize          = "268435456" // 256 MiB /dev/shm for Chromium
	// ociVersion is the spec version written: the oldest runtimes we
	// support (runsc 20221219, runc 1.1) implement 1.0.2.
	ociVersion = "1.0.2"
)

// withDefaults fills the zero fields of s.
func withDefaults(s driver.Spec) driver.Spec {
	if s.VCPUs <= 0 {
		s.VCPUs = DefaultVCPUs
	}
	if s.MemoryMB <= 0 {
		s.MemoryMB = DefaultMemoryMB
	}
	if s.PidsLimit <= 0 {
		s.PidsLimit = DefaultPidsLimit
	}
	if s.Width <= 0 {
		s.Width = DefaultWidth
	}
	if s.Height <= 0 {
		s.Height = DefaultHeight
	}
	if s.DPI <= 0 {
		s.DPI = DefaultDPI
	}
	return s
}

// hostname is the box's hostname: a prefix of its ID.
func hostname(id string) string {
	if len(id) > 12 {
		id = id[:12]
	}
	return "cubicle-" + id
}

// ociSpec builds the OCI runtime config of a box. rootfs is the merged
// overlay, runDir the host directory bind-mounted at RunDir, agentBin the
// host agent binary, runc selects the extras only runc honours.
func ociSpec(s driver.Spec, rootfs, runDir, agentBin string, runc bool) *specs.Spec {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
		"CUBICLE_AGENT_TOKEN=" + s.Token,
		"CUBICLE_SANDBOX_ID=" + s.ID,
		"CUBICLE_WIDTH=" + strconv.Itoa(s.Width),
		"CUBICLE_HEIGHT=" + strconv.Itoa(s.Height),
		"CUBICLE_DPI=" + strconv.Itoa(s.DPI),
		"CUBICLE_START_URL=" + s.StartURL,
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+s.Env[k])
	}
	caps := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
		"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
		"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
	memory := int64(s.MemoryMB) << 20
	period := uint64(100000)
	quota := int64(s.VCPUs) * int64(period)
	pids := int64(s.PidsLimit)
	if !runc {
		// runsc puts the limit on the sandbox's host cgroup, which under
		// its ptrace platform holds a stub process per guest thread plus
		// the Sentry's own threads: an idle desktop already uses ~350 host
		// tasks, and Chromium opening one more tab took it past 1024,
		// which crashed the whole sandbox ("error initializing first
		// thread"). The guest's own process count stays bounded by the
		// same cgroup, just in host tasks.
		pids *= gvisorPidsFactor
	}

	sp := &specs.Spec{
		Version:  ociVersion,
		Hostname: hostname(s.ID),
		Root:     &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Args: []string{AgentPath, "--listen", AgentSocket, "--session", SessionConfig},
			Env:  env,
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			// No Rlimits: the box inherits the daemon's. Raising
			// RLIMIT_NOFILE above the daemon's hard limit fails in runc.
			NoNewPrivileges: true,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=" + shmSize}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
			// The agent's input socket lives in memory: under gVisor
			// (--host-uds=create) a socket bound on the rootfs is a host
			// socket, which runsc checkpoint cannot save.
			{Destination: "/run/cubicle-input", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "mode=755", "size=64k"}},
			{Destination: RunDir, Type: "bind", Source: runDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
			{Destination: AgentPath, Type: "bind", Source: agentBin, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/" + cgroupParent + "/" + s.ID,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace},
			},
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &memory},
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:   &specs.LinuxPids{Limit: &pids},
				Devices: []specs.LinuxDeviceCgroup{
					{Allow: false, Access: "rwm"},
				},
			},
		},
	}
	if s.Net != nil {
		// Join the namespace netpool made (its eth0 carries the address
		// and the default route) instead of a new, empty one.
		for i := range sp.Linux.Namespaces {
			if sp.Linux.Namespaces[i].Type == specs.NetworkNamespace {
				sp.Linux.Namespaces[i].Path = s.Net.Netns
			}
		}
	}
	if runc {
		// gVisor has its own /sys and /proc and ignores these; runc needs
		// them to hide host kernel knobs from the box.
		sp.Mounts = append(sp.Mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}})
		sp.Linux.MaskedPaths = []string{
			"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
			"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
		}
		sp.Linux.ReadonlyPaths = []string{
			"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
		}
	}
	// /dev/null etc.: runc creates the default devices itself and gVisor
	// provides its own; allowing them in the device cgroup is runc's job.
	for _, d := range []struct {
		major, minor int64
	}{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 2}, {136, -1}} {
		major, minor := d.major, d.minor
		dev := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Access: "rwm"}
		if minor >= 0 {
			dev.Minor = &minor
		}
		sp.Linux.Resources.Devices = append(sp.Linux.Resources.Devices, dev)
	}
	return sp
}

// validID reports whether id is a sandbox ID this driver accepts: non-empty
// [a-z0-9], at most 64 characters (it names directories and containers).
func validID(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return fmt.Errorf("invalid sandbox id %q: want [a-z0-9]", id)
		}
	}
	return nil
}

// writeNetFiles writes /etc/resolv.conf (from s.Net.DNS), /etc/hosts and
// /etc/hostname into the box's rootfs. They land in the box's own overlay
// layer, never in the shared image; an image's symlink there (e.g. to
// systemd-resolved's stub file) is replaced, not followed.
func writeNetFiles(rootfs string, s driver.Spec) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	var resolv strings.Builder
	for _, a := range s.Net.DNS {
		fmt.Fprintf(&resolv, "nameserver %s\n", a)
	}
	if len(s.Net.DNS) == 0 {
		// No resolver configured: say so instead of leaving the image's.
		resolv.WriteString("# no DNS servers configured for this sandbox\n")
	}
	name := hostname(s.ID)
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", s.Net.Addr.Addr(), name)
	if err := root.MkdirAll("etc", 0o755); err != nil {
		return err
	}
	for _, f := range []struct{ path, data string }{
		{"etc/resolv.conf", resolv.String()},
		{"etc/hosts", hosts},
		{"etc/hostname", name + "\n"},
	} {
		if err := root.Remove(f.path); err != nil && !os.IsNotExist(err) {
			return err
		}
		w, err := root.OpenFile(f.path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Join("/", f.path), err)
		}
		_, err = w.WriteString(f.data)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
