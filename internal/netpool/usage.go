package netpool

import (
	"context"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// Usage returns the counters of sandbox id's network device, seen from
// the sandbox (driver.NetUsage): those of the host end of its veth or
// its TAP, read over netlink in the daemon's namespace (not from
// /sys/class/net, which shows the namespace that mounted sysfs), with
// receive and transmit swapped. Traffic the rules drop after it left
// the sandbox counts as sent: the device carried it.
func (p *Pool) Usage(ctx context.Context, id string) (driver.NetUsage, error) {
	p.mu.Lock()
	a, ok := p.atts[id]
	p.mu.Unlock()
	if !ok {
		return driver.NetUsage{}, fmt.Errorf("netpool: usage of %s: not attached", id)
	}
	link, err := netlink.LinkByName(a.HostIf)
	if err != nil {
		return driver.NetUsage{}, fmt.Errorf("netpool: usage of %s: link %s: %w", id, a.HostIf, err)
	}
	st := link.Attrs().Statistics
	if st == nil {
		return driver.NetUsage{}, fmt.Errorf("netpool: usage of %s: link %s has no statistics", id, a.HostIf)
	}
	return driver.NetUsage{
		RxBytes: st.TxBytes, TxBytes: st.RxBytes,
		RxPackets: st.TxPackets, TxPackets: st.RxPackets,
	}, nil
}
