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
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// hostFacts are the host files Available reads to judge KVM; tests point
// a driver at others.
type hostFacts struct {
	cpuinfo string // /proc/cpuinfo
	kvm     string // /dev/kvm
	pvm     string // /sys/module/kvm_pvm
}

var realHost = hostFacts{cpuinfo: "/proc/cpuinfo", kvm: "/dev/kvm", pvm: "/sys/module/kvm_pvm"}

// minVersion is the oldest Firecracker release the driver runs: the
// guest finds its virtio devices through the ACPI tables Firecracker 1.8.0
// added (see the package documentation).
var minVersion = version{1, 8, 0}

// Available checks everything a VM needs and, when something is missing,
// says all of it: the firecracker and jailer binaries (they run, are of one
// release, minVersion or newer), root, an unprivileged uid/gid for the
// VMM, and a KVM that can boot a standard guest kernel. /dev/kvm merely
// existing is not enough: on a host that is itself a VM without nested
// virtualization, /dev/kvm may be PVM (kvm_pvm, a paravirtual KVM without
// vmx/svm) on which an ordinary guest kernel does not boot, so the CPU must
// show vmx or svm and the KVM module must not be kvm_pvm. Even then a
// probe boot (Probe) must reach the guest's init before the manager uses
// the backend.
func (d *Driver) Available(ctx context.Context) error {
	var why []string
	vers := map[string]version{}
	for _, b := range []struct{ name, path string }{{"firecracker", d.cfg.FirecrackerBin}, {"jailer", d.cfg.JailerBin}} {
		out, err := binaryVersion(ctx, b.path)
		if err != nil {
			why = append(why, fmt.Sprintf("%s binary: %v (deploy/provision.sh installs the pinned release)", b.name, err))
			continue
		}
		v, err := parseVersion(out)
		switch {
		case err != nil:
			why = append(why, fmt.Sprintf("%s binary %s: %v", b.name, b.path, err))
		case v.less(minVersion):
			why = append(why, fmt.Sprintf("%s binary %s is %s; Firecracker %s or newer is needed (its guests find their devices through ACPI, added in 1.8.0; deploy/provision.sh installs the pinned release)", b.name, b.path, v, minVersion))
		default:
			vers[b.name] = v
		}
	}
	if fc, j := vers["firecracker"], vers["jailer"]; len(vers) == 2 && fc != j {
		why = append(why, fmt.Sprintf("firecracker %s and jailer %s are from different releases", fc, j))
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
	cpuinfo, _ := os.ReadFile(d.host.cpuinfo)
	_, pvmErr := os.Stat(d.host.pvm)
	if err := checkKVM(cpuinfo, pvmErr == nil, openKVM(d.host.kvm)); err != nil {
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

// Probe boots Config.ProbeImage's kernel under the jailer (see probe) and
// returns why the guest did not reach its init, or nil: the manager uses
// the backend only once it has. It implements driver.Prober.
func (d *Driver) Probe(ctx context.Context) error {
	if err := d.probe(ctx); err != nil {
		return fmt.Errorf("%s: %w: %v", d.Name(), driver.ErrUnavailable, err)
	}
	return nil
}

var _ driver.Prober = (*Driver)(nil)

// version is a Firecracker release number.
type version struct{ major, minor, patch int }

func (v version) String() string { return fmt.Sprintf("v%d.%d.%d", v.major, v.minor, v.patch) }

func (v version) less(o version) bool {
	if v.major != o.major {
		return v.major < o.major
	}
	if v.minor != o.minor {
		return v.minor < o.minor
	}
	return v.patch < o.patch
}

// parseVersion reads the release from the first line of `firecracker
// --version` or `jailer --version` ("Firecracker v1.10.1", "Jailer
// v1.10.1"; a suffix such as "-dev" is ignored).
func parseVersion(out string) (version, error) {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	for _, f := range strings.Fields(line) {
		s, ok := strings.CutPrefix(f, "v")
		if !ok {
			continue
		}
		s, _, _ = strings.Cut(s, "-")
		p := strings.Split(s, ".")
		if len(p) != 3 {
			continue
		}
		var v [3]int
		bad := false
		for i, x := range p {
			n, err := strconv.Atoi(x)
			if err != nil || n < 0 {
				bad = true
				break
			}
			v[i] = n
		}
		if !bad {
			return version{v[0], v[1], v[2]}, nil
		}
	}
	return version{}, fmt.Errorf("--version printed %q, not a release number vX.Y.Z", line)
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

// openKVM returns why the KVM device at path cannot be opened read-write,
// or nil.
func openKVM(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
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
