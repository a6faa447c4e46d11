package netpool

import (
	"fmt"
	"net/netip"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// addrPool hands out the host addresses of an IPv4 prefix. The first host
// address is the gateway (the bridge); the network and broadcast addresses
// are never handed out. It is not safe for concurrent use.
type addrPool struct {
	prefix  netip.Prefix
	gateway netip.Addr
	last    netip.Addr // last assignable address (before broadcast)
	used    map[netip.Addr]string
}

// newAddrPool checks that prefix is an IPv4 network with room for at least
// one guest besides the gateway.
func newAddrPool(prefix netip.Prefix) (*addrPool, error) {
	if !prefix.Addr().Is4() {
		return nil, fmt.Errorf("netpool: CIDR %s is not IPv4", prefix)
	}
	if prefix.Bits() > 30 {
		return nil, fmt.Errorf("netpool: CIDR %s is too small (at most /30)", prefix)
	}
	prefix = prefix.Masked()
	gw := prefix.Addr().Next()
	bcast := lastAddr(prefix)
	return &addrPool{prefix: prefix, gateway: gw, last: bcast.Prev(), used: make(map[netip.Addr]string)}, nil
}

// lastAddr is the highest address of p (its broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// size is the number of assignable guest addresses.
func (p *addrPool) size() int {
	return 1<<(32-p.prefix.Bits()) - 3
}

// free is the number of addresses not in use.
func (p *addrPool) free() int { return p.size() - len(p.used) }

// allocate gives id the lowest free address. Lowest-first keeps the pool
// compact and makes reuse after release immediate and predictable.
func (p *addrPool) allocate(id string) (netip.Addr, error) {
	for a := p.gateway.Next(); a.IsValid() && a.Compare(p.last) <= 0; a = a.Next() {
		if _, ok := p.used[a]; !ok {
			p.used[a] = id
			return a, nil
		}
	}
	return netip.Addr{}, errdefs.New(errdefs.ErrCapacity, "all %d sandbox network addresses of %s are in use (--net-cidr)", p.size(), p.prefix)
}

// claim marks a as used by id (re-adopting a persisted allocation).
func (p *addrPool) claim(a netip.Addr, id string) error {
	if !p.prefix.Contains(a) || a.Compare(p.gateway) <= 0 || a.Compare(p.last) > 0 {
		return fmt.Errorf("netpool: address %s of %s is not a guest address of %s", a, id, p.prefix)
	}
	if other, ok := p.used[a]; ok && other != id {
		return fmt.Errorf("netpool: address %s claimed by both %s and %s", a, other, id)
	}
	p.used[a] = id
	return nil
}

// release returns a to the pool.
func (p *addrPool) release(a netip.Addr) { delete(p.used, a) }
