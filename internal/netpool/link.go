package netpool

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// setupBridge makes sure the bridge exists, carries gw, is up, has no IPv6,
// and that the namespace forwards IPv4.
func setupBridge(name string, gw netip.Prefix) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("netpool: bridge %s: %w", name, err)
		}
		// A fixed MAC: otherwise the bridge takes the lowest of its
		// ports' MACs, which changes as sandboxes come and go and leaves
		// guests with a stale gateway in their ARP caches.
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: guestMAC("bridge:" + name)}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("netpool: create bridge %s: %w", name, err)
		}
		if link, err = netlink.LinkByName(name); err != nil {
			return fmt.Errorf("netpool: bridge %s: %w", name, err)
		}
	}
	if link.Type() != "bridge" {
		return fmt.Errorf("netpool: %s exists and is a %s, not a bridge", name, link.Type())
	}
	// Best effort: guests get no IPv6, and the host should not offer any
	// on their segment. The knob is missing when IPv6 is off altogether.
	writeSysctl("net/ipv6/conf/"+name+"/disable_ipv6", "1")
	addr := &netlink.Addr{IPNet: prefixToIPNet(gw)}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("netpool: address %s on %s: %w", gw, name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("netpool: bridge %s up: %w", name, err)
	}
	if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return fmt.Errorf("netpool: enable ip_forward: %w", err)
	}
	return nil
}

// writeSysctl writes a /proc/sys/net knob of the calling thread's network
// namespace (the daemon's: this package only switches namespaces on locked
// threads it restores).
func writeSysctl(key, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// bridgePort makes link an isolated, up port of the bridge: isolated ports
// cannot exchange frames with each other, only with the bridge itself.
func bridgePort(bridge string, link netlink.Link) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", bridge, err)
	}
	if err := netlink.LinkSetMaster(link, br); err != nil {
		return fmt.Errorf("attach %s to %s: %w", link.Attrs().Name, bridge, err)
	}
	if err := netlink.LinkSetIsolated(link, true); err != nil {
		return fmt.Errorf("isolate %s: %w", link.Attrs().Name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s up: %w", link.Attrs().Name, err)
	}
	return nil
}

// createTAP makes a persistent TAP on the bridge that a VMM opens by name.
// It is created with one queue and a virtio-net header, as QEMU and
// Firecracker open it.
func createTAP(bridge, name string) error {
	tap := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: name},
		Mode:      netlink.TUNTAP_MODE_TAP,
		Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_ONE_QUEUE,
	}
	if err := netlink.LinkAdd(tap); err != nil {
		return fmt.Errorf("create tap %s: %w", name, err)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return bridgePort(bridge, link)
}

// createVeth makes the namespace at nsPath, a veth pair whose host end
// hostIf is a port of the bridge and whose other end is eth0 in the
// namespace with mac and addr, lo up, and a default route via gw.
func createVeth(bridge, hostIf, nsPath string, mac net.HardwareAddr, addr netip.Prefix, gw netip.Addr) error {
	ns, err := createNetns(nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: hostIf},
		PeerName:         guestIf,
		PeerHardwareAddr: mac,
		PeerNamespace:    netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", hostIf, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo in %s: %w", nsPath, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up in %s: %w", nsPath, err)
	}
	eth, err := h.LinkByName(guestIf)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", guestIf, nsPath, err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: prefixToIPNet(addr)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", addr, guestIf, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("%s up: %w", guestIf, err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw.AsSlice(), Scope: netlink.SCOPE_UNIVERSE}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	// The host end goes up last: its peer is up by then, so it has carrier
	// at once and the bridge forwards through it from the first packet
	// (otherwise the carrier change reaches the bridge via linkwatch,
	// up to a second later, and the first packets are lost).
	host, err := netlink.LinkByName(hostIf)
	if err != nil {
		return err
	}
	if err := bridgePort(bridge, host); err != nil {
		return err
	}
	waitOperUp(nil, hostIf, 2*time.Second)
	waitOperUp(h, guestIf, 2*time.Second)
	return nil
}

// waitOperUp waits (bounded) until the link's operational state is up. The
// bridge starts forwarding through a port only when the kernel's linkwatch
// has processed its carrier, a moment after it went up; a packet sent
// before (e.g. the ARP request of the host's first connection to a new
// guest) is lost and retried only a second later; likewise a veth drops
// what it is given until its carrier is processed. h nil means the
// daemon's namespace.
func waitOperUp(h *netlink.Handle, name string, limit time.Duration) {
	if h == nil {
		h = &netlink.Handle{}
	}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		l, err := h.LinkByName(name)
		if err != nil || l.Attrs().OperState == netlink.OperUp {
			return
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// createNetns makes a new network namespace and bind-mounts it at path (as
// `ip netns add` does) without moving the calling goroutine's thread: the
// work happens on a locked thread that is restored to the daemon's
// namespace, or, if that fails, discarded.
func createNetns(path string) (netns.NsHandle, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return netns.None(), err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return netns.None(), fmt.Errorf("netns %s: %w", path, err)
	}
	f.Close()
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{netns.None(), err}
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{netns.None(), fmt.Errorf("unshare: %w", err)}
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		var ns netns.NsHandle
		err = unix.Mount(self, path, "none", unix.MS_BIND, "")
		if err == nil {
			ns, err = netns.GetFromPath(path)
		}
		if rerr := netns.Set(orig); rerr != nil {
			// Leave the thread locked: Go ends it with this goroutine.
			ch <- result{netns.None(), errors.Join(err, fmt.Errorf("restore netns: %w", rerr))}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{ns, err}
	}()
	r := <-ch
	if r.err != nil {
		if r.ns.IsOpen() {
			r.ns.Close()
		}
		removeNetns(path)
		return netns.None(), fmt.Errorf("netns %s: %w", path, r.err)
	}
	return r.ns, nil
}

// removeNetns unmounts and removes a namespace made by createNetns. A
// missing one is not an error.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// deleteLink deletes the named link (a veth's peer goes with it). A missing
// one is not an error.
func deleteLink(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// bridgePorts lists the names of the bridge's ports.
func bridgePorts(bridge string) ([]string, error) {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, err
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// flushConntrack forgets the connections of a released address, so a
// sandbox that gets it next starts with none. Best effort.
func flushConntrack(a netip.Addr) {
	for _, t := range []netlink.ConntrackFilterType{netlink.ConntrackOrigSrcIP, netlink.ConntrackOrigDstIP} {
		f := &netlink.ConntrackFilter{}
		if f.AddIP(t, a.AsSlice()) == nil {
			netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
		}
	}
}

// forgetNeighbor deletes the bridge's ARP entry for a: a released address
// is handed out again with another MAC, and a stale entry would send the new
// sandbox's replies to the old MAC for seconds. Best effort.
func forgetNeighbor(bridge string, a netip.Addr) {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return
	}
	netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, IP: a.AsSlice()})
}
