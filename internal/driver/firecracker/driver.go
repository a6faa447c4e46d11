// Package firecracker is the sandbox driver for Firecracker microVMs: every
// sandbox gets its own guest kernel under KVM, with Firecracker's jailer
// around the VMM. Only cmd/cubicled and tests import it; the manager sees it
// as a driver.Driver (and a driver.Accelerator).
//
// # The API client, and why not the SDK
//
// The driver speaks Firecracker's REST API with a small client of its own
// (api.go): typed requests for the calls it makes, over the API unix
// socket, each bounded by the caller's context. It used the Go SDK
// (firecracker-go-sdk) for that before, and only its generated client and
// jailer argument builder; the SDK's Machine type cannot be used at all,
// since it owns the VMM as a child of the calling process (it kills it when
// Start's context ends and cannot re-attach after a restart), while
// cubicle's VMs must outlive a daemon restart and be adopted again from a
// pid and a socket. The client was not worth what came with it: go-openapi
// (eight modules), mongo-driver, logrus, CNI and more in every cubicled,
// and a per-request timeout of its own — 500 ms, 250 ms for drives, unless
// FIRECRACKER_GO_SDK_REQUEST_TIMEOUT_MILLISECONDS says otherwise — which an
// InstanceStart on a loaded host outlasts. What the generated code
// guaranteed, requests that match Firecracker's API description, is
// checked instead by the tests: the fake Firecracker validates every
// request against the facts of Firecracker's swagger file
// (apispec_test.go).
//
// Firecracker 1.8 or newer is required (minVersion): the guest kernel
// loads virtio_mmio as a module, which takes its devices from the ACPI
// tables Firecracker 1.8 added, not from the virtio_mmio.device=
// parameters on the command line (modprobe would pass those to the module;
// the VM's init loads modules itself).
//
// # What a VM is made of
//
// For sandbox ID the driver keeps everything under
// CHROOTBASE/firecracker/ID (the jailer's layout):
//
//	console.log          the VMM's stdout/stderr: the guest's serial console (ttyS0)
//	root/                the chroot (owned by the jailer's uid/gid):
//	  firecracker        copied there by the jailer
//	  firecracker.pid    the VMM's host pid, written by the jailer (--new-pid-ns)
//	  api.sock           Firecracker's API socket
//	  v.sock             the hybrid-vsock socket (agent channel)
//	  vmlinux, initrd    hard links (or copies) of the image's kernel and initramfs
//	  rootfs.ext4        the VM's copy-on-write copy of the image's disk.ext4
//	  config.img         the guest's vminit.Config (token, hostname, env), a read-only drive
//	  firecracker.log    Firecracker's own log (level Config.LogLevel)
//	  metrics.json       Firecracker's metrics, one JSON object per line
//
// The jailer runs with --new-pid-ns, a dedicated uid/gid, a cgroup
// CGROUP/PARENT/ID (v1 or v2, as the host has) with a memory limit, and
// --netns when the sandbox has a network namespace. It is started in its own
// session (setsid) with its stdio on console.log rather than with
// --daemonize, which would send the serial console to /dev/null; either way a
// daemon restart does not kill the VM.
//
// # The guest contract
//
// The guest is the same as under the qemu driver (internal/agent/vminit):
// the initramfs's /init is the agent, which loads the kernel modules, mounts
// the root drive and reads its vminit.Config — token, hostname,
// environment — from a second, read-only drive. It tells the two apart by
// what is on them (the root is the ext4 labelled cubicle-root, the config
// a vminit config blob), not by serial as under QEMU: Firecracker answers
// the virtio-blk ID request with an ID it makes from the backing file's
// device and inode numbers, never the drive_id. The token is never on the
// kernel command line, which every guest process can read. The network comes as vminit's ip= parameter; see KernelArgs.
// What differs from QEMU, and what the guest must do for it:
//
//   - the agent channel is vsock: the agent must listen on vsock port
//     AgentPort (the host reaches it through Firecracker's hybrid vsock: a
//     unix socket and a "CONNECT <port>\n" / "OK <port>\n" handshake, see
//     DialVsock);
//   - the VM is stopped with SendCtrlAltDel: init (which has turned the
//     kernel's own Ctrl-Alt-Del handling off) gets SIGINT and must shut
//     down, and then reboot rather than power off — Firecracker exits on a
//     guest reboot (reboot=k) and has no ACPI power-off.
package firecracker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/image"
)

// Defaults for zero Config and Spec fields.
const (
	DefaultChrootBase       = "/srv/cubicle"
	DefaultParentCgroup     = "cubicle"
	DefaultLogLevel         = "Warning"
	DefaultVCPUs            = 2
	DefaultMemoryMB         = 2048
	DefaultWidth            = 1280
	DefaultHeight           = 800
	DefaultDPI              = 96
	DefaultMemoryOverheadMB = 256
	DefaultStopTimeout      = 10 * time.Second
	DefaultConsoleMaxBytes  = 16 << 20
	// AgentPort is the vsock port the agent listens on in the guest.
	AgentPort = 1024
	// GuestCID is the guest's vsock context ID (3 is the first one not
	// reserved; every VM has its own vsock device, so all may use it).
	GuestCID = 3
)

// RateLimit is one Firecracker rate limiter: a bandwidth and an operations
// token bucket. Zero fields mean unlimited.
type RateLimit struct {
	// BytesPerSec refills the bandwidth bucket: BytesPerSec bytes per second.
	BytesPerSec int64
	// BurstBytes is a one-time initial burst on top of the bandwidth bucket.
	BurstBytes int64
	// OpsPerSec refills the operations bucket (I/O requests or packets).
	OpsPerSec int64
	// BurstOps is a one-time initial burst on top of the operations bucket.
	BurstOps int64
}

// model returns the limiter as Firecracker's API model, nil when unlimited.
func (r RateLimit) model() *apiRateLimiter {
	bucket := func(rate, burst int64) *apiTokenBucket {
		if rate <= 0 {
			return nil
		}
		// A bucket of `rate` tokens refilled over 1000 ms is `rate` per second.
		return &apiTokenBucket{Size: rate, RefillTime: 1000, OneTimeBurst: max(burst, 0)}
	}
	bw, ops := bucket(r.BytesPerSec, r.BurstBytes), bucket(r.OpsPerSec, r.BurstOps)
	if bw == nil && ops == nil {
		return nil
	}
	return &apiRateLimiter{Bandwidth: bw, Ops: ops}
}

// BootFiles are the files a VM boots from, resolved from a Spec's image.
type BootFiles struct {
	Kernel string // uncompressed ELF vmlinux
	Initrd string // initramfs with the agent as /init; "" for none
	Disk   string // the image's ext4 root disk (never written)
}

// Config configures a Driver.
type Config struct {
	// FirecrackerBin and JailerBin are the binaries; empty means
	// "firecracker" and "jailer" looked up on PATH. The Firecracker binary's
	// file name must contain "firecracker" (the jailer insists).
	FirecrackerBin string
	JailerBin      string
	// ChrootBase is the jailer's --chroot-base-dir (default
	// DefaultChrootBase). Per-VM disks live in it: put it on the image
	// directory's filesystem so disks are reflinked and kernels hard-linked.
	ChrootBase string
	// UID and GID are what the jailer drops to before exec'ing Firecracker:
	// a dedicated, unprivileged user (deploy/provision.sh makes cubicle-vm).
	UID, GID int
	// NumaNode is the NUMA node the VMs are pinned to (cpuset.mems and
	// cpuset.cpus of the node, when the host shows its cpulist).
	NumaNode int
	// ParentCgroup is the jailer's --parent-cgroup (default
	// DefaultParentCgroup); each VM gets PARENT/ID.
	ParentCgroup string
	// CgroupVersion is 1 or 2; 0 detects what the host mounts at
	// /sys/fs/cgroup.
	CgroupVersion int
	// MemoryOverheadMB is added to the guest memory for the VM's cgroup
	// memory limit (VMM, device buffers); 0 means the default, <0 no limit.
	MemoryOverheadMB int
	// AgentBinary is the static cubicle-agent: the init of every VM, in an
	// initramfs made with the image's kernel modules (image.Initramfs).
	AgentBinary string
	// InitramfsDir caches those initramfs files (default
	// CHROOTBASE/initramfs, on the jails' filesystem so they are linked).
	InitramfsDir string
	// Kernel and Initrd, when set, override the image's own files for every
	// VM.
	Kernel, Initrd string
	// Resolve maps a Spec's Image to its boot files; nil means the image's
	// VM form (image.LookupVM: disk.ext4, kernel/vmlinux) with an initramfs
	// of AgentBinary.
	Resolve func(image string) (BootFiles, error)
	// ExtraKernelArgs are appended to the kernel command line.
	ExtraKernelArgs string
	// DriveLimit limits the root drive; NetRxLimit and NetTxLimit the
	// guest's network interface (rx: host to guest).
	DriveLimit, NetRxLimit, NetTxLimit RateLimit
	// LogLevel is Firecracker's log level: Error, Warning, Info or Debug
	// (default DefaultLogLevel).
	LogLevel string
	// StopTimeout bounds the clean shutdown (Ctrl-Alt-Del) before the VMM
	// is killed (default DefaultStopTimeout).
	StopTimeout time.Duration
	// ConsoleMaxBytes bounds console.log: a guest can write its serial
	// console without end, so the file is emptied when it grows past this
	// (default DefaultConsoleMaxBytes).
	ConsoleMaxBytes int64
	// ProbeImage returns the rootfs path of the image (as image.Lookup
	// gives it) whose kernel Available boots once, with the VMs' jailer,
	// user and Firecracker, before it reports the backend usable: KVM can
	// be there and still not run a guest. nil means no probe, and the
	// backend is never available.
	ProbeImage func() (string, error)
	// ProbeTimeout bounds that probe boot (default DefaultProbeTimeout).
	ProbeTimeout time.Duration
}

// launcher starts the jailer command and returns the host pid of the
// Firecracker process. Tests replace it with a fake standing in for
// Firecracker, which cannot run on a machine without usable KVM.
type launcher func(ctx context.Context, cmd *exec.Cmd, p paths) (int, error)

// Driver starts Firecracker microVMs under the jailer. It is safe for
// concurrent use.
type Driver struct {
	cfg    Config
	launch launcher
	host   hostFacts
	// giveTAP is ownTAP; tests whose TAPs do not exist replace it.
	giveTAP func(netnsPath, name string, uid, gid int) error

	probeState probeState

	mu    sync.Mutex
	boxes map[string]*box // live boxes, for metrics
}

var (
	_ driver.Driver      = (*Driver)(nil)
	_ driver.Accelerator = (*Driver)(nil)
)

// New returns a driver for cfg. It does not touch the host; call Available.
func New(cfg Config) *Driver {
	if cfg.FirecrackerBin == "" {
		cfg.FirecrackerBin = "firecracker"
	}
	if cfg.JailerBin == "" {
		cfg.JailerBin = "jailer"
	}
	for _, p := range []*string{&cfg.FirecrackerBin, &cfg.JailerBin} {
		if !strings.Contains(*p, "/") {
			if abs, err := exec.LookPath(*p); err == nil { //depcheck:runs firecracker jailer
				*p = abs
			}
		}
	}
	if cfg.ChrootBase == "" {
		cfg.ChrootBase = DefaultChrootBase
	}
	if cfg.ParentCgroup == "" {
		cfg.ParentCgroup = DefaultParentCgroup
	}
	if cfg.MemoryOverheadMB == 0 {
		cfg.MemoryOverheadMB = DefaultMemoryOverheadMB
	}
	if cfg.InitramfsDir == "" {
		cfg.InitramfsDir = filepath.Join(cfg.ChrootBase, "initramfs")
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = DefaultLogLevel
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	if cfg.ConsoleMaxBytes <= 0 {
		cfg.ConsoleMaxBytes = DefaultConsoleMaxBytes
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	d := &Driver{cfg: cfg, boxes: map[string]*box{}, host: realHost}
	if d.cfg.Resolve == nil {
		d.cfg.Resolve = d.imageFiles
	}
	d.launch = d.launchJailer
	d.giveTAP = ownTAP
	return d
}

// Name returns "firecracker".
func (d *Driver) Name() string { return "firecracker" }

// Isolation returns driver.IsolationVM.
func (d *Driver) Isolation() string { return driver.IsolationVM }

// Accelerated reports true: Firecracker runs only on KVM, so when it is
// available at all it is hardware-accelerated.
func (d *Driver) Accelerated(context.Context) bool { return true }

// imageFiles finds the boot files of an image's VM form: image is the
// image's rootfs (what the daemon passes as Spec.Image) or its version
// directory. The initramfs carries AgentBinary as /init and the image's
// kernel modules; it is built once per agent and kernel and cached.
func (d *Driver) imageFiles(rootfs string) (BootFiles, error) {
	vm, err := image.LookupVM(rootfs)
	if err != nil {
		return BootFiles{}, err
	}
	if vm.Vmlinux == "" {
		return BootFiles{}, fmt.Errorf("%w: %s: no uncompressed kernel (kernel/vmlinux), which Firecracker needs", image.ErrNoVM, vm.Dir)
	}
	initrd, err := image.Initramfs(vm, d.cfg.AgentBinary, d.cfg.InitramfsDir)
	if err != nil {
		return BootFiles{}, err
	}
	return BootFiles{Kernel: vm.Vmlinux, Initrd: initrd, Disk: vm.Disk}, nil
}

// resolve returns the boot files for image, with the configured overrides,
// and checks they exist.
func (d *Driver) resolve(img string) (BootFiles, error) {
	bf, err := d.cfg.Resolve(img)
	if err != nil {
		return bf, err
	}
	if d.cfg.Kernel != "" {
		bf.Kernel = d.cfg.Kernel
	}
	if d.cfg.Initrd != "" {
		bf.Initrd = d.cfg.Initrd
	}
	for _, f := range []struct{ what, path string }{{"kernel", bf.Kernel}, {"disk", bf.Disk}, {"initrd", bf.Initrd}} {
		if f.path == "" && f.what == "initrd" {
			continue
		}
		fi, err := os.Stat(f.path)
		if err != nil {
			return bf, fmt.Errorf("image %s has no VM %s (build it with `cubicle image build`): %w", img, f.what, err)
		}
		if !fi.Mode().IsRegular() {
			return bf, fmt.Errorf("image %s: VM %s %s is not a regular file", img, f.what, f.path)
		}
	}
	return bf, nil
}

// Collector returns the Prometheus collector of Firecracker's own metrics
// for every live VM of this driver (block and network I/O, throttling by
// the rate limiters, vCPU exits, seccomp faults, ...), labelled by sandbox.
// Firecracker writes them every 60 s, so they lag by up to a minute.
func (d *Driver) Collector() prometheus.Collector { return (*collector)(d) }

func (d *Driver) register(b *box) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.boxes[b.data.ID] = b
}

func (d *Driver) unregister(b *box) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.boxes[b.data.ID] == b {
		delete(d.boxes, b.data.ID)
	}
}

func (d *Driver) liveBoxes() []*box {
	d.mu.Lock()
	defer d.mu.Unlock()
	bs := make([]*box, 0, len(d.boxes))
	for _, b := range d.boxes {
		bs = append(bs, b)
	}
	return bs
}

// validID reports whether id is a sandbox ID this driver accepts: [a-z0-9],
// at most 64 characters (the jailer's limit for --id).
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
