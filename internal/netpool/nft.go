package netpool

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// table is one nftables table with its chains and their rules, in order.
type table struct {
	t      *nftables.Table
	chains []chain
}

type chain struct {
	c     *nftables.Chain
	rules [][]expr.Any
}

// ruleset returns the two tables the pool owns for the bridge, the pool's
// prefix and the given attachments. It is a pure function of its inputs
// (sorted by sandbox ID), so the rules are the same whenever the state is.
func ruleset(bridge string, prefix netip.Prefix, atts []*attachment) []table {
	atts = slices.Clone(atts)
	slices.SortFunc(atts, func(a, b *attachment) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	accept := nftables.ChainPolicyAccept
	inet := &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}
	input := &nftables.Chain{Name: "input", Table: inet, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	forward := &nftables.Chain{Name: "forward", Table: inet, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	post := &nftables.Chain{Name: "postrouting", Table: inet, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept}

	in := iif(bridge)
	inputRules := [][]expr.Any{
		// Replies to connections the host opened (e.g. to a VM's agent).
		cat(in, ctEstablished(), verdict(expr.VerdictAccept)),
		// Everything else a guest sends to the host: the API port, every
		// other service, on any of the host's addresses.
		cat(in, verdict(expr.VerdictDrop)),
	}
	fwdRules := [][]expr.Any{
		cat(in, oif(bridge), verdict(expr.VerdictDrop)),                // guest → guest, routed
		cat(oif(bridge), ctEstablished(), verdict(expr.VerdictAccept)), // replies to guests
		cat(oif(bridge), verdict(expr.VerdictDrop)),                    // nothing else reaches a guest
	}
	var sbChains []chain
	for _, a := range atts {
		name := sandboxChain(a.ID)
		c := &nftables.Chain{Name: name, Table: inet}
		fwdRules = append(fwdRules, cat(in, ip4Saddr(netip.PrefixFrom(a.Addr, 32)), jump(name)))
		var rules [][]expr.Any
		if len(a.Allow) > 0 { // (with none, the chain drops everything anyway)
			for _, p := range neverEgress() {
				rules = append(rules, cat(daddr(p), verdict(expr.VerdictDrop)))
			}
		}
		for _, p := range a.Allow {
			rules = append(rules, cat(daddr(p), verdict(expr.VerdictAccept)))
		}
		rules = append(rules, verdict(expr.VerdictDrop))
		sbChains = append(sbChains, chain{c: c, rules: rules})
	}
	fwdRules = append(fwdRules, cat(in, verdict(expr.VerdictDrop))) // unknown source addresses
	postRules := [][]expr.Any{
		cat(ip4Saddr(prefix), oifNot(bridge), []expr.Any{&expr.Masq{}}),
	}
	inetT := table{t: inet, chains: append([]chain{
		{c: input, rules: inputRules},
		{c: forward, rules: fwdRules},
		{c: post, rules: postRules},
	}, sbChains...)}

	// Bridge family: what may enter the bridge from each guest's port.
	br := &nftables.Table{Name: tableName, Family: nftables.TableFamilyBridge}
	pre := &nftables.Chain{Name: "prerouting", Table: br, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-200), Policy: &accept}
	var preRules [][]expr.Any
	for _, a := range atts {
		port := iif(a.HostIf)
		mac, _ := net.ParseMAC(a.MAC)
		preRules = append(preRules,
			cat(port, etherSaddrNot(mac), verdict(expr.VerdictDrop)),
			cat(port, etherType(unix.ETH_P_IP), bridgeIPSaddrNot(a.Addr), verdict(expr.VerdictDrop)),
			cat(port, etherType(unix.ETH_P_ARP), arpSPANot(a.Addr), verdict(expr.VerdictDrop)),
			cat(port, etherType(unix.ETH_P_IPV6), verdict(expr.VerdictDrop)),
		)
	}
	brT := table{t: br, chains: []chain{{c: pre, rules: preRules}}}
	return []table{inetT, brT}
}

// neverEgress are destinations no egress policy opens, not even "all" or
// an allow-list that names them: link-local 169.254.0.0/16 holds the cloud
// metadata service (169.254.169.254 on AWS, GCP, Azure, OpenStack...),
// which hands out the host's credentials to whoever asks, and Alibaba
// Cloud serves its metadata at 100.100.100.200. (IPv6, where AWS also
// serves it, never leaves a sandbox: the bridge drops it.)
func neverEgress() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("100.100.100.200/32"),
	}
}

// sandboxChain is the name of a sandbox's egress chain.
func sandboxChain(id string) string { return "sb-" + id }

// apply replaces the pool's tables by ts in one transaction: the kernel
// sees the old rules or the new ones, never none. (Adding an existing table
// is a no-op, so add-delete-add works whether or not it exists.)
func apply(ts []table) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for _, t := range ts {
		c.AddTable(t.t)
		c.DelTable(t.t)
		c.AddTable(t.t)
		for _, ch := range t.chains {
			c.AddChain(ch.c)
		}
		for _, ch := range t.chains {
			for _, r := range ch.rules {
				c.AddRule(&nftables.Rule{Table: t.t, Chain: ch.c, Exprs: r})
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: replace tables %q: %w", tableName, err)
	}
	return nil
}

// removeTables deletes the pool's tables if they exist.
func removeTables() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		t := &nftables.Table{Name: tableName, Family: fam}
		c.AddTable(t)
		c.DelTable(t)
	}
	return c.Flush()
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func iif(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func oif(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func oifNot(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(name)},
	}
}

func ctEstablished() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// prefixMatch loads len bytes at off of the network header and compares
// them, masked, with p.
func prefixMatch(off uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	p = p.Masked()
	addr := p.Addr().AsSlice()
	n := uint32(len(addr))
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}}
	if p.Bits() < int(n)*8 {
		mask := net.CIDRMask(p.Bits(), int(n)*8)
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)})
	}
	return append(out, &expr.Cmp{Op: op, Register: 1, Data: addr})
}

// ip4Saddr matches IPv4 packets from p (inet family).
func ip4Saddr(p netip.Prefix) []expr.Any {
	return cat(nfproto(unix.NFPROTO_IPV4), prefixMatch(12, p, expr.CmpOpEq))
}

// daddr matches packets to p, IPv4 or IPv6 (inet family). A /0 matches
// every packet of that family.
func daddr(p netip.Prefix) []expr.Any {
	if p.Addr().Is4() {
		if p.Bits() == 0 {
			return nfproto(unix.NFPROTO_IPV4)
		}
		return cat(nfproto(unix.NFPROTO_IPV4), prefixMatch(16, p, expr.CmpOpEq))
	}
	if p.Bits() == 0 {
		return nfproto(unix.NFPROTO_IPV6)
	}
	return cat(nfproto(unix.NFPROTO_IPV6), prefixMatch(24, p, expr.CmpOpEq))
}

func etherType(t uint16) []expr.Any {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, t)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func etherSaddrNot(mac net.HardwareAddr) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(mac)},
	}
}

// bridgeIPSaddrNot matches IPv4 packets not from a (bridge family, after
// an ether type check).
func bridgeIPSaddrNot(a netip.Addr) []expr.Any {
	return prefixMatch(12, netip.PrefixFrom(a, 32), expr.CmpOpNeq)
}

// arpSPANot matches ARP packets whose sender protocol address is not a
// (Ethernet/IPv4 ARP: the sender IP is at offset 14).
func arpSPANot(a netip.Addr) []expr.Any {
	return prefixMatch(14, netip.PrefixFrom(a, 32), expr.CmpOpNeq)
}
