package vminit

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IsInit reports whether this process is the init of a cubicle VM: PID 1
// started as /init from the initramfs. (In containers the agent is PID 1
// too, but started under its own path.)
func IsInit() bool {
	return os.Getpid() == 1 && len(os.Args) > 0 && os.Args[0] == "/init"
}

// modulesList is the initramfs file naming the modules to load, in order
// (written by internal/image.WriteInitramfs).
const modulesList = "/etc/cubicle/modules"

// Boot brings the VM up from the initramfs to the point where the agent can
// run: it mounts /dev, /proc and /sys, loads the kernel modules, finds its
// two disks (by serial or contents, see diskFinder), reads the Config from
// the config disk, mounts the root disk and switches to it
// (deleting the initramfs's files to free their memory), mounts /run, /tmp,
// /dev/pts and /dev/shm, sets the hostname, and configures loopback and the
// network from the kernel's ip= parameter. It also turns Ctrl-Alt-Del into
// SIGINT for PID 1, so the agent's signal handler is the one shutdown path.
// A probe boot (ProbeParam) prints ProbeOK and powers off instead.
func Boot(log *slog.Logger) (Config, error) {
	for _, m := range []struct{ src, dst, typ, data string }{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
	} {
		if err := mount(m.src, m.dst, m.typ, unix.MS_NOSUID, m.data); err != nil {
			return Config{}, err
		}
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	loadModules(log)
	if strings.Contains(" "+string(cmdline)+" ", " "+ProbeParam+" ") {
		fmt.Fprintln(os.Stderr, ProbeOK)
		PowerOff()
	}
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)

	disks := diskFinder{sys: "/sys", dev: "/dev"}
	root, err := disks.wait(rootDisk, 30*time.Second)
	if err != nil {
		return Config{}, err
	}
	var cfg Config
	if dev, err := disks.wait(configDisk, 5*time.Second); err != nil {
		return Config{}, err
	} else if cfg, err = readConfig(dev); err != nil {
		return Config{}, err
	}
	if err := os.MkdirAll("/newroot", 0o755); err != nil {
		return Config{}, err
	}
	if err := mount(root, "/newroot", "ext4", 0, ""); err != nil {
		return Config{}, err
	}
	if err := exposeAgent("/newroot" + AgentPath); err != nil {
		log.Warn("the agent binary is not at its path in the guest", "path", AgentPath, "err", err)
	}
	if err := switchRoot("/newroot"); err != nil {
		return Config{}, err
	}
	if err := mountSystem(); err != nil {
		return Config{}, err
	}
	if err := mountVolumes(disks, cfg.Volumes, log); err != nil {
		return Config{}, err
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			log.Warn("sethostname", "err", err)
		}
		writeHosts(cfg.Hostname)
	}
	if err := setupNet(string(cmdline), log); err != nil {
		log.Error("network setup", "err", err)
	}
	return cfg, nil
}

// AgentPath is where programs in a sandbox find the agent binary: the
// desktop image's xdotool wrapper runs "AgentPath xdotool type" so that the
// agent types. Container drivers bind-mount the binary there; a VM's is
// exposeAgent's doing.
const AgentPath = "/opt/cubicle/bin/cubicle-agent"

// exposeAgent bind-mounts this very binary (the initramfs's /init) read-only
// at path, before switchRoot moves the new root, and the mount with it, onto
// /. The initramfs's file is deleted then, but the mount keeps it: no copy,
// no memory. Only an empty mount point is written to the sandbox's disk.
func exposeAgent(path string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o755); err != nil {
		return err
	} else if err := f.Close(); err != nil {
		return err
	}
	if err := unix.Mount(exe, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", exe, path, err)
	}
	if err := unix.Mount("", path, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", path, err)
	}
	return nil
}

// PowerOff syncs the disks and powers the VM off. It does not return.
func PowerOff() {
	unix.Sync()
	// Firecracker has no ACPI power-off: a powered-off guest just halts and
	// the VMM keeps running. It exits when the guest reboots (reboot=k), so
	// under Firecracker "off" is a reboot. Its guests are recognisable by the
	// virtio-mmio devices it lists on the kernel command line.
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	if b, err := os.ReadFile("/proc/cmdline"); err == nil && strings.Contains(string(b), "virtio_mmio.device=") {
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	}
	for {
		_ = unix.Reboot(cmd)
		time.Sleep(time.Second)
	}
}

func mount(src, dst, typ string, flags uintptr, data string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, typ, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", typ, dst, err)
	}
	return nil
}

// loadModules loads the initramfs's modules in order. A module that fails
// is logged, not fatal: what is missing shows as a missing device later,
// with a clearer error.
func loadModules(log *slog.Logger) {
	data, err := os.ReadFile(modulesList)
	if err != nil {
		log.Warn("no module list", "err", err)
		return
	}
	for _, p := range strings.Fields(string(data)) {
		f, err := os.Open(p)
		if err != nil {
			log.Warn("module", "path", p, "err", err)
			continue
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			log.Warn("load module", "module", filepath.Base(p), "err", err)
		}
	}
}

func readConfig(dev string) (Config, error) {
	f, err := os.Open(dev)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	buf := make([]byte, maxConfig)
	n, _ := f.Read(buf)
	for n < len(buf) {
		k, err := f.Read(buf[n:])
		n += k
		if err != nil || k == 0 {
			break
		}
	}
	return DecodeConfig(buf[:n])
}

// switchRoot makes newRoot the root file system, as busybox's switch_root
// does: move the kernel file systems into it, delete the initramfs's files
// (they live in RAM), move newRoot onto / and chroot into it.
func switchRoot(newRoot string) error {
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := os.MkdirAll(newRoot+d, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(d, newRoot+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	ents, _ := os.ReadDir("/")
	for _, e := range ents {
		switch e.Name() {
		case filepath.Base(newRoot), "dev", "proc", "sys":
			continue
		}
		_ = os.RemoveAll("/" + e.Name())
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// mountSystem mounts what a Debian userland expects besides /dev, /proc
// and /sys (which switchRoot moved over).
func mountSystem() error {
	for _, m := range []struct {
		src, dst, typ string
		flags         uintptr
		data          string
	}{
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620,gid=5"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	} {
		if err := mount(m.src, m.dst, m.typ, m.flags, m.data); err != nil {
			return err
		}
	}
	_ = os.MkdirAll("/run/cubicle", 0o755)
	for name, target := range map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	} {
		_ = os.Symlink(target, name)
	}
	return nil
}

// writeHosts makes the hostname resolve without DNS (Chromium and sudo ask).
func writeHosts(hostname string) {
	data, _ := os.ReadFile("/etc/hosts")
	if strings.Contains(string(data), " "+hostname+"\n") {
		return
	}
	if len(data) == 0 {
		data = []byte("127.0.0.1 localhost\n")
	}
	data = append(data, "127.0.1.1 "+hostname+"\n"...)
	_ = os.WriteFile("/etc/hosts", data, 0o644)
	_ = os.WriteFile("/etc/hostname", []byte(hostname+"\n"), 0o644)
}

// setupNet brings loopback up and applies the ip= parameter, if any, with
// a default route via its gateway and its DNS servers in /etc/resolv.conf.
func setupNet(cmdline string, log *slog.Logger) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	v, ok := cmdlineParam(cmdline, "ip")
	if !ok {
		return nil
	}
	n, err := ParseIPParam(v)
	if err != nil {
		return err
	}
	var link netlink.Link
	for deadline := time.Now().Add(10 * time.Second); ; {
		link, err = netlink.LinkByName(n.Device)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", n.Device, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	addr := &netlink.Addr{IPNet: prefixNet(n)}
	if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("address %s: %w", n.Addr, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s up: %w", n.Device, err)
	}
	if n.Gateway.IsValid() {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: n.Gateway.AsSlice()}
		if err := netlink.RouteAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("default route via %s: %w", n.Gateway, err)
		}
	}
	var resolv strings.Builder
	resolv.WriteString("# written by cubicle's VM init from the ip= kernel parameter\n")
	for _, d := range n.DNS {
		resolv.WriteString("nameserver " + d.String() + "\n")
	}
	log.Info("network", "device", n.Device, "addr", n.Addr.String(), "gateway", n.Gateway.String())
	return os.WriteFile("/etc/resolv.conf", []byte(resolv.String()), 0o644)
}
