// Package identity gives a forked box its own identity. A fork starts as
// a byte-for-byte copy of its parent's memory and disk, so until it is
// re-keyed it has the parent's hostname, machine-id, random state and
// network address (the "restoring uniqueness in microVM snapshots"
// problem): two forks would answer to one address, and generate the same
// "random" numbers. Apply changes each of them in place, while the
// desktop and its programs run on.
//
// The network is changed over rtnetlink with github.com/vishvananda/netlink,
// the library the daemon's network pool uses already: no ip(8) in the
// image is needed, and the agent stays one static binary.
package identity

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Change is a new identity. Zero fields are left as they are.
type Change struct {
	Hostname  string
	MachineID string // 32 lowercase hex digits
	Entropy   []byte // credited to the kernel's pool
	// MAC, Addr and Gateway are the new network of the interface that
	// holds OldAddr.
	MAC     net.HardwareAddr
	Addr    netip.Prefix
	Gateway netip.Addr
	OldAddr netip.Prefix
}

var (
	machineIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)
	hostnameRE  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// Validate reports what is wrong with c, before anything is changed.
func (c Change) Validate() error {
	if c.Hostname != "" && !hostnameRE.MatchString(c.Hostname) {
		return fmt.Errorf("hostname %q is not a DNS label", c.Hostname)
	}
	if c.MachineID != "" && !machineIDRE.MatchString(c.MachineID) {
		return errors.New("machine-id must be 32 lowercase hex digits")
	}
	if len(c.Entropy) > 4096 {
		return errors.New("more than 4096 bytes of entropy")
	}
	if c.Addr.IsValid() != c.OldAddr.IsValid() || (c.Addr.IsValid() && len(c.MAC) != 6) {
		return errors.New("a new address needs the old one and a MAC")
	}
	return nil
}

// Apply makes c the identity of the system whose root directory is root
// ("/" but in tests). Each step runs even when one before failed; what
// failed is returned.
func Apply(c Change, root string) error {
	if err := c.Validate(); err != nil {
		return err
	}
	var errs []error
	if c.Hostname != "" {
		if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
			// A gVisor box has no CAP_SYS_ADMIN, and needs none here: a
			// restore gives it the hostname of its own config.
			if cur, herr := os.Hostname(); herr != nil || cur != c.Hostname {
				errs = append(errs, fmt.Errorf("sethostname: %w", err))
			}
		}
		if err := replaceFile(filepath.Join(root, "etc/hostname"), c.Hostname+"\n", 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MachineID != "" {
		if err := replaceFile(filepath.Join(root, "etc/machine-id"), c.MachineID+"\n", 0o444); err != nil {
			errs = append(errs, err)
		}
		// dbus's copy is usually a link to /etc/machine-id; a file of
		// its own is replaced too.
		dbus := filepath.Join(root, "var/lib/dbus/machine-id")
		if fi, err := os.Lstat(dbus); err == nil && fi.Mode().IsRegular() {
			if err := replaceFile(dbus, c.MachineID+"\n", 0o444); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(c.Entropy) > 0 {
		if err := addEntropy(filepath.Join(root, "dev/urandom"), c.Entropy); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Addr.IsValid() {
		if err := renumber(c); err != nil {
			errs = append(errs, fmt.Errorf("network: %w", err))
		}
	}
	return errors.Join(errs...)
}

// replaceFile writes content to path through a temporary file and a
// rename, so that a reader sees the old content or the new.
func replaceFile(path, content string, mode os.FileMode) error {
	tmp := path + ".cubicle-tmp"
	if err := os.WriteFile(tmp, []byte(content), mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// addEntropy credits b to the kernel's pool (RNDADDENTROPY) and has its
// random generator reseed from it at once (RNDRESEEDCRNG): since Linux
// 5.18 credited entropy alone reseeds only on the generator's own
// schedule (up to a minute), and two forks of one VM read the same
// /dev/urandom bytes meanwhile (a CI run of TestFork saw it). Where the
// ioctls are refused (no CAP_SYS_ADMIN, or a kernel that is not Linux's:
// gVisor's urandom is the host's) b is written to the device instead,
// which mixes it in without credit. A generator not yet ready (ENODATA)
// seeds itself from the credited bytes anyway.
func addEntropy(dev string, b []byte) error {
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("entropy: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b))
	binary.NativeEndian.PutUint32(info[0:], uint32(8*len(b)))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(b)))
	copy(info[8:], b)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); e == 0 {
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 && e != unix.EINVAL && e != unix.ENOTTY && e != unix.ENODATA {
			return fmt.Errorf("entropy: reseed: %w", e)
		}
		return nil
	}
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("entropy: %w", err)
	}
	return nil
}

// renumber moves the interface that holds c.OldAddr to c.MAC and
// c.Addr, with a default route via c.Gateway.
func renumber(c Change) error {
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	var link, numbered netlink.Link
	for _, l := range links {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			p, ok := netip.AddrFromSlice(a.IP)
			if ok && p.Unmap() == c.OldAddr.Addr() {
				link = l
			}
			if ok && p.Unmap() == c.Addr.Addr() {
				numbered = l
			}
		}
	}
	if numbered != nil && bytes.Equal(numbered.Attrs().HardwareAddr, c.MAC) && (link == nil || c.OldAddr.Addr() == c.Addr.Addr()) {
		// Already the copy's own: a gVisor restore reads the addresses
		// and MAC of the network namespace it starts in, which are the
		// copy's (the old address too, when the copy was given the
		// address its source had).
		return nil
	}
	if link == nil {
		return fmt.Errorf("no interface holds %s", c.OldAddr)
	}
	name := link.Attrs().Name
	if err := netlink.LinkSetDown(link); err != nil {
		return fmt.Errorf("%s down: %w", name, err)
	}
	if err := netlink.LinkSetHardwareAddr(link, c.MAC); err != nil {
		return fmt.Errorf("%s address %s: %w", name, c.MAC, err)
	}
	old := &netlink.Addr{IPNet: &net.IPNet{IP: c.OldAddr.Addr().AsSlice(), Mask: net.CIDRMask(c.OldAddr.Bits(), c.OldAddr.Addr().BitLen())}}
	if err := netlink.AddrDel(link, old); err != nil {
		return fmt.Errorf("%s remove %s: %w", name, c.OldAddr, err)
	}
	nw := &netlink.Addr{IPNet: &net.IPNet{IP: c.Addr.Addr().AsSlice(), Mask: net.CIDRMask(c.Addr.Bits(), c.Addr.Addr().BitLen())}}
	if err := netlink.AddrAdd(link, nw); err != nil {
		return fmt.Errorf("%s add %s: %w", name, c.Addr, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	if c.Gateway.IsValid() {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: c.Gateway.AsSlice(), Dst: nil}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("default route via %s: %w", c.Gateway, err)
		}
	}
	return nil
}
