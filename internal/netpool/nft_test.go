package netpool

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// packet is what the evaluator below needs to know of an IPv4 packet
// crossing the inet forward hook: its interfaces and its network header.
type packet struct {
	iif, oif string
	nh       []byte // the IPv4 header: source at 12, destination at 16
}

func ip4Packet(iif, oif string, src, dst netip.Addr) packet {
	nh := make([]byte, 20)
	nh[0] = 0x45
	s, d := src.As4(), dst.As4()
	copy(nh[12:], s[:])
	copy(nh[16:], d[:])
	return packet{iif: iif, oif: oif, nh: nh}
}

// nftEval runs the rules the pool generates, as the kernel would, for one
// packet of a new connection. It knows only the expressions the inet
// table uses; any other fails the test, so a rule it cannot read is never
// taken for one that does not match.
type nftEval struct {
	t      *testing.T
	chains map[string][][]expr.Any
}

func newNFTEval(t *testing.T, ts []table) *nftEval {
	e := &nftEval{t: t, chains: map[string][][]expr.Any{}}
	for _, tb := range ts {
		if tb.t.Family != nftables.TableFamilyINet {
			continue
		}
		for _, c := range tb.chains {
			e.chains[c.c.Name] = c.rules
		}
	}
	return e
}

// chain runs the rules of name in order and returns the first terminal
// verdict, following jumps; ok is false when the packet falls off the end
// (a base chain's policy then decides, a jumped-to chain returns).
func (e *nftEval) chain(name string, p packet) (v expr.VerdictKind, ok bool) {
	e.t.Helper()
	rules, found := e.chains[name]
	if !found {
		e.t.Fatalf("no chain %q", name)
	}
	for _, r := range rules {
		kind, target, matched := e.rule(r, p)
		if !matched {
			continue
		}
		if kind == expr.VerdictJump {
			if v, ok := e.chain(target, p); ok {
				return v, true
			}
			continue
		}
		return kind, true
	}
	return 0, false
}

// rule evaluates one rule: matched is false at the first comparison that
// fails; otherwise the rule's verdict is returned.
func (e *nftEval) rule(r []expr.Any, p packet) (kind expr.VerdictKind, target string, matched bool) {
	e.t.Helper()
	reg := map[uint32][]byte{}
	for _, x := range r {
		switch x := x.(type) {
		case *expr.Meta:
			switch x.Key {
			case expr.MetaKeyNFPROTO:
				reg[x.Register] = []byte{unix.NFPROTO_IPV4}
			case expr.MetaKeyIIFNAME:
				reg[x.Register] = ifname(p.iif)
			case expr.MetaKeyOIFNAME:
				reg[x.Register] = ifname(p.oif)
			default:
				e.t.Fatalf("evaluator: meta key %v", x.Key)
			}
		case *expr.Ct:
			if x.Key != expr.CtKeySTATE {
				e.t.Fatalf("evaluator: ct key %v", x.Key)
			}
			b := make([]byte, 4)
			binary.NativeEndian.PutUint32(b, expr.CtStateBitNEW)
			reg[x.Register] = b
		case *expr.Payload:
			if x.Base != expr.PayloadBaseNetworkHeader || int(x.Offset+x.Len) > len(p.nh) {
				e.t.Fatalf("evaluator: payload %+v", x)
			}
			reg[x.DestRegister] = p.nh[x.Offset : x.Offset+x.Len]
		case *expr.Bitwise:
			src := reg[x.SourceRegister]
			if len(src) != int(x.Len) || len(x.Mask) != int(x.Len) || len(x.Xor) != int(x.Len) {
				e.t.Fatalf("evaluator: bitwise %+v on %d bytes", x, len(src))
			}
			out := make([]byte, x.Len)
			for i := range out {
				out[i] = src[i]&x.Mask[i] ^ x.Xor[i]
			}
			reg[x.DestRegister] = out
		case *expr.Cmp:
			eq := bytes.Equal(reg[x.Register], x.Data)
			switch x.Op {
			case expr.CmpOpEq:
			case expr.CmpOpNeq:
				eq = !eq
			default:
				e.t.Fatalf("evaluator: cmp op %v", x.Op)
			}
			if !eq {
				return 0, "", false
			}
		case *expr.Verdict:
			return x.Kind, x.Chain, true
		default:
			e.t.Fatalf("evaluator: expression %T", x)
		}
	}
	e.t.Fatalf("evaluator: rule without a verdict: %v", r)
	return 0, "", false
}

// TestRulesetNeverEgress pins the cloud metadata addresses a sandbox can
// never reach, by what the generated forward chain does with packets to
// them and to their neighbours: the whole of link-local 169.254.0.0/16
// and Alibaba's 100.100.100.200 are dropped, even for a sandbox allowed
// everywhere and for one whose allow-list names them; the addresses just
// outside are not.
func TestRulesetNeverEgress(t *testing.T) {
	const bridge = "cb0"
	all := &attachment{ID: "all", Addr: netip.MustParseAddr("10.9.0.2"), HostIf: "cbvall", MAC: "02:00:00:00:00:02",
		Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}
	listed := &attachment{ID: "listed", Addr: netip.MustParseAddr("10.9.0.3"), HostIf: "cbvlisted", MAC: "02:00:00:00:00:03",
		Allow: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("100.100.100.200/32"),
			netip.MustParsePrefix("192.0.2.0/24")}}
	ev := newNFTEval(t, ruleset(bridge, netip.MustParsePrefix("10.9.0.0/24"), []*attachment{all, listed}))
	for _, tc := range []struct {
		from *attachment
		to   string
		want expr.VerdictKind
	}{
		{all, "169.254.169.254", expr.VerdictDrop}, // AWS, GCP, Azure, OpenStack
		{all, "169.254.0.1", expr.VerdictDrop},
		{all, "169.254.0.0", expr.VerdictDrop},
		{all, "169.254.255.255", expr.VerdictDrop},
		{all, "169.254.170.2", expr.VerdictDrop},   // ECS task credentials
		{all, "100.100.100.200", expr.VerdictDrop}, // Alibaba Cloud
		{all, "169.253.255.255", expr.VerdictAccept},
		{all, "169.255.0.0", expr.VerdictAccept},
		{all, "100.100.100.199", expr.VerdictAccept},
		{all, "100.100.100.201", expr.VerdictAccept},
		{all, "93.184.215.14", expr.VerdictAccept},
		{listed, "169.254.169.254", expr.VerdictDrop},
		{listed, "169.254.1.1", expr.VerdictDrop},
		{listed, "100.100.100.200", expr.VerdictDrop},
		{listed, "192.0.2.7", expr.VerdictAccept},
		{listed, "93.184.215.14", expr.VerdictDrop},
	} {
		p := ip4Packet(bridge, "eth0", tc.from.Addr, netip.MustParseAddr(tc.to))
		got, ok := ev.chain("forward", p)
		if !ok {
			got = expr.VerdictAccept // the forward chain's policy
		}
		if got != tc.want {
			t.Errorf("sandbox %q (allow %v) to %s: %s, want %s", tc.from.ID, tc.from.Allow, tc.to, verdictName(got), verdictName(tc.want))
		}
	}
}

func verdictName(v expr.VerdictKind) string {
	switch v {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	}
	return fmt.Sprintf("verdict %d", v)
}
