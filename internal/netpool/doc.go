// Package netpool gives each sandbox its own network: a network namespace
// with a veth into a bridge owned by cubicle (OCI boxes), or a TAP device on
// that bridge (VMs), an IPv4 address from a configurable pool, and nftables
// rules that enforce the sandbox's egress policy and keep guests away from
// the host and from each other (DESIGN.md "Networking").
//
// Only cmd/cubicled (which wires a *Pool into the sandbox manager) and tests
// import it; the manager sees it through its own small interface.
//
// The package talks to the kernel over netlink directly:
// github.com/vishvananda/netlink (links, addresses, routes, bridge-port
// flags, conntrack) and github.com/google/nftables (rules). Shelling out to
// ip(8) and nft(8) would cost a process per step, parse text whose format
// drifts between versions, and need the tools installed; the libraries are
// the ones Docker/Kubernetes CNI plugins and Tailscale use, and the nftables
// one lets the whole rule set be replaced in one atomic transaction.
//
// What it owns on the host, all tagged so Cleanup can find it:
//
//	bridge Config.Bridge (default "cubicle0")  gateway = first address of Config.CIDR
//	links "cbv<hash>" / "cbt<hash>"            host side of a veth / a TAP, bridge ports
//	netns NetnsDir/cubicle-<id>                 one per OCI sandbox (bind mount, as ip-netns)
//	nft tables "inet cubicle", "bridge cubicle"
//	StateDir/<id>.json                          one per attachment, written before anything is made
//
// The rule set is rebuilt from the attachments in one nftables transaction
// on every change, so what the kernel enforces is always a function of the
// persisted state, and a restart re-creates exactly the same rules.
//
// Policy (all guest traffic enters the host through the bridge):
//   - guest → host (any local address, any port, the daemon's API above all):
//     dropped in the input hook; only replies to connections the host opened pass;
//   - guest → guest: bridge ports are isolated (no L2 path), and routed
//     traffic from the bridge back to the bridge is dropped;
//   - guest → elsewhere: per sandbox, checked on every packet (not only on
//     new connections, so a reused address cannot ride an earlier sandbox's
//     flows): "none" drops all, "all" accepts, an allow-list accepts only its
//     CIDRs; accepted traffic is masqueraded;
//   - elsewhere → guest: only replies (conntrack established/related);
//   - a guest may only send from its own MAC and IPv4 address (bridge-family
//     rules on its port), so it cannot borrow another sandbox's policy; IPv6
//     from guests is dropped.
//
// ip_forward is switched on in the namespace the daemon runs in (required
// for egress), and IPv6 is disabled on the bridge.
package netpool
