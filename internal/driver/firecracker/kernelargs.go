package firecracker

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/driver"
)

// BaseKernelArgs start every command line: serial console on ttyS0, exit
// the VMM on guest reboot (Firecracker has no power-off), reboot on panic,
// no PCI probing (devices are virtio-mmio), no probing of i8042 parts beyond
// the keyboard that SendCtrlAltDel needs, and — as under the qemu driver —
// a quiet console and the CPU's RNG trusted for early entropy. Not
// i8042.nopnp: since Firecracker 1.8 the guest finds the keyboard
// controller through ACPI (PNP), and with nopnp it has none, so
// SendCtrlAltDel does nothing and every Stop waits for StopTimeout and
// kills (Firecracker dropped it from its own default command line in 1.11
// for that reason).
const BaseKernelArgs = "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd quiet loglevel=3 random.trust_cpu=on"

// maxKernelArgs is what this driver lets its command line grow to: x86
// Linux takes 2048 bytes and Firecracker appends its own parameters (root=,
// one virtio_mmio.device= per device) to ours.
const maxKernelArgs = 1700

// KernelArgs returns the kernel command line for spec:
//
//	BaseKernelArgs
//	ip=ADDR::GW:MASK:HOSTNAME:eth0:off[:DNS0[:DNS1]]   vminit.IPParam; absent without a network
//	EXTRA                                              Config.ExtraKernelArgs, verbatim
//
// Firecracker appends root=/dev/vda rw and the virtio-mmio device list.
// Nothing secret goes here: the token and the environment are on the
// config drive (see Create).
func KernelArgs(spec driver.Spec, extra string) (string, error) {
	args := []string{BaseKernelArgs}
	if n := spec.Net; n != nil && n.Addr.IsValid() {
		args = append(args, vminit.IPParam(vminit.Net{Addr: n.Addr, Gateway: n.Gateway, DNS: n.DNS}, hostname(spec.ID)))
	}
	if extra = strings.TrimSpace(extra); extra != "" {
		args = append(args, extra)
	}
	s := strings.Join(args, " ")
	if len(s) > maxKernelArgs {
		return "", fmt.Errorf("kernel command line is %d bytes, more than the %d a VM takes", len(s), maxKernelArgs)
	}
	return s, nil
}

// hostname is the guest's hostname, as under the qemu driver.
func hostname(id string) string {
	if len(id) > 12 {
		id = id[:12]
	}
	return "cubicle-" + id
}

// guestConfig is what the guest reads from its config drive: the same as
// under the qemu driver, so the guest cannot tell the two apart.
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
