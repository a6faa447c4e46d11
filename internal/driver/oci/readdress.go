package oci

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// guestLink is the guest end of a box's veth in its network namespace
// (internal/netpool names it so).
const guestLink = "eth0"

// readdress gives the guest end of a gVisor box's veth its address and
// default route again, before a restore. runsc takes them off the
// interface when the box starts (its own network stack answers for the
// address from then on), and a restore reads the interfaces of the
// namespace again: one without an address is skipped, and the restored
// box had no network at all (TestPauseResumeNetwork). The netlink socket
// is opened in the namespace, so no thread of the daemon changes
// namespace.
func readdress(nsPath string, addr netip.Prefix, gw netip.Addr) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("readdress: netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("readdress: netlink in %s: %w", nsPath, err)
	}
	defer h.Close()
	link, err := h.LinkByName(guestLink)
	if err != nil {
		return fmt.Errorf("readdress: %s in %s: %w", guestLink, nsPath, err)
	}
	ipnet := &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), addr.Addr().BitLen())}
	if err := h.AddrReplace(link, &netlink.Addr{IPNet: ipnet}); err != nil {
		return fmt.Errorf("readdress: address %s on %s: %w", addr, guestLink, err)
	}
	if gw.IsValid() {
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}
		if err := h.RouteReplace(route); err != nil {
			return fmt.Errorf("readdress: default route via %s: %w", gw, err)
		}
	}
	return nil
}
