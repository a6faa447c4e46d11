package netpool

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

func TestAddrPool(t *testing.T) {
	p, err := newAddrPool(netip.MustParsePrefix("10.9.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.gateway, netip.MustParseAddr("10.9.0.1"); got != want {
		t.Errorf("gateway = %v, want %v", got, want)
	}
	if got, want := p.size(), 5; got != want { // .2 … .6
		t.Errorf("size = %d, want %d", got, want)
	}
	var got []string
	for i := 0; i < 5; i++ {
		a, err := p.allocate("x")
		if err != nil {
			t.Fatalf("allocate #%d: %v", i, err)
		}
		got = append(got, a.String())
	}
	if want := "10.9.0.2 10.9.0.3 10.9.0.4 10.9.0.5 10.9.0.6"; strings.Join(got, " ") != want {
		t.Errorf("allocated %v, want %s", got, want)
	}
	if _, err := p.allocate("y"); err == nil {
		t.Error("allocate from a full pool succeeded")
	}
	if p.free() != 0 {
		t.Errorf("free = %d, want 0", p.free())
	}
	p.release(netip.MustParseAddr("10.9.0.4"))
	if a, err := p.allocate("z"); err != nil || a.String() != "10.9.0.4" {
		t.Errorf("after release: allocate = %v, %v; want 10.9.0.4 reused", a, err)
	}
}

func TestAddrPoolClaim(t *testing.T) {
	p, _ := newAddrPool(netip.MustParsePrefix("10.9.0.0/24"))
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"10.9.0.7", true},
		{"10.9.0.1", false},   // gateway
		{"10.9.0.0", false},   // network
		{"10.9.0.255", false}, // broadcast
		{"10.9.1.7", false},   // outside
	} {
		err := p.claim(netip.MustParseAddr(tc.addr), "a")
		if (err == nil) != tc.ok {
			t.Errorf("claim(%s) = %v, want ok=%v", tc.addr, err, tc.ok)
		}
	}
	if err := p.claim(netip.MustParseAddr("10.9.0.7"), "b"); err == nil {
		t.Error("two sandboxes claimed one address")
	}
	if a, _ := p.allocate("c"); a.String() != "10.9.0.2" {
		t.Errorf("allocate = %v, want 10.9.0.2", a)
	}
	if a, _ := p.allocate("d"); a.String() != "10.9.0.3" {
		t.Errorf("allocate = %v, want 10.9.0.3", a)
	}
}

func TestAddrPoolRejects(t *testing.T) {
	for _, c := range []string{"10.0.0.0/31", "10.0.0.0/32", "fd00::/64"} {
		if _, err := newAddrPool(netip.MustParsePrefix(c)); err == nil {
			t.Errorf("newAddrPool(%s) succeeded", c)
		}
	}
	p, err := newAddrPool(netip.MustParsePrefix("10.88.7.9/16"))
	if err != nil || p.gateway.String() != "10.88.0.1" || p.size() != 65533 {
		t.Errorf("10.88.7.9/16: gateway %v size %d err %v", p.gateway, p.size(), err)
	}
}

func TestNames(t *testing.T) {
	id := "abcdefghijklmnopqrstuvwxyz"
	for _, kind := range []string{KindVeth, KindTAP} {
		n := hostIfName(kind, id)
		if len(n) > 15 {
			t.Errorf("%s name %q longer than IFNAMSIZ-1", kind, n)
		}
		if n != hostIfName(kind, id) || n == hostIfName(kind, id+"x") {
			t.Errorf("%s name %q not a stable function of the id", kind, n)
		}
	}
	if hostIfName(KindVeth, id) == hostIfName(KindTAP, id) {
		t.Error("veth and tap names collide")
	}
	mac := guestMAC(id)
	if mac[0]&0x02 == 0 || mac[0]&0x01 != 0 {
		t.Errorf("MAC %v is not locally administered unicast", mac)
	}
	for _, bad := range []string{"", "A", "a-b", "../x", strings.Repeat("a", 65)} {
		if validID(bad) == nil {
			t.Errorf("validID(%q) = nil", bad)
		}
	}
}

// verdicts returns the verdict of each rule of the chain named name.
func verdicts(ts []table, family, name string) []string {
	for _, tb := range ts {
		for _, c := range tb.chains {
			if c.c.Name != name || (family == "bridge") != (tb.t.Family == nftables.TableFamilyBridge) {
				continue
			}
			var out []string
			for _, r := range c.rules {
				v, ok := r[len(r)-1].(*expr.Verdict)
				switch {
				case !ok:
					out = append(out, "other")
				case v.Kind == expr.VerdictAccept:
					out = append(out, "accept")
				case v.Kind == expr.VerdictDrop:
					out = append(out, "drop")
				case v.Kind == expr.VerdictJump:
					out = append(out, "jump "+v.Chain)
				}
			}
			return out
		}
	}
	return nil
}

func TestRuleset(t *testing.T) {
	atts := []*attachment{
		{ID: "b", Addr: netip.MustParseAddr("10.9.0.3"), HostIf: "cbvb", MAC: "02:00:00:00:00:03",
			Allow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}},
		{ID: "a", Addr: netip.MustParseAddr("10.9.0.2"), HostIf: "cbva", MAC: "02:00:00:00:00:02"},
		{ID: "c", Addr: netip.MustParseAddr("10.9.0.4"), HostIf: "cbvc", MAC: "02:00:00:00:00:04",
			Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
	}
	ts := ruleset("br0", netip.MustParsePrefix("10.9.0.0/24"), atts)
	for _, tc := range []struct {
		family, chain string
		want          string
	}{
		{"inet", "input", "accept drop"},
		{"inet", "forward", "drop accept drop jump sb-a jump sb-b jump sb-c drop"},
		{"inet", "postrouting", "other"},
		{"inet", "sb-a", "drop"},
		// The cloud metadata addresses are dropped before any allow rule.
		{"inet", "sb-b", "drop drop accept accept drop"},
		{"inet", "sb-c", "drop drop accept drop"},
		{"bridge", "prerouting", strings.Repeat("drop ", 12)[:len(strings.Repeat("drop ", 12))-1]},
	} {
		if got := strings.Join(verdicts(ts, tc.family, tc.chain), " "); got != tc.want {
			t.Errorf("%s %s: verdicts %q, want %q", tc.family, tc.chain, got, tc.want)
		}
	}
	// The order of attachments does not change the rules.
	ts2 := ruleset("br0", netip.MustParsePrefix("10.9.0.0/24"), []*attachment{atts[2], atts[0], atts[1]})
	if a, b := verdicts(ts, "inet", "forward"), verdicts(ts2, "inet", "forward"); strings.Join(a, ",") != strings.Join(b, ",") {
		t.Errorf("rules depend on attachment order: %v vs %v", a, b)
	}
}
