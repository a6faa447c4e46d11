// Package qemu is the sandbox driver for QEMU virtual machines: each box is
// a VM with its own guest kernel (isolation "vm"), accelerated with KVM where
// a guest provably boots under it and emulated with TCG otherwise — correct
// but slow, so driver.Accelerator tells "auto" backend choice to skip it.
// Only cmd/cubicled and tests import it.
//
// A box boots the image's VM form (internal/image.LookupVM): its kernel,
// an initramfs holding the daemon's agent binary as /init (built once per
// agent and kernel by image.Initramfs), and a qcow2 overlay on the image's
// ext4 disk, so the base disk is never written and a box's disk costs
// milliseconds to make. Everything of a box lives in STATEDIR/ID:
//
//	overlay.qcow2   the box's disk (copy-on-write over the image's disk.ext4)
//	config.img      the vminit.Config (token, hostname, environment)
//	agent.sock      QEMU's chardev socket of the agent's virtio-serial port
//	qmp.sock        QMP control socket
//	console.log     the guest's serial console; qemu.log QEMU's own output
//	box.json        the box's state (also kept by the manager's store)
//
// The agent channel is the virtio-serial port vminit.AgentPort multiplexed
// with yamux (the guest serves, the host opens one stream per connection),
// since the machine has no vhost-vsock and a TAP network is optional. QEMU
// runs in its own session, so a daemon restart leaves VMs running; Adopt
// reconnects to the chardev socket.
package qemu

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// Defaults for zero Spec fields. Memory and CPUs are modest because under
// TCG every guest cycle is emulated.
const (
	DefaultVCPUs    = 2
	DefaultMemoryMB = 1024
	DefaultWidth    = 1280
	DefaultHeight   = 800
	DefaultDPI      = 96
)

// Config configures a Driver.
type Config struct {
	// QEMU is the qemu-system-x86_64 binary; empty means looked up on PATH.
	QEMU string
	// QEMUImg is the qemu-img binary; empty means looked up on PATH.
	QEMUImg string
	// StateDir holds one directory per box and the initramfs cache, e.g.
	// /var/lib/cubicle/qemu.
	StateDir string
	// AgentBinary is the static cubicle-agent the guest runs as init.
	AgentBinary string
	// Machine is the QEMU machine type: "q35" (default) or "microvm" (no
	// PCI, no firmware; virtio-mmio devices). Under TCG on QEMU 7.2 a
	// Debian 6.1 guest hangs on microvm right after failing to calibrate
	// its TSC ("No reference (HPET/PMTIMER) available"), while q35 boots
	// to the agent in about 10 s, so q35 is the default.
	Machine string
	// Accel forces "kvm" or "tcg"; empty means KVM when Accelerated.
	Accel string
	// ProbeImage is the rootfs path of an image (as image.Lookup returns
	// it) whose kernel Accelerated boots under KVM to see whether KVM
	// really runs guests; nil disables the probe (KVM is then not used).
	ProbeImage func() (string, error)
}

// Driver starts QEMU VMs. It is safe for concurrent use.
type Driver struct {
	cfg Config

	accelMu   sync.Mutex
	accelDone bool
	accelKVM  bool
	accelWhy  string
}

var (
	_ driver.Driver      = (*Driver)(nil)
	_ driver.Accelerator = (*Driver)(nil)
)

// New returns a driver for cfg. It does not touch the host; call Available.
func New(cfg Config) *Driver {
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if cfg.QEMUImg == "" {
		cfg.QEMUImg = "qemu-img"
	}
	if cfg.Machine == "" {
		cfg.Machine = "q35"
	}
	for _, p := range []*string{&cfg.QEMU, &cfg.QEMUImg} {
		if lp, err := exec.LookPath(*p); err == nil { //depcheck:runs qemu-system-x86_64 qemu-img
			*p = lp
		}
	}
	return &Driver{cfg: cfg}
}

// Name returns "qemu".
func (d *Driver) Name() string { return "qemu" }

// Isolation returns driver.IsolationVM.
func (d *Driver) Isolation() string { return driver.IsolationVM }

func (d *Driver) unavailable(format string, args ...any) error {
	return fmt.Errorf("qemu: %w: %s", driver.ErrUnavailable, fmt.Sprintf(format, args...))
}

func (d *Driver) boxDir(id string) string { return filepath.Join(d.cfg.StateDir, id) }

// Available checks for QEMU, qemu-img, the agent binary and a usable state
// directory. KVM is not required: without it VMs run under TCG.
func (d *Driver) Available(ctx context.Context) error {
	if d.cfg.Machine != "microvm" && d.cfg.Machine != "q35" {
		return d.unavailable("unknown machine %q (want microvm or q35)", d.cfg.Machine)
	}
	for _, bin := range []string{d.cfg.QEMU, d.cfg.QEMUImg} {
		if _, err := exec.LookPath(bin); err != nil { //depcheck:runs qemu-system-x86_64 qemu-img
			return d.unavailable("%s not found (apt-get install qemu-system-x86 qemu-utils): %v", filepath.Base(bin), err)
		}
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(vctx, d.cfg.QEMU, "-version").CombinedOutput(); err != nil { //depcheck:runs qemu-system-x86_64
		return d.unavailable("%s -version failed: %v: %s", d.cfg.QEMU, err, bytes.TrimSpace(out))
	}
	if d.cfg.StateDir == "" || !filepath.IsAbs(d.cfg.StateDir) {
		return d.unavailable("state directory %q is not an absolute path", d.cfg.StateDir)
	}
	if err := os.MkdirAll(d.cfg.StateDir, 0o700); err != nil {
		return d.unavailable("state directory: %v", err)
	}
	if fi, err := os.Stat(d.cfg.AgentBinary); err != nil || !fi.Mode().IsRegular() {
		return d.unavailable("agent binary %q: %v", d.cfg.AgentBinary, err)
	}
	// The agent is the guest's init, run before any root file system with
	// a dynamic loader is mounted; a dynamic one panics the guest kernel
	// with "No working init found".
	if f, err := elf.Open(d.cfg.AgentBinary); err != nil {
		return d.unavailable("agent binary %s: %v", d.cfg.AgentBinary, err)
	} else {
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				return d.unavailable("agent binary %s is dynamically linked; build it with CGO_ENABLED=0", d.cfg.AgentBinary)
			}
		}
	}
	return nil
}

// Accelerated reports whether VMs run under KVM. The first call decides,
// and the answer is kept: /dev/kvm must open, the CPU must announce vmx or
// svm (a paravirtual KVM such as PVM does not, and standard kernels hang or
// fail under it), and a probe boot of the ProbeImage's kernel under KVM
// must reach the guest's init within 30 seconds.
func (d *Driver) Accelerated(ctx context.Context) bool {
	kvm, _ := d.accel(ctx)
	return kvm
}

// AccelReason says why Accelerated answered as it did.
func (d *Driver) AccelReason(ctx context.Context) string {
	_, why := d.accel(ctx)
	return why
}

func (d *Driver) accel(ctx context.Context) (bool, string) {
	d.accelMu.Lock()
	defer d.accelMu.Unlock()
	if d.accelDone {
		return d.accelKVM, d.accelWhy
	}
	kvm, why, final := d.probeKVM(ctx)
	if final {
		d.accelDone, d.accelKVM, d.accelWhy = true, kvm, why
	}
	return kvm, why
}

// probeKVM decides KVM use; final is false when the answer may change
// (no image to probe with yet).
func (d *Driver) probeKVM(ctx context.Context) (kvm bool, why string, final bool) {
	switch d.cfg.Accel {
	case "tcg":
		return false, "accel forced to tcg", true
	case "kvm":
		return true, "accel forced to kvm", true
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("no usable /dev/kvm: %v", err), true
	}
	f.Close()
	if !cpuHasVirt() {
		return false, "/dev/kvm exists but the CPU has no vmx/svm flag (paravirtual KVM such as PVM does not boot standard guests)", true
	}
	if d.cfg.ProbeImage == nil {
		return false, "no probe image configured", true
	}
	rootfs, err := d.cfg.ProbeImage()
	if err != nil {
		return false, fmt.Sprintf("no image to probe KVM with: %v", err), false
	}
	vm, err := image.LookupVM(rootfs)
	if err != nil {
		return false, fmt.Sprintf("no VM image to probe KVM with: %v", err), false
	}
	initrd, err := image.Initramfs(vm, d.cfg.AgentBinary, filepath.Join(d.cfg.StateDir, initramfsDir))
	if err != nil {
		return false, err.Error(), false
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	args := []string{"-M", d.cfg.Machine, "-accel", "kvm", "-cpu", "host", "-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", vm.Kernel, "-initrd", initrd, "-append", "console=ttyS0 panic=-1 " + vminit.ProbeParam}
	out, _ := exec.CommandContext(pctx, d.cfg.QEMU, args...).CombinedOutput() //depcheck:runs qemu-system-x86_64
	if bytes.Contains(out, []byte(vminit.ProbeOK)) {
		return true, "a probe guest booted under KVM", true
	}
	tail := out
	if len(tail) > 300 {
		tail = tail[len(tail)-300:]
	}
	return false, fmt.Sprintf("a probe guest did not boot under KVM: %s", bytes.TrimSpace(tail)), true
}

func cpuHasVirt() bool {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "flags") {
			for _, f := range strings.Fields(line) {
				if f == "vmx" || f == "svm" {
					return true
				}
			}
			return false
		}
	}
	return false
}

// maxSocketPath is the longest unix socket path Linux accepts.
const maxSocketPath = 107

func withDefaults(s driver.Spec) driver.Spec {
	if s.VCPUs <= 0 {
		s.VCPUs = DefaultVCPUs
	}
	if s.MemoryMB <= 0 {
		s.MemoryMB = DefaultMemoryMB
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

// hostname is the guest's hostname: a prefix of its ID.
func hostname(id string) string {
	if len(id) > 12 {
		id = id[:12]
	}
	return "cubicle-" + id
}

// AttachesVolumes reports that QEMU VMs mount volumes
// (driver.VolumeAttacher): each is a virtio-blk disk the guest's init
// mounts.
func (d *Driver) AttachesVolumes() bool { return true }

// volumeUUIDs reads the ext4 UUID of each volume's file: the guest finds
// the volume's disk by it.
func volumeUUIDs(vols []driver.Volume) ([]vminit.Volume, error) {
	var out []vminit.Volume
	for _, v := range vols {
		vv, err := vminit.VolumeOnDisk(v.File, v.Path)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		out = append(out, vv)
	}
	return out, nil
}

// guestConfig is what the guest gets on its config disk.
func guestConfig(s driver.Spec, vols []vminit.Volume) vminit.Config {
	env := map[string]string{
		"PATH":               "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":               "/root",
		"LANG":               "C.UTF-8",
		"CUBICLE_SANDBOX_ID": s.ID,
		"CUBICLE_WIDTH":      strconv.Itoa(s.Width),
		"CUBICLE_HEIGHT":     strconv.Itoa(s.Height),
		"CUBICLE_DPI":        strconv.Itoa(s.DPI),
		"CUBICLE_START_URL":  s.StartURL,
	}
	for k, v := range s.Env {
		env[k] = v
	}
	return vminit.Config{Token: s.Token, Hostname: hostname(s.ID), Env: env, Volumes: vols}
}

// kernelArgs is the guest kernel's command line. The guest kernel logs
// only errors (the console is emulated byte by byte under TCG); panics
// reboot, which -no-reboot turns into QEMU exiting.
func kernelArgs(s driver.Spec) string {
	args := []string{"console=ttyS0", "panic=-1", "quiet", "loglevel=3", "random.trust_cpu=on", "8250.nr_uarts=1"}
	if s.Net != nil && s.Net.Addr.IsValid() {
		args = append(args, vminit.IPParam(vminit.Net{Addr: s.Net.Addr, Gateway: s.Net.Gateway, DNS: s.Net.DNS}, hostname(s.ID)))
	}
	return strings.Join(args, " ")
}

// qemuArgs is QEMU's command line for a box in dir.
func (d *Driver) qemuArgs(s driver.Spec, dir, kernel, initrd string, kvm bool) []string {
	dev := func(kind string) string { // virtio transport of the machine
		if d.cfg.Machine == "microvm" {
			return "virtio-" + kind + "-device"
		}
		return "virtio-" + kind + "-pci"
	}
	machine := d.cfg.Machine
	if machine == "microvm" {
		machine += ",x-option-roms=off,rtc=on,acpi=on"
	}
	accel, cpu := "tcg,thread=multi", "max"
	if kvm {
		accel, cpu = "kvm", "host"
	}
	args := []string{
		"-name", "cubicle-" + s.ID,
		"-M", machine, "-accel", accel, "-cpu", cpu,
		"-smp", strconv.Itoa(s.VCPUs), "-m", strconv.Itoa(s.MemoryMB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-chardev", "file,id=console,path=" + filepath.Join(dir, "console.log"),
		"-serial", "chardev:console",
		"-kernel", kernel, "-initrd", initrd, "-append", kernelArgs(s),
		"-drive", "id=root,if=none,format=qcow2,discard=unmap,file=" + filepath.Join(dir, "overlay.qcow2"),
		"-device", dev("blk") + ",drive=root,serial=" + vminit.RootSerial,
		"-drive", "id=config,if=none,format=raw,readonly=on,file=" + filepath.Join(dir, "config.img"),
		"-device", dev("blk") + ",drive=config,serial=" + vminit.ConfigSerial,
		"-device", dev("serial"),
		"-chardev", "socket,id=agent,server=on,wait=off,path=" + filepath.Join(dir, "agent.sock"),
		"-device", "virtserialport,chardev=agent,name=" + vminit.AgentPort,
		"-object", "rng-random,id=rng,filename=/dev/urandom",
		"-device", dev("rng") + ",rng=rng",
		"-qmp", "unix:" + filepath.Join(dir, "qmp.sock") + ",server=on,wait=off",
	}
	// Volumes: QEMU locks each file, so a second VM cannot open one a
	// first holds, whatever the manager believes.
	for i, v := range s.Volumes {
		id := fmt.Sprintf("vol%d", i)
		args = append(args,
			"-drive", "id="+id+",if=none,format=raw,file="+strings.ReplaceAll(v.File, ",", ",,"),
			"-device", dev("blk")+",drive="+id+",serial=cubicle-"+id)
	}
	if s.Net != nil && s.Net.TAP != "" {
		nic := dev("net") + ",netdev=net0"
		if s.Net.MAC != "" {
			nic += ",mac=" + s.Net.MAC
		}
		args = append(args, "-netdev", "tap,id=net0,ifname="+s.Net.TAP+",script=no,downscript=no", "-device", nic)
	}
	return args
}

// Create boots a VM from spec and waits until its agent answers, bounded by
// ctx (or five minutes when ctx has no deadline: TCG boots slowly). On
// error everything it made is removed again.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (_ driver.Box, err error) {
	if err := validID(spec.ID); err != nil {
		return nil, err
	}
	spec = withDefaults(spec)
	vm, err := image.LookupVM(spec.Image)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	if _, hasDeadline := ctx.Deadline(); !hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	teardown := context.WithoutCancel(ctx)
	var cu cleanup.Stack
	defer cu.Run()

	initrd, err := image.Initramfs(vm, d.cfg.AgentBinary, filepath.Join(d.cfg.StateDir, initramfsDir))
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	dir := d.boxDir(spec.ID)
	if sock := filepath.Join(dir, "agent.sock"); len(sock) > maxSocketPath {
		return nil, fmt.Errorf("create %s: socket path %s is longer than %d bytes; use a shorter state directory", spec.ID, sock, maxSocketPath)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create %s: sandbox directory %s already exists", spec.ID, dir)
		}
		return nil, err
	}
	cu.Add(func() { os.RemoveAll(dir) })
	if err := d.makeOverlay(ctx, vm.Disk, filepath.Join(dir, "overlay.qcow2")); err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	vols, err := volumeUUIDs(spec.Volumes)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	blob, err := vminit.EncodeConfig(guestConfig(spec, vols))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.img"), blob, 0o600); err != nil {
		return nil, err
	}
	kvm := d.cfg.Accel == "kvm" || (d.cfg.Accel == "" && d.Accelerated(ctx))
	args := d.qemuArgs(spec, dir, vm.Kernel, initrd, kvm)
	name := d.cfg.QEMU
	if spec.Net != nil && spec.Net.Netns != "" {
		// The TAP lives in the sandbox's network namespace: QEMU must open
		// it from there.
		args = append([]string{"--net=" + spec.Net.Netns, "--", name}, args...)
		name = "nsenter"
	}
	argv := append([]string{name}, args...)
	pid, exited, err := startQEMU(dir, argv)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	cu.Add(func() { syscall.Kill(pid, syscall.SIGKILL) })
	data := boxData{ID: spec.ID, Pid: pid, Dir: dir, Image: vm.Dir, Initramfs: initrd, KVM: kvm, StartTime: procStartTime(pid), Argv: argv}
	if err := writeBoxData(data); err != nil {
		return nil, err
	}
	b := newBox(d, data, exited)
	cu.Add(func() { b.Stop(teardown) })
	if err := b.waitAgent(ctx); err != nil {
		return nil, fmt.Errorf("create %s: %w\n%s\n%s", spec.ID, err,
			hostfile.Tail(filepath.Join(dir, "qemu.log"), 10), hostfile.Tail(filepath.Join(dir, "console.log"), 20))
	}
	cu.Release()
	return b, nil
}

// startQEMU starts argv (QEMU, or nsenter running it) for the box in
// dir, in a session of its own so that the VM outlives the daemon, with
// its output in qemu.log. exited is closed once the child is reaped.
func startQEMU(dir string, argv []string) (pid int, exited <-chan struct{}, err error) {
	logf, err := os.OpenFile(filepath.Join(dir, "qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, nil, err
	}
	defer logf.Close()
	// Not CommandContext: the VM must outlive the request.
	cmd := exec.Command(argv[0], argv[1:]...) //depcheck:runs qemu-system-x86_64 nsenter
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("start qemu: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() // reap our child
	return cmd.Process.Pid, done, nil
}

// makeOverlay creates the box's qcow2 disk on top of the image's raw ext4
// disk. The base is opened read-only by QEMU and never written.
func (d *Driver) makeOverlay(ctx context.Context, base, overlay string) error {
	cmd := exec.CommandContext(ctx, d.cfg.QEMUImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, overlay) //depcheck:runs qemu-img
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img create: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// validID reports whether id is a sandbox ID this driver accepts.
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

// procStartTime returns the start time of pid (0 when it is not running),
// which with the pid names the process: pids are reused, start times are not.
func procStartTime(pid int) uint64 {
	p, _ := procwatch.Lookup(pid)
	return p.StartTime
}

// running reports whether the process pid started at startTime (any, when
// 0) is alive and not a zombie.
func running(pid int, startTime uint64) bool {
	return procwatch.Process{Pid: pid, StartTime: startTime}.Alive()
}

func writeBoxData(b boxData) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.Dir, "box.json"), data, 0o600)
}

// initramfsDir, under the state directory, caches the initramfs of each
// image and agent. Its name is a valid ID: Cleanup must not take it for a
// box's directory.
const initramfsDir = "initramfs"

// Cleanup kills the VMs and removes the directories under the state
// directory whose IDs are not in keep, and initramfs files no kept box
// uses (older than a minute, so a concurrent Create keeps its own).
func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	ents, err := os.ReadDir(d.cfg.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	used := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() || validID(e.Name()) != nil || e.Name() == initramfsDir {
			continue
		}
		dir := filepath.Join(d.cfg.StateDir, e.Name())
		var data boxData
		raw, rerr := os.ReadFile(filepath.Join(dir, "box.json"))
		if rerr == nil {
			rerr = json.Unmarshal(raw, &data)
		}
		if keep[e.Name()] {
			used[data.Initramfs] = true
			continue
		}
		if rerr == nil && data.Dir == dir && running(data.Pid, data.StartTime) {
			_ = unix.Kill(data.Pid, unix.SIGKILL)
			waitGone(data.Pid, data.StartTime, 10*time.Second)
		}
		// A daemon killed between starting QEMU and writing box.json
		// left a VM that no record names.
		d.killVMsOf(dir)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	cache, _ := filepath.Glob(filepath.Join(d.cfg.StateDir, initramfsDir, "*"))
	for _, p := range cache {
		if fi, err := os.Stat(p); err == nil && !used[p] && time.Since(fi.ModTime()) > time.Minute {
			os.Remove(p)
		}
	}
	return errors.Join(errs...)
}

// vmsOf finds the QEMU processes of the box in dir by their arguments,
// which name the directory: what a daemon killed before it could record
// a VM's pid left. Only our own QEMU (or the nsenter about to exec it)
// is taken for one.
func (d *Driver) vmsOf(dir string) []procwatch.Process {
	ps, _ := procwatch.FindOwn(func(argv []string) bool {
		if base := filepath.Base(argv[0]); base != filepath.Base(d.cfg.QEMU) && base != "nsenter" {
			return false
		}
		return slices.ContainsFunc(argv, func(a string) bool { return strings.Contains(a, dir+"/") })
	})
	return ps
}

// killVMsOf kills every QEMU of the box in dir.
func (d *Driver) killVMsOf(dir string) {
	for _, p := range d.vmsOf(dir) {
		_ = unix.Kill(p.Pid, unix.SIGKILL)
		waitGone(p.Pid, p.StartTime, 10*time.Second)
	}
}

// waitGone waits until the process is gone or timeout passes.
func waitGone(pid int, startTime uint64, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !running(pid, startTime) {
			return true
		}
	}
	return !running(pid, startTime)
}

// dialUnix connects to a unix socket.
func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", path)
}
