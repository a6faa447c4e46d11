package firecracker

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
)

// DefaultProbeTimeout bounds a probe boot: a guest reaches its init in
// about a second under KVM; on a KVM that hangs guests it never does.
const DefaultProbeTimeout = 30 * time.Second

// probeDir is the chroot base of probe boots, under Config.ChrootBase and
// apart from the VMs' jails (Cleanup looks in both).
const probeDir = "probe"

// probeMemMB is the probe guest's memory: enough to unpack the initramfs.
const probeMemMB = 256

// probeState keeps the outcome of the probe boot. A boot that reached the
// guest's init stands for the driver's life (as the qemu driver's KVM
// probe); a failure is kept for a while (a probe on every call would cost a
// VM boot each time) and then tried again, sooner when the boot only ran
// out of time, which a host loaded after a crash can make it do.
type probeState struct {
	mu    sync.Mutex
	ok    bool
	err   error
	until time.Time // when a failure is probed again
}

// How long a failed probe boot's answer stands.
const (
	probeRetryFailed  = 10 * time.Minute
	probeRetryTimeout = time.Minute
)

// errProbeTimeout is wrapped by a probe boot that ran out of time.
var errProbeTimeout = errors.New("probe boot timed out")

// probeBase is where probe boots' jails are made.
func (d *Driver) probeBase() string { return filepath.Join(d.cfg.ChrootBase, probeDir) }

// probe boots the probe image's kernel once under the jailer and
// Firecracker and returns why it did not reach the guest's init, or nil.
// A missing probe image is not a final answer (the image may be built
// later); a boot, whatever its outcome, is.
func (d *Driver) probe(ctx context.Context) error {
	d.probeState.mu.Lock()
	defer d.probeState.mu.Unlock()
	if d.probeState.ok {
		return nil
	}
	if d.probeState.err != nil && time.Now().Before(d.probeState.until) {
		return d.probeState.err
	}
	if d.cfg.ProbeImage == nil {
		return errors.New("no probe image configured: Firecracker is used only once a probe boot of an image's kernel has succeeded")
	}
	rootfs, err := d.cfg.ProbeImage()
	if err != nil {
		return fmt.Errorf("no image to probe-boot: %v", err)
	}
	files, err := d.resolve(rootfs)
	if err != nil {
		return fmt.Errorf("probe image: %v", err)
	}
	err = d.probeBoot(ctx, files)
	if err != nil && ctx.Err() != nil {
		// The caller gave up (or the daemon is stopping): that says
		// nothing about the host, and is not kept as its answer.
		return fmt.Errorf("probe boot cut short: %w", ctx.Err())
	}
	d.probeState.ok, d.probeState.err = err == nil, err
	retry := probeRetryFailed
	if errors.Is(err, errProbeTimeout) {
		retry = probeRetryTimeout
	}
	d.probeState.until = time.Now().Add(retry)
	return err
}

// probeKernelArgs is the probe guest's command line: the VMs' own, and
// vminit's probe switch, which makes init print ProbeOK and stop.
func probeKernelArgs() string { return BaseKernelArgs + " " + vminit.ProbeParam }

// probeVMConfig is the probe VM: one vCPU, no drives or devices, the
// kernel and initramfs at the paths given (inside the jail).
func probeVMConfig(kernel, initrd string) apiVMConfig {
	return apiVMConfig{
		BootSource:    apiBootSource{KernelImagePath: kernel, InitrdPath: initrd, BootArgs: probeKernelArgs()},
		Drives:        []apiDrive{},
		MachineConfig: apiMachineConfig{VCPUCount: 1, MemSizeMiB: probeMemMB},
	}
}

// probeBoot boots files' kernel and initramfs under the jailer, as the
// VMs' user in a jail of its own, with `firecracker --no-api
// --config-file`, and waits for ProbeOK on the serial console (the VMM's
// stdout). The VMM is killed then (a guest that halts does not end
// Firecracker) and the jail removed.
func (d *Driver) probeBoot(ctx context.Context, files BootFiles) (err error) {
	var rnd [6]byte
	rand.Read(rnd[:])
	id := "probe" + hex.EncodeToString(rnd[:])
	jail := filepath.Join(d.probeBase(), d.execName(), id)
	root := filepath.Join(jail, "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("probe jail: %v", err)
	}
	defer os.RemoveAll(jail)
	if err := linkOrCopy(files.Kernel, filepath.Join(root, kernelName)); err != nil {
		return fmt.Errorf("probe kernel: %v", err)
	}
	initrd := ""
	if files.Initrd != "" {
		initrd = initrdName
		if err := linkOrCopy(files.Initrd, filepath.Join(root, initrdName)); err != nil {
			return fmt.Errorf("probe initrd: %v", err)
		}
	}
	cfg, err := json.Marshal(probeVMConfig(kernelName, initrd))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "probe.json"), cfg, 0o444); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, d.cfg.ProbeTimeout)
	defer cancel()
	// No --new-pid-ns and no cgroup limits: the jailer execs Firecracker
	// in its own place, so the child is the VMM and killing it ends the
	// probe.
	args := []string{"--id", id, "--uid", strconv.Itoa(d.cfg.UID), "--gid", strconv.Itoa(d.cfg.GID),
		"--exec-file", d.cfg.FirecrackerBin, "--cgroup-version", strconv.Itoa(d.cgroupVersion()),
		"--chroot-base-dir", d.probeBase(),
		"--", "--no-api", "--config-file", "/probe.json"}
	cmd := exec.CommandContext(pctx, d.cfg.JailerBin, args...) //depcheck:runs jailer
	cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("probe boot: start jailer: %v", err)
	}
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		pw.Close()
		exited <- err
	}()
	found := make(chan bool, 1)
	tail := &lastLines{n: 10}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(nil, 64<<10)
		ok := false
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, vminit.ProbeOK) && !ok {
				ok = true
				found <- true
			}
			tail.add(line)
		}
		io.Copy(io.Discard, pr) // a line too long: keep the VMM from blocking
		if !ok {
			found <- false
		}
	}()
	select {
	case ok := <-found:
		cmd.Process.Kill()
		werr := <-exited
		if ok {
			return nil
		}
		return fmt.Errorf("a probe boot of %s did not reach the guest's init: %v: %s", files.Kernel, werr, tail)
	case <-pctx.Done():
		cmd.Process.Kill()
		<-exited
		return fmt.Errorf("a probe boot of %s did not reach the guest's init within %s (a KVM that hangs guests?): %w: %s", files.Kernel, d.cfg.ProbeTimeout, errProbeTimeout, tail)
	}
}

// lastLines keeps the last n lines written to it, for error messages.
type lastLines struct {
	mu    sync.Mutex
	n     int
	lines []string
}

func (l *lastLines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	l.lines = append(l.lines, s)
	if len(l.lines) > l.n {
		l.lines = l.lines[len(l.lines)-l.n:]
	}
}

func (l *lastLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 0 {
		return "no output"
	}
	return strings.Join(l.lines, " | ")
}
