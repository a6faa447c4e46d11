package firecracker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// Host facts Available reads; variables so tests can point them elsewhere.
var (
	cpuinfoPath = "/proc/cpuinfo"
	kvmPath     = "/dev/kvm"
	pvmModule   = "/sys/module/kvm_pvm"
)

// Available checks everything a VM needs and, when something is missing,
// says all of it: the firecracker and jailer binaries (and that they run),
// root, an unprivileged uid/gid for the VMM, and a KVM that can boot a standard guest kernel. /dev/kvm merely
// existing is not enough: on a host that is itself a VM without nested
// virtualization, /dev/kvm may be PVM (kvm_pvm, a paravirtual KVM without
// vmx/svm) on which an ordinary guest kernel does not boot, so the CPU must
// show vmx or svm and the KVM module must not be kvm_pvm.
func (d *Driver) Available(ctx context.Context) error {
	var why []string
	for _, b := range []struct{ name, path string }{{"firecracker", d.cfg.FirecrackerBin}, {"jailer", d.cfg.JailerBin}} {
		if _, err := binaryVersion(ctx, b.path); err != nil {
			why = append(why, fmt.Sprintf("%s binary: %v (deploy/provision.sh installs the pinned release)", b.name, err))
		}
	}
	if !strings.Contains(filepath.Base(d.cfg.FirecrackerBin), "firecracker") {
		why = append(why, fmt.Sprintf("firecracker binary %s: the jailer requires its file name to contain \"firecracker\"", d.cfg.FirecrackerBin))
	}
	if d.cfg.UID == 0 || d.cfg.GID == 0 {
		why = append(why, fmt.Sprintf("the jailer would run Firecracker as uid %d gid %d: configure a dedicated unprivileged user (deploy/provision.sh makes cubicle-vm)", d.cfg.UID, d.cfg.GID))
	}
	if os.Geteuid() != 0 {
		why = append(why, fmt.Sprintf("the jailer needs root (euid %d)", os.Geteuid()))
	}
	cpuinfo, _ := os.ReadFile(cpuinfoPath)
	_, pvmErr := os.Stat(pvmModule)
	if err := checkKVM(cpuinfo, pvmErr == nil, openKVM()); err != nil {
		why = append(why, err.Error())
	}
	if len(why) > 0 {
		return fmt.Errorf("%s: %w: %s", d.Name(), driver.ErrUnavailable, strings.Join(why, "; "))
	}
	if err := os.MkdirAll(d.cfg.ChrootBase, 0o711); err != nil {
		return fmt.Errorf("%s: %w: chroot base: %v", d.Name(), driver.ErrUnavailable, err)
	}
	return nil
}

// Versions returns the output of `firecracker --version` and `jailer
// --version`, for /v1/info and logs.
func (d *Driver) Versions(ctx context.Context) (firecracker, jailer string, err error) {
	fc, err1 := binaryVersion(ctx, d.cfg.FirecrackerBin)
	j, err2 := binaryVersion(ctx, d.cfg.JailerBin)
	return fc, j, errors.Join(err1, err2)
}

// binaryVersion runs `path --version` and returns its first line.
func binaryVersion(ctx context.Context, path string) (string, error) {
	p, err := exec.LookPath(path) //depcheck:runs firecracker jailer
	if err != nil {
		return "", fmt.Errorf("%s not found", path)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--version").CombinedOutput() //depcheck:runs firecracker jailer
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", p, err, bytes.TrimSpace(out))
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}

// openKVM returns why /dev/kvm cannot be opened read-write, or nil.
func openKVM() error {
	f, err := os.OpenFile(kvmPath, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// checkKVM decides from the host's facts whether KVM can run a standard
// guest: cpuinfo is /proc/cpuinfo, pvm whether the kvm_pvm module is
// loaded, kvmErr why /dev/kvm did not open (nil when it did). The error
// names every reason.
func checkKVM(cpuinfo []byte, pvm bool, kvmErr error) error {
	var why []string
	switch {
	case errors.Is(kvmErr, os.ErrNotExist):
		why = append(why, "no /dev/kvm (load kvm_intel or kvm_amd, or enable virtualization in the firmware)")
	case kvmErr != nil:
		why = append(why, fmt.Sprintf("/dev/kvm cannot be opened: %v", kvmErr))
	}
	if !hasVirtFlag(cpuinfo) {
		why = append(why, "the CPU shows neither vmx nor svm in /proc/cpuinfo (no hardware virtualization; on a cloud VM enable nested virtualization or use bare metal)")
	}
	if pvm {
		why = append(why, "/dev/kvm is PVM (/sys/module/kvm_pvm is loaded): a paravirtualized KVM on which a standard guest kernel does not boot")
	}
	if len(why) == 0 {
		return nil
	}
	return errors.New(strings.Join(why, "; "))
}

// hasVirtFlag reports whether any "flags" line of cpuinfo has vmx or svm.
func hasVirtFlag(cpuinfo []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		for _, f := range strings.Fields(v) {
			if f == "vmx" || f == "svm" {
				return true
			}
		}
	}
	return false
}
