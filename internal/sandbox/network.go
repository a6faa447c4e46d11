package sandbox

import (
	"context"
	"net/netip"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// NetPool gives sandboxes their network (DESIGN.md "Networking"). It is
// implemented by internal/netpool and wired in cmd/cubicled; the manager
// knows only this interface.
type NetPool interface {
	// Attach makes sandbox id's network of kind ("veth" for boxes that
	// join a network namespace, "tap" for VMs) with egress limited to
	// allow (empty: nothing; 0.0.0.0/0 and ::/0: everything). On error
	// nothing of it is left.
	Attach(ctx context.Context, id, kind string, allow []netip.Prefix) (*driver.Net, error)
	// Detach removes sandbox id's network and frees its address; it is
	// safe to call more than once.
	Detach(ctx context.Context, id string) error
	// SetEgress replaces sandbox id's egress policy (as Attach's allow)
	// for the connections it opens from now on: a warm-pool box takes its
	// create's policy when it is claimed. On error the old one stays.
	SetEgress(ctx context.Context, id string, allow []netip.Prefix) error
	// Cleanup detaches every sandbox not in keep (orphans after a
	// restart).
	Cleanup(ctx context.Context, keep map[string]bool) error
	// Free is the number of free addresses (the cubicle_netpool_free gauge).
	Free() int
}

// Network attachment kinds.
const (
	NetKindVeth = "veth"
	NetKindTAP  = "tap"
)

// NetKinder is implemented by a driver that says which network attachment
// its boxes use. Without it, VM backends (Isolation "vm") get a TAP and the
// others a veth in a network namespace.
type NetKinder interface {
	NetKind() string
}

func netKind(d driver.Driver) string {
	if k, ok := d.(NetKinder); ok {
		return k.NetKind()
	}
	if d.Isolation() == driver.IsolationVM {
		return NetKindTAP
	}
	return NetKindVeth
}

// egressAllow turns a request's network policy into the prefixes its
// sandbox may reach. The default (no "network" in the request) is "none":
// a sandbox reaches nothing unless its creator asks.
func egressAllow(n Network) ([]netip.Prefix, error) {
	switch {
	case n.Egress == "all" && len(n.Allow) == 0:
		return []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}, nil
	case (n.Egress == "" || n.Egress == "none") && len(n.Allow) == 0:
		return nil, nil
	case n.Egress == "" && len(n.Allow) > 0:
		out := make([]netip.Prefix, 0, len(n.Allow))
		for i, s := range n.Allow {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return nil, errdefs.Invalid("network.egress.allow[%d]: %q is not a CIDR", i, s)
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			out = append(out, p.Masked())
		}
		return out, nil
	}
	return nil, errdefs.Invalid(`network.egress must be "none", "all" or {"allow": [CIDR, ...]}`)
}

// updateNetGauge sets cubicle_netpool_free.
func (m *Manager) updateNetGauge() {
	if m.cfg.Network != nil {
		m.m.NetpoolFree.Set(float64(m.cfg.Network.Free()))
	}
}
