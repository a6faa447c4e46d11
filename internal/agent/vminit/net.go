package vminit

import "net"

// prefixNet converts n's address to the net.IPNet netlink wants.
func prefixNet(n Net) *net.IPNet {
	return &net.IPNet{
		IP:   n.Addr.Addr().AsSlice(),
		Mask: net.CIDRMask(n.Addr.Bits(), n.Addr.Addr().BitLen()),
	}
}
