// Package oci is the sandbox driver for OCI container runtimes: "gvisor"
// (runsc, a user-space kernel) and "runc" (plain Linux namespaces). Only
// cmd/cubicled and tests import it; the manager sees it as a driver.Driver.
//
// Each box is one container whose init is the cubicle agent. The driver keeps
// everything of a box in STATEDIR/ID:
//
//	layer/upper/ layer/work/  the box's writable overlay layer; with a
//	                 disk limit, layer/ is the mount of disk.ext4
//	disk.ext4        sparse file of Config.DiskMB holding the layer
//	volumes/NAME/    the mount of each volume the box holds, bind-mounted
//	                 at the volume's path in the box
//	bundle/          config.json and rootfs/ (the overlay mount)
//	run/             bind-mounted at /run/cubicle; the agent's socket lives here
//	console.log      the container's stdout and stderr (and the runtime's)
//	pid              the runtime's pid file
//
// and the runtime's own state (its state and lock files) in RuntimeRoot,
// off the data disk (see DefaultRuntimeRoot). The config is built
// from the runtime-spec Go types (github.com/opencontainers/runtime-spec) so
// it is checked by the compiler against the very schema runsc and runc parse,
// rather than hand-written JSON that drifts. The rootfs is an overlayfs mount
// whose lower layer is the shared, read-only image directory: boxes start in
// milliseconds without copying the ~1.5 GB image, and no box can change the
// image or another box. The upper layer must not itself be on overlayfs.
//
// Runtimes run detached in their own session, so a daemon restart does not
// kill boxes; Adopt re-attaches from the State blob.
package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// Config configures a Driver.
type Config struct {
	// Runtime is "runsc" (backend "gvisor") or "runc" (backend "runc").
	Runtime string
	// RuntimePath is the runtime binary; empty means DefaultRunscPath for
	// runsc and runc looked up on PATH.
	RuntimePath string
	// StateDir holds one directory per box and the runtime's state, e.g.
	// /var/lib/cubicle/oci/gvisor. It must not be on overlayfs.
	StateDir string
	// AgentBinary is the host path of the static cubicle-agent binary; it
	// is bind-mounted read-only at AgentPath in every box.
	AgentBinary string
	// RuntimeArgs are extra global flags for the runtime (before the
	// subcommand), e.g. ["--platform=kvm"] or ["--debug-log=/tmp/runsc/"].
	RuntimeArgs []string
	// RuntimeRoot is the runtime's --root, where it keeps its state and
	// lock files; empty means DefaultRuntimeRoot(StateDir), or
	// STATEDIR/runtime-root when an earlier version's boxes are still
	// recorded there.
	RuntimeRoot string
	// DiskMB bounds what a box can write to its root filesystem: its
	// writable layer is an ext4 filesystem of this size in a sparse file
	// (loop-mounted), so a full disk is the box's ENOSPC and not the
	// host's. 0 = unbounded (the layer is a plain directory under
	// StateDir).
	DiskMB int
}

// Driver starts boxes with runsc or runc. It is safe for concurrent use.
type Driver struct {
	cfg Config
	// adoptProbe bounds one runtime call of Adopt, and adoptRetry is the
	// first wait before a box the runtime could not tell about is asked
	// about again; zero means the defaults of adopt.go (tests shorten
	// them).
	adoptProbe, adoptRetry time.Duration
	// criu is what `criu check` said on this host (runc's pause), asked
	// once.
	criu criuCheck

	mu      sync.Mutex
	version string // the runtime's, as Available last found it
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver for cfg. It does not touch the host; call Available.
func New(cfg Config) *Driver {
	if cfg.RuntimePath == "" && cfg.Runtime == "runsc" {
		cfg.RuntimePath = DefaultRunscPath
	}
	if cfg.RuntimeRoot == "" {
		cfg.RuntimeRoot = DefaultRuntimeRoot(cfg.StateDir)
		if legacyRoot(cfg.StateDir) {
			cfg.RuntimeRoot = filepath.Join(cfg.StateDir, "runtime-root")
		}
	}
	if cfg.RuntimePath == "" {
		if p, err := exec.LookPath(cfg.Runtime); err == nil { //depcheck:runs runc
			cfg.RuntimePath = p
		} else {
			cfg.RuntimePath = cfg.Runtime
		}
	}
	return &Driver{cfg: cfg}
}

// Name returns "gvisor" for runsc and "runc" for runc.
func (d *Driver) Name() string {
	if d.isRunsc() {
		return "gvisor"
	}
	return d.cfg.Runtime
}

// Isolation returns driver.IsolationGVisor for runsc and
// driver.IsolationNamespace for runc.
func (d *Driver) Isolation() string {
	if d.isRunsc() {
		return driver.IsolationGVisor
	}
	return driver.IsolationNamespace
}

func (d *Driver) isRunsc() bool { return d.cfg.Runtime == "runsc" }

func (d *Driver) runtimeRoot() string { return d.cfg.RuntimeRoot }

func (d *Driver) boxDir(id string) string { return filepath.Join(d.cfg.StateDir, id) }

// unavailable wraps driver.ErrUnavailable with a reason.
func (d *Driver) unavailable(format string, args ...any) error {
	return fmt.Errorf("%s: %w: %s", d.Name(), driver.ErrUnavailable, fmt.Sprintf(format, args...))
}

// Available checks that the runtime is installed and runs, that the daemon
// is root, that overlayfs and cgroups are there (and loop devices, ext4 and
// mkfs.ext4 for a disk limit), that the state directory is usable for
// overlay upper layers and that the agent binary exists.
func (d *Driver) Available(ctx context.Context) error {
	if d.cfg.Runtime != "runsc" && d.cfg.Runtime != "runc" {
		return d.unavailable("unknown runtime %q (want runsc or runc)", d.cfg.Runtime)
	}
	if os.Geteuid() != 0 {
		return d.unavailable("needs root to start containers (euid %d)", os.Geteuid())
	}
	path, err := exec.LookPath(d.cfg.RuntimePath) //depcheck:runs /usr/local/libexec/cubicle/runsc runc
	if err != nil {
		how := "apt-get install runc"
		if d.isRunsc() {
			how = "scripts/runsc.sh builds and installs the pinned one"
		}
		return d.unavailable("%s not found (%s): %v", d.cfg.Runtime, how, err)
	}
	version, err := d.runtimeVersion(ctx, path)
	d.mu.Lock()
	d.version = version
	d.mu.Unlock()
	if err != nil {
		return d.unavailable("%v", err)
	}
	if !hasFilesystem("overlay") {
		return d.unavailable("kernel has no overlayfs (modprobe overlay)")
	}
	if err := checkCgroups(); err != nil {
		return d.unavailable("%v", err)
	}
	if d.cfg.StateDir == "" || !filepath.IsAbs(d.cfg.StateDir) {
		return d.unavailable("state directory %q is not an absolute path", d.cfg.StateDir)
	}
	if err := os.MkdirAll(d.cfg.StateDir, 0o700); err != nil {
		return d.unavailable("state directory: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.cfg.StateDir, &st); err == nil && st.Type == unix.OVERLAYFS_SUPER_MAGIC {
		return d.unavailable("state directory %s is on overlayfs, which cannot hold an overlay upper layer", d.cfg.StateDir)
	}
	if err := d.claimRoot(); err != nil {
		return d.unavailable("runtime root: %v", err)
	}
	if d.cfg.DiskMB > 0 {
		for _, tool := range []string{"mkfs.ext4", "mount"} {
			if _, err := exec.LookPath(tool); err != nil {
				return d.unavailable("a disk limit needs %s (apt-get install e2fsprogs mount): %v", tool, err)
			}
		}
		if _, err := os.Stat("/dev/loop-control"); err != nil || !hasFilesystem("ext4") {
			return d.unavailable("a disk limit needs loop devices and ext4 (modprobe loop ext4), or --disk-mb 0")
		}
	}
	fi, err := os.Stat(d.cfg.AgentBinary)
	if err != nil {
		return d.unavailable("agent binary: %v", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return d.unavailable("agent binary %s is not an executable file", d.cfg.AgentBinary)
	}
	return nil
}

func hasFilesystem(name string) bool {
	data, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}

// checkCgroups checks for a memory and pids controller, cgroup v1 or v2.
func checkCgroups() error {
	if data, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		c := " " + strings.TrimSpace(string(data)) + " "
		for _, want := range []string{"memory", "pids", "cpu"} {
			if !strings.Contains(c, " "+want+" ") {
				return fmt.Errorf("cgroup v2 lacks the %s controller", want)
			}
		}
		return nil
	}
	for _, want := range []string{"memory", "pids", "cpu"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", want)); err != nil {
			return fmt.Errorf("no cgroup v1 %s controller at /sys/fs/cgroup/%s", want, want)
		}
	}
	return nil
}

// maxSocketPath is the longest unix socket path Linux accepts
// (sizeof(sun_path) - 1).
const maxSocketPath = 107

// Create starts a box from spec and waits until its agent accepts
// connections on its socket, bounded by ctx (or two minutes when ctx has no
// deadline). On error everything it made is removed again.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (_ driver.Box, err error) {
	if err := validID(spec.ID); err != nil {
		return nil, err
	}
	if spec.Net != nil && spec.Net.Netns == "" {
		return nil, fmt.Errorf("create %s: an OCI box needs a network namespace to join (a veth attachment), got TAP %q", spec.ID, spec.Net.TAP)
	}
	spec = withDefaults(spec)
	// Mount the resolved path, so the mount table names the image version
	// in use and image GC keeps it while the box runs.
	image, err := filepath.EvalSymlinks(spec.Image)
	if err != nil {
		return nil, fmt.Errorf("create %s: image: %w", spec.ID, err)
	}
	spec.Image = image
	if fi, err := os.Stat(filepath.Join(spec.Image, "etc")); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("create %s: image %q is not a rootfs directory", spec.ID, spec.Image)
	}
	if _, hasDeadline := ctx.Deadline(); !hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	teardown := context.WithoutCancel(ctx)
	var cu cleanup.Stack
	defer cu.Run()

	dir, bundle, err := d.prepare(ctx, spec, &cu)
	if err != nil {
		return nil, err
	}

	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer console.Close()
	pidFile := filepath.Join(dir, "pid")
	cu.Add(func() { d.deleteContainer(teardown, spec.ID) })
	netns := ""
	if spec.Net != nil {
		netns = spec.Net.Netns
	}
	// The runtime is not killed when ctx ends: killed half-way through
	// `run`, runc leaves the box's cgroups and runsc a running sandbox
	// and gofer that neither `delete` nor Cleanup can find (it wrote no
	// state yet). It finishes, bounded on its own, and the roll-back
	// deletes the whole container; ctx is checked right after.
	runCtx, cancelRun := context.WithTimeout(teardown, time.Minute)
	defer cancelRun()
	cmd := d.commandNet(runCtx, netns, "run", "--detach", "--pid-file", pidFile, "--bundle", bundle, spec.ID)
	// The container inherits these files as its stdio: they must be files,
	// not pipes to the daemon, so it outlives us.
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("create %s: %s run: %w\n%s", spec.ID, d.cfg.Runtime, err, hostfile.Tail(filepath.Join(dir, "console.log"), 20))
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	pid, err := hostfile.ReadPid(pidFile)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	b := newBox(d, d.dataOf(spec, dir, pid))
	cu.Add(func() { b.stopWatch() })
	if err := b.waitAgent(ctx); err != nil {
		return nil, fmt.Errorf("create %s: %w\n%s", spec.ID, err, hostfile.Tail(filepath.Join(dir, "console.log"), 20))
	}
	cu.Release()
	return b, nil
}

// dataOf is what the store keeps of box spec, started in dir as pid.
func (d *Driver) dataOf(spec driver.Spec, dir string, pid int) boxData {
	data := boxData{ID: spec.ID, Runtime: d.cfg.Runtime, Pid: pid, Dir: dir, Image: spec.Image}
	if spec.Net != nil {
		data.Netns = spec.Net.Netns
		if spec.Net.Addr.IsValid() {
			data.Addr = spec.Net.Addr.String()
			if spec.Net.Gateway.IsValid() {
				data.Gateway = spec.Net.Gateway.String()
			}
		}
	}
	for _, v := range spec.Volumes {
		data.Volumes = append(data.Volumes, v.Name)
	}
	return data
}

// prepare makes the directory of box spec.ID, its writable layer (on its
// own disk with a disk limit), its rootfs overlay of spec.Image with the
// mount points and network files in it, its volumes, and its bundle's
// config.json; and returns the directory and the bundle. cu gets what
// undoes each step.
func (d *Driver) prepare(ctx context.Context, spec driver.Spec, cu *cleanup.Stack) (dir, bundle string, err error) {
	if err := os.MkdirAll(d.cfg.StateDir, 0o700); err != nil {
		return "", "", err
	}
	dir = d.boxDir(spec.ID)
	if sock := filepath.Join(dir, "run", "agent.sock"); len(sock) > maxSocketPath {
		return "", "", fmt.Errorf("create %s: agent socket path %s is longer than %d bytes; use a shorter state directory", spec.ID, sock, maxSocketPath)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", "", fmt.Errorf("create %s: sandbox directory %s already exists", spec.ID, dir)
		}
		return "", "", err
	}
	made := dir // dir is "" once an error is returned
	cu.Add(func() { removeBoxDir(made) })
	bundle = filepath.Join(dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	runDir := filepath.Join(dir, "run")
	layer := filepath.Join(dir, "layer")
	for _, p := range []string{layer, rootfs, runDir} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return "", "", err
		}
	}
	if d.cfg.DiskMB > 0 {
		if err := mountDisk(ctx, filepath.Join(dir, "disk.ext4"), layer, d.cfg.DiskMB); err != nil {
			return "", "", fmt.Errorf("create %s: %w", spec.ID, err)
		}
	}
	upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return "", "", err
		}
	}
	if err := mountOverlay(spec.Image, upper, work, rootfs); err != nil {
		return "", "", fmt.Errorf("create %s: %w", spec.ID, err)
	}
	if err := makeMountPoints(rootfs); err != nil {
		return "", "", fmt.Errorf("create %s: prepare rootfs: %w", spec.ID, err)
	}
	if spec.Net != nil {
		if err := writeNetFiles(rootfs, spec); err != nil {
			return "", "", fmt.Errorf("create %s: network files: %w", spec.ID, err)
		}
	}
	if err := mountVolumes(ctx, dir, spec.Image, rootfs, spec.Volumes); err != nil {
		return "", "", fmt.Errorf("create %s: %w", spec.ID, err)
	}
	sp := ociSpec(spec, rootfs, runDir, d.cfg.AgentBinary, !d.isRunsc())
	sp.Mounts = append(sp.Mounts, volumeMounts(dir, spec.Volumes)...)
	cfg, err := json.MarshalIndent(sp, "", "  ")
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o600); err != nil {
		return "", "", err
	}

	return dir, bundle, nil
}

// makeMountPoints creates the targets of the box's bind mounts in the
// merged rootfs (so they land in the upper layer), without following any
// symlink out of it.
func makeMountPoints(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(strings.TrimPrefix(RunDir, "/"), 0o755); err != nil {
		return err
	}
	agent := strings.TrimPrefix(AgentPath, "/")
	if err := root.MkdirAll(filepath.Dir(agent), 0o755); err != nil {
		return err
	}
	f, err := root.OpenFile(agent, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	return f.Close()
}

// command returns the runtime invoked with its global flags and args.
func (d *Driver) command(ctx context.Context, args ...string) *exec.Cmd {
	return d.commandNet(ctx, "", args...)
}

// commandNet is command for a box that joins the network namespace at
// netns, or has no network when netns is "".
func (d *Driver) commandNet(ctx context.Context, netns string, args ...string) *exec.Cmd {
	network := netns != ""
	global := []string{"--root", d.runtimeRoot()}
	if d.isRunsc() {
		// --host-uds=create lets the agent's socket, created inside the
		// sandbox on the bind mount, be a real host socket the daemon can
		// connect to. --network=sandbox: gVisor's own network stack
		// takes over the interfaces, addresses and routes of the network
		// namespace the box joins (prepared by netpool); without one,
		// --network=none: loopback only. (No --oci-seccomp: the boxes
		// carry no filter of their own. Debian's runsc of 2022 needed
		// one to turn GLib's close_range(N, ~0U) from EINVAL into
		// ENOSYS; the pinned runsc caps the range as Linux does, and
		// TestCloseRangeInBox checks it does.)
		netMode := "--network=none"
		if network {
			netMode = "--network=sandbox"
		}
		// --gofer-network-namespace=new: each gofer gets a network
		// namespace of its own, as with Debian's runsc; the default
		// ("null") pins one shared namespace with a bind mount in the
		// runtime root, which outlives every box and would be a mount
		// left behind.
		global = append(global, "--host-uds=create", netMode, "--gofer-network-namespace=new")
	}
	global = append(global, d.cfg.RuntimeArgs...)
	argv := append(global, args...)
	if network && d.isRunsc() && len(args) > 0 && (args[0] == "run" || args[0] == "restore") {
		// runsc 20221219 refuses --network=sandbox when it thinks the
		// box's namespace is the root one, and it tells by whether
		// /proc/sys/net/core/rmem_default exists there — which, since
		// Linux 6.x namespaced that knob, it does in every namespace.
		// So `runsc run` gets a private mount namespace in which that
		// directory, as seen from the box's network namespace (procfs
		// keeps /proc/sys/net per network namespace), is an empty tmpfs.
		// The host's view, and the box's own /proc (gVisor's), are
		// untouched.
		script := `nsenter --net="$CUBICLE_NETNS" mount -t tmpfs -o ro,size=4k cubicle-runsc-netfix /proc/sys/net/core && exec "$0" "$@"`
		argv = append([]string{"--mount", "--propagation", "slave", "--", "/bin/sh", "-c", script, d.cfg.RuntimePath}, argv...)
		cmd := exec.CommandContext(ctx, "unshare", argv...) //depcheck:runs sh nsenter mount
		cmd.Env = append(os.Environ(), "CUBICLE_NETNS="+netns)
		cmd.WaitDelay = 5 * time.Second
		return cmd
	}
	cmd := exec.CommandContext(ctx, d.cfg.RuntimePath, argv...) //depcheck:runs /usr/local/libexec/cubicle/runsc runc
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// output runs the runtime and returns its stdout; errors carry its stderr.
func (d *Driver) output(ctx context.Context, args ...string) ([]byte, error) {
	cmd := d.command(ctx, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", d.cfg.Runtime, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// containerState is the part of `runtime state` / `runtime list` we use.
type containerState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
}

// state returns the runtime's view of container id.
func (d *Driver) state(ctx context.Context, id string) (containerState, error) {
	out, err := d.output(ctx, "state", id)
	if err != nil {
		return containerState{}, err
	}
	var cs containerState
	if err := json.Unmarshal(jsonPart(out, '{'), &cs); err != nil {
		return containerState{}, fmt.Errorf("%s state %s: %w", d.cfg.Runtime, id, err)
	}
	return cs, nil
}

// list returns the containers in the runtime root.
func (d *Driver) list(ctx context.Context) ([]containerState, error) {
	if _, err := os.Stat(d.runtimeRoot()); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	out, err := d.output(ctx, "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var cs []containerState
	if p := jsonPart(out, '['); len(p) > 0 && string(p) != "null" {
		if err := json.Unmarshal(p, &cs); err != nil {
			return nil, fmt.Errorf("%s list: %w", d.cfg.Runtime, err)
		}
	}
	return cs, nil
}

// jsonPart skips any log lines a runtime prints before its JSON.
func jsonPart(out []byte, open byte) []byte {
	s := strings.TrimSpace(string(out))
	if i := strings.IndexByte(s, open); i > 0 {
		s = s[i:]
	}
	return []byte(s)
}

// deleteContainer kills and deletes container id. A container the runtime
// does not know is not an error.
func (d *Driver) deleteContainer(ctx context.Context, id string) error {
	if _, err := os.Stat(filepath.Join(d.runtimeRoot(), id)); errors.Is(err, os.ErrNotExist) && !d.isRunsc() {
		return removeCgroups(id)
	}
	d.output(ctx, "kill", id, "KILL") // best effort: delete --force kills too
	_, err := d.output(ctx, "delete", "--force", id)
	if err != nil && isNotExist(err) {
		err = nil
	}
	if err != nil {
		// The runtime could not end it — its records unreadable (a state
		// file a full disk cut short, root.go), or the runtime stuck — so
		// the driver ends what runs of the box itself.
		if ferr := d.forceEnd(id); ferr != nil {
			err = errors.Join(err, ferr)
		} else {
			err = nil
		}
	}
	if err == nil && d.isRunsc() {
		d.removeRunscLocks(id)
	}
	if err == nil {
		err = removeCgroups(id)
	}
	return err
}

// removeRunscLocks removes runsc's lock files of container id
// ("<id>_sandbox:<id>.lock" in the runtime root). runsc deletes its state
// file but leaves the lock when its sandbox process was killed -9: the
// soak harness found 2 left after 212 sandboxes and 21 such kills.
func (d *Driver) removeRunscLocks(id string) {
	locks, _ := filepath.Glob(filepath.Join(d.runtimeRoot(), id+"_sandbox:*.lock"))
	for _, l := range locks {
		_ = os.Remove(l)
	}
}

// forceEnd ends container id without its runtime: it kills the host
// processes of the box — those in its cgroups (runc's container, runsc's
// sandbox), and those naming its bundle in their arguments (runsc's
// gofer and sandbox, a runtime call still going; nothing else does) —
// waits for them to be gone, and removes what the runtime recorded of it
// in its root.
func (d *Driver) forceEnd(id string) error {
	bundle := filepath.Join(d.boxDir(id), "bundle")
	ps, err := procwatch.FindOwn(func(argv []string) bool {
		for i, a := range argv {
			if a == "--bundle="+bundle || (a == "--bundle" && i+1 < len(argv) && argv[i+1] == bundle) {
				return true
			}
		}
		return false
	})
	if err != nil {
		return err
	}
	for _, cg := range cgroupDirs(id) {
		raw, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		for _, f := range strings.Fields(string(raw)) {
			if pid, err := strconv.Atoi(f); err == nil {
				if p, err := procwatch.Lookup(pid); err == nil {
					ps = append(ps, p)
				}
			}
		}
	}
	for _, p := range ps {
		if p.Alive() {
			_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left := 0
		for _, p := range ps {
			if p.Alive() {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("end %s without its runtime: %d of its processes still alive after SIGKILL", id, left)
		}
	}
	recs, _ := filepath.Glob(filepath.Join(d.runtimeRoot(), id+"_sandbox:*"))
	if !d.isRunsc() {
		recs = append(recs, filepath.Join(d.runtimeRoot(), id))
	}
	var errs []error
	for _, r := range recs {
		if err := os.RemoveAll(r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func isNotExist(err error) bool {
	s := err.Error()
	return strings.Contains(s, "does not exist") || strings.Contains(s, "not exist") || strings.Contains(s, "not found")
}

// dialAgent connects to the agent socket in dir.
func dialAgent(ctx context.Context, dir string) (net.Conn, error) {
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", filepath.Join(dir, "run", "agent.sock"))
}
