// Package vminit is PID 1 of a cubicle VM (QEMU, Firecracker): the static
// cubicle-agent runs as /init of an initramfs the daemon builds (see
// internal/image.Initramfs), and this package turns that into a running
// system — kernel modules, root disk, switch to it, the usual mounts,
// hostname, network — before the agent serves as it does in a container.
// It also provides the agent's listener on a virtio-serial port.
//
// Only cmd/cubicle-agent imports the boot code; VM drivers import this
// package for the shared names (the port name, the disk serials, the config
// blob and the ip= parameter), which keeps host and guest from drifting.
// Like the rest of internal/agent it must stay free of cgo and of the
// daemon's packages.
package vminit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
)

// Names shared by the VM drivers and the guest.
const (
	// AgentPort is the virtio-serial port the agent serves on.
	AgentPort = "org.cubicle.agent"
	// RootSerial is the serial of the root disk (virtio-blk).
	RootSerial = "cubicle-root"
	// ConfigSerial is the serial of the config disk: a raw, read-only
	// virtio-blk device holding the Config as JSON padded with NULs.
	ConfigSerial = "cubicle-config"
	// RootLabel is the ext4 volume label of the root disk
	// (internal/image makes it with mkfs.ext4 -L cubicle-root).
	RootLabel = "cubicle-root"
	// ProbeParam on the kernel command line makes init print ProbeOK on the
	// console and power off at once: drivers boot that to find out whether
	// a hypervisor (such as a KVM that hangs guests) really runs a VM.
	ProbeParam = "cubicle.probe=1"
	// ProbeOK is what a probe boot prints.
	ProbeOK = "cubicle-probe-ok"
)

// Config is what the host hands each VM at boot, on the config disk rather
// than on the kernel command line, because /proc/cmdline is readable by
// every process in the guest and the token must not be.
type Config struct {
	// Token is the agent token (CUBICLE_AGENT_TOKEN in containers).
	Token string `json:"token"`
	// Hostname of the guest.
	Hostname string `json:"hostname,omitempty"`
	// Env is the sandbox's environment, the agent's as well as every
	// process's: PATH, CUBICLE_WIDTH, CUBICLE_START_URL, ...
	Env map[string]string `json:"env,omitempty"`
	// Volumes are extra virtio-blk disks, each an ext4 file system that
	// init mounts at Path; a disk is known by its file system's UUID,
	// which the host reads from the volume's file (Firecracker passes
	// no serials).
	Volumes []Volume `json:"volumes,omitempty"`
}

// Volume is one volume of a VM.
type Volume struct {
	UUID string `json:"uuid"` // ext4 UUID, 32 lower-case hex digits
	Path string `json:"path"` // absolute mount path in the guest
}

// VolumeOnDisk is the Volume of the ext4 file system in file, mounted at
// path: the host reads the UUID the guest will know the disk by.
func VolumeOnDisk(file, path string) (Volume, error) {
	f, err := os.Open(file)
	if err != nil {
		return Volume{}, err
	}
	defer f.Close()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(f, head); err != nil {
		return Volume{}, fmt.Errorf("read %s: %w", file, err)
	}
	uuid, ok := Ext4UUID(head)
	if !ok {
		return Volume{}, fmt.Errorf("%s holds no ext4 file system", file)
	}
	return Volume{UUID: uuid, Path: path}, nil
}

// configBlock is the size the config disk is padded to (a sector multiple;
// block devices have whole sectors).
const configBlock = 4096

// EncodeConfig returns the contents of a config disk.
func EncodeConfig(c Config) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	n := (len(b) + 1 + configBlock - 1) / configBlock * configBlock
	out := make([]byte, n)
	copy(out, b)
	return out, nil
}

// DecodeConfig parses the contents of a config disk.
func DecodeConfig(b []byte) (Config, error) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("vm config: %w", err)
	}
	return c, nil
}

// Net is the guest's network, passed as the kernel's own ip= parameter
// syntax (ip=ADDR::GATEWAY:NETMASK:HOSTNAME:DEVICE:off:DNS0:DNS1), which
// Debian's kernel does not act on itself (virtio_net is a module), so init
// applies it.
type Net struct {
	Addr    netip.Prefix
	Gateway netip.Addr // may be invalid: no default route
	DNS     []netip.Addr
	Device  string // default eth0
}

// IPParam formats n as an ip= kernel parameter.
func IPParam(n Net, hostname string) string {
	mask := netip.Addr{}
	if n.Addr.Addr().Is4() {
		var m [4]byte
		for i := 0; i < n.Addr.Bits(); i++ {
			m[i/8] |= 0x80 >> (i % 8)
		}
		mask = netip.AddrFrom4(m)
	}
	gw, dev := "", n.Device
	if n.Gateway.IsValid() {
		gw = n.Gateway.String()
	}
	if dev == "" {
		dev = "eth0"
	}
	f := []string{n.Addr.Addr().String(), "", gw, mask.String(), hostname, dev, "off"}
	for i, d := range n.DNS {
		if i < 2 {
			f = append(f, d.String())
		}
	}
	return "ip=" + strings.Join(f, ":")
}

// ParseIPParam parses the value of an ip= parameter written by IPParam.
func ParseIPParam(v string) (Net, error) {
	f := strings.Split(v, ":")
	if len(f) < 7 {
		return Net{}, fmt.Errorf("ip=%s: want ADDR::GW:MASK:HOST:DEV:off[:DNS0[:DNS1]]", v)
	}
	addr, err := netip.ParseAddr(f[0])
	if err != nil || !addr.Is4() {
		return Net{}, fmt.Errorf("ip=%s: bad address", v)
	}
	mask, err := netip.ParseAddr(f[3])
	if err != nil || !mask.Is4() {
		return Net{}, fmt.Errorf("ip=%s: bad netmask", v)
	}
	m := mask.As4()
	bits := 0
	for _, b := range m {
		for i := 7; i >= 0 && b&(1<<i) != 0; i-- {
			bits++
		}
	}
	n := Net{Addr: netip.PrefixFrom(addr, bits), Device: f[5]}
	if n.Device == "" {
		n.Device = "eth0"
	}
	if f[2] != "" {
		if n.Gateway, err = netip.ParseAddr(f[2]); err != nil {
			return Net{}, fmt.Errorf("ip=%s: bad gateway", v)
		}
	}
	for _, d := range f[7:] {
		if d == "" {
			continue
		}
		a, err := netip.ParseAddr(d)
		if err != nil {
			return Net{}, fmt.Errorf("ip=%s: bad DNS server %q", v, d)
		}
		n.DNS = append(n.DNS, a)
	}
	return n, nil
}

// cmdlineParam returns the value of key=VALUE on the kernel command line.
func cmdlineParam(cmdline, key string) (string, bool) {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

var errNoDisk = errors.New("disk not found")
