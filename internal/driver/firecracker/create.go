package firecracker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
)

// Create boots a VM from spec: it prepares the jail (a copy-on-write copy
// of the image's disk, links to its kernel and initramfs, the config drive,
// log and metrics files), starts Firecracker under the jailer and configures and starts the
// VM through the API. It returns once the guest is starting; the agent
// answers on DialAgent when the guest has booted. The start-up is bounded
// by ctx (or two minutes when ctx has no deadline); the VM outlives ctx. On
// error everything it made is removed again.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (_ driver.Box, err error) {
	if err := validID(spec.ID); err != nil {
		return nil, err
	}
	spec = withDefaults(spec)
	bootArgs, err := KernelArgs(spec, d.cfg.ExtraKernelArgs)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	files, err := d.resolve(spec.Image)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	if _, hasDeadline := ctx.Deadline(); !hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	var cu cleanup.Stack
	defer cu.Run()

	p := d.paths(spec.ID)
	for _, s := range []string{apiSockName, vsockName + "_4294967295"} {
		if len(p.host(s)) > maxSocketLen {
			return nil, fmt.Errorf("create %s: socket path %s is longer than %d bytes; use a shorter chroot base", spec.ID, p.host(s), maxSocketLen)
		}
	}
	if err := os.MkdirAll(d.jailBase(), 0o711); err != nil {
		return nil, err
	}
	if err := os.Mkdir(p.JailDir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create %s: jail %s already exists", spec.ID, p.JailDir)
		}
		return nil, err
	}
	cu.Add(func() { os.RemoveAll(p.JailDir) })
	// The jailer makes root/ too and chowns it to UID:GID; make it first
	// so the files can be put in before Firecracker starts.
	if err := os.Mkdir(p.Root, 0o700); err != nil {
		return nil, err
	}
	start := time.Now()
	method, err := hostfile.Clone(files.Disk, p.host(diskName))
	if err != nil {
		return nil, fmt.Errorf("create %s: disk: %w", spec.ID, err)
	}
	slog.Debug("firecracker disk copy", "sandbox", spec.ID, "method", method, "duration", time.Since(start))
	uid, gid := d.cfg.UID, d.cfg.GID
	if err := os.Chown(p.host(diskName), uid, gid); err != nil {
		return nil, err
	}
	if err := linkOrCopy(files.Kernel, p.host(kernelName)); err != nil {
		return nil, fmt.Errorf("create %s: kernel: %w", spec.ID, err)
	}
	initrd := ""
	if files.Initrd != "" {
		initrd = initrdName
		if err := linkOrCopy(files.Initrd, p.host(initrdName)); err != nil {
			return nil, fmt.Errorf("create %s: initrd: %w", spec.ID, err)
		}
	}
	// The guest's config (token, hostname, environment) on a read-only
	// drive, never on the command line.
	vols, err := guestVolumes(spec.Volumes)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	blob, err := vminit.EncodeConfig(guestConfig(spec, vols))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.host(configName), blob, 0o400); err != nil {
		return nil, err
	}
	if err := os.Chown(p.host(configName), uid, gid); err != nil {
		return nil, err
	}
	// Firecracker opens its log and metrics files without creating them.
	for _, f := range []string{logName, metricsName} {
		if err := touch(p.host(f), uid, gid); err != nil {
			return nil, err
		}
	}

	var volFiles []string
	for _, v := range spec.Volumes {
		volFiles = append(volFiles, v.File)
	}
	cu.Add(func() { unmountJail(p.JailDir) })
	if err := bindVolumes(p, volFiles, uid, gid); err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}

	if n := spec.Net; n != nil && n.TAP != "" {
		if err := d.giveTAP(n.Netns, n.TAP, uid, gid); err != nil {
			return nil, fmt.Errorf("create %s: %w", spec.ID, err)
		}
	}

	version := d.cgroupVersion()
	netns := ""
	if spec.Net != nil {
		netns = spec.Net.Netns
	}
	cmd := d.jailerCommand(spec.ID, netns, spec.MemoryMB, version)
	mounts, _ := os.ReadFile("/proc/self/mounts")
	cgroups := cgroupDirs(mounts, version, d.cfg.ParentCgroup, spec.ID, cgroupControllers(cmd.Args[1:]))
	cu.Add(func() { removeCgroups(cgroups) })
	pid, err := d.launch(ctx, cmd, p)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	st, ok := processStart(pid)
	if !ok {
		return nil, fmt.Errorf("create %s: firecracker (pid %d) exited at once\n%s", spec.ID, pid, hostfile.Tail(p.Console, 20))
	}
	data := boxData{
		ID: spec.ID, Pid: pid, StartTime: st, JailDir: p.JailDir,
		APISocket: p.host(apiSockName), Vsock: p.host(vsockName), Disk: p.host(diskName), Cgroups: cgroups,
		MemoryMB: spec.MemoryMB, Netns: netns, Volumes: volFiles,
	}
	if spec.Net != nil {
		data.TAP = spec.Net.TAP
	}
	b := newBox(d, data)
	cu.Add(func() {
		b.kill()
		b.stopWatch()
	})
	c := newAPIClient(b.data.APISocket)
	if err := waitAPI(ctx, c, b.dead); err != nil {
		return nil, fmt.Errorf("create %s: %w\n%s", spec.ID, err, hostfile.Tail(p.Console, 20))
	}
	vc := vmConfig{
		LogPath: logName, LogLevel: d.cfg.LogLevel, MetricsPath: metricsName,
		VCPUs: int64(spec.VCPUs), MemoryMB: int64(spec.MemoryMB),
		Kernel: kernelName, Initrd: initrd, BootArgs: bootArgs,
		Disk: diskName, DriveLimit: d.cfg.DriveLimit.model(), ConfigDisk: configName,
		Volumes: len(volFiles), VsockPath: vsockName,
	}
	if n := spec.Net; n != nil && n.TAP != "" {
		vc.TAP, vc.MAC = n.TAP, n.MAC
		vc.RxLimit, vc.TxLimit = d.cfg.NetRxLimit.model(), d.cfg.NetTxLimit.model()
	}
	if err := configure(ctx, c, vc); err != nil {
		return nil, fmt.Errorf("create %s: %w\n%s", spec.ID, err, tailFiles(p, 20))
	}
	d.register(b)
	cu.Release()
	return b, nil
}

// touch creates an empty file owned by uid:gid, mode 0600.
func touch(path string, uid, gid int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chown(path, uid, gid)
}

// tailFiles returns the ends of the VM's console and Firecracker log.
func tailFiles(p paths, n int) string {
	var parts []string
	for _, f := range []string{p.Console, p.host(logName)} {
		if t := hostfile.Tail(f, n); t != "" {
			parts = append(parts, t)
		}
	}
	return strings.Join(parts, "\n")
}
