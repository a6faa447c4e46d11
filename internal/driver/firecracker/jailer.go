package firecracker

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
)

// Files inside a VM's chroot, as Firecracker (jailed) sees them.
const (
	apiSockName  = "/api.sock"
	vsockName    = "/v.sock"
	kernelName   = "/vmlinux"
	initrdName   = "/initrd"
	diskName     = "/rootfs.ext4"
	configName   = "/config.img"
	logName      = "/firecracker.log"
	metricsName  = "/metrics.json"
	consoleName  = "console.log" // in the jail directory, outside the chroot
	maxSocketLen = 107           // sizeof(sun_path) - 1
)

// paths are the host paths of one VM.
type paths struct {
	JailDir string // CHROOTBASE/<firecracker binary name>/ID
	Root    string // JailDir/root: the chroot
	PidFile string // Root/<firecracker binary name>.pid
	Console string // JailDir/console.log
}

func (d *Driver) execName() string { return filepath.Base(d.cfg.FirecrackerBin) }

// jailBase is where the jailer makes the per-VM directories.
func (d *Driver) jailBase() string { return filepath.Join(d.cfg.ChrootBase, d.execName()) }

func (d *Driver) paths(id string) paths {
	jail := filepath.Join(d.jailBase(), id)
	root := filepath.Join(jail, "root")
	return paths{
		JailDir: jail,
		Root:    root,
		PidFile: filepath.Join(root, d.execName()+".pid"),
		Console: filepath.Join(jail, consoleName),
	}
}

// host returns the host path of a file in the chroot.
func (p paths) host(inJail string) string { return filepath.Join(p.Root, inJail) }

// cgroupVersion is the configured or the host's cgroup version.
func (d *Driver) cgroupVersion() int {
	if d.cfg.CgroupVersion != 0 {
		return d.cfg.CgroupVersion
	}
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return 2
	}
	return 1
}

// memoryLimit is the cgroup memory limit for a VM of memMB guest memory,
// as a --cgroup argument value, or "" for none.
func (d *Driver) memoryLimit(memMB, cgroupVersion int) string {
	if d.cfg.MemoryOverheadMB < 0 {
		return ""
	}
	bytes := strconv.FormatInt(int64(memMB+d.cfg.MemoryOverheadMB)<<20, 10)
	if cgroupVersion == 2 {
		return "memory.max=" + bytes
	}
	return "memory.limit_in_bytes=" + bytes
}

// jailerCommand returns the jailer invocation for VM id with memMB of guest
// memory, joining netns when it is not "": the VM's identity, uid/gid and
// chroot, its cgroups (PARENT/ID: the NUMA node's cpuset when the host
// shows one, the memory limit), a new PID namespace, and after "--"
// Firecracker's own arguments.
func (d *Driver) jailerCommand(id, netns string, memMB, cgroupVersion int) *exec.Cmd {
	args := d.jailerArgs(id, netns, cgroupVersion)
	if lim := d.memoryLimit(memMB, cgroupVersion); lim != "" {
		args = append(args, "--cgroup", lim)
	}
	args = append(args, "--new-pid-ns", "--", "--api-sock", apiSockName)
	// Not CommandContext: the VM must outlive the request that made it.
	return exec.Command(d.cfg.JailerBin, args...) //depcheck:runs jailer
}

// jailerArgs are the jailer arguments every VM of the driver (and its
// probe boot) has, up to the cgroup limits.
func (d *Driver) jailerArgs(id, netns string, cgroupVersion int) []string {
	args := []string{"--id", id, "--uid", strconv.Itoa(d.cfg.UID), "--gid", strconv.Itoa(d.cfg.GID), "--exec-file", d.cfg.FirecrackerBin}
	if cpus := numaCPUs(d.cfg.NumaNode); cpus != "" {
		args = append(args, "--cgroup", fmt.Sprintf("cpuset.mems=%d", d.cfg.NumaNode), "--cgroup", "cpuset.cpus="+cpus)
	}
	args = append(args, "--cgroup-version", strconv.Itoa(cgroupVersion), "--chroot-base-dir", d.cfg.ChrootBase)
	if netns != "" {
		args = append(args, "--netns", netns)
	}
	return append(args, "--parent-cgroup", d.cfg.ParentCgroup)
}

// numaCPUs returns the CPU list of NUMA node n ("0-7"), or "" when the host
// does not show it.
func numaCPUs(n int) string {
	b, err := os.ReadFile(fmt.Sprintf("/sys/devices/system/node/node%d/cpulist", n))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// cgroupControllers returns the controllers named by the --cgroup
// arguments of a jailer command line (e.g. "memory", "cpuset").
func cgroupControllers(args []string) []string {
	var cs []string
	seen := map[string]bool{}
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--" {
			break
		}
		if args[i] != "--cgroup" {
			continue
		}
		c, _, _ := strings.Cut(args[i+1], ".")
		if c != "" && !seen[c] {
			seen[c] = true
			cs = append(cs, c)
		}
	}
	return cs
}

// cgroupDirs returns the cgroup directories the jailer makes for VM id:
// PARENT/ID under the cgroup2 mount for version 2, or under each v1
// hierarchy of controllers. mounts is /proc/self/mounts.
func cgroupDirs(mounts []byte, version int, parent, id string, controllers []string) []string {
	var dirs []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(mounts))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		mnt, typ, opts := f[1], f[2], strings.Split(f[3], ",")
		var match bool
		switch {
		case version == 2 && typ == "cgroup2":
			match = len(dirs) == 0
		case version == 1 && typ == "cgroup":
			for _, c := range controllers {
				for _, o := range opts {
					match = match || o == c
				}
			}
		}
		if d := filepath.Join(mnt, parent, id); match && !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// launchJailer starts the jailer in its own session with its stdio on the
// VM's console log, and returns the pid of the Firecracker process it
// spawns into a new PID namespace (read from the pid file the jailer
// writes in the chroot). The jailer itself exits once it has done so.
func (d *Driver) launchJailer(ctx context.Context, cmd *exec.Cmd, p paths) (int, error) {
	console, err := os.OpenFile(p.Console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer console.Close()
	// Files, not pipes to the daemon: Firecracker keeps writing its serial
	// console there after a daemon restart.
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start jailer: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps the jailer; it exits after the clone
	for {
		if pid, err := hostfile.ReadPid(p.PidFile); err == nil {
			return pid, nil
		}
		select {
		case err := <-exited:
			if err == nil {
				time.Sleep(10 * time.Millisecond) // the write may just have landed
				if pid, err := hostfile.ReadPid(p.PidFile); err == nil {
					return pid, nil
				}
				err = fmt.Errorf("exited without writing %s", p.PidFile)
			}
			return 0, fmt.Errorf("jailer: %w\n%s", err, hostfile.Tail(p.Console, 20))
		case <-ctx.Done():
			cmd.Process.Kill()
			return 0, fmt.Errorf("jailer: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
