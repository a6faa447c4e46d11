package netpool

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
)

func TestPoolNetwork(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	ctx := context.Background()
	tmp := t.TempDir()
	cfg := Config{
		Bridge:   "cbtest0",
		CIDR:     netip.MustParsePrefix("10.99.0.0/24"),
		DNS:      []netip.Addr{netip.MustParseAddr("192.0.2.53")},
		StateDir: filepath.Join(tmp, "state"),
		NetnsDir: filepath.Join(tmp, "netns"),
	}
	p, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Teardown(ctx); err != nil {
			t.Errorf("teardown: %v", err)
		}
		if ents, _ := os.ReadDir(cfg.NetnsDir); len(ents) > 0 {
			t.Errorf("namespaces left in %s: %v", cfg.NetnsDir, ents)
		}
	})

	// "The internet": a namespace with two addresses behind a veth.
	srv := netpooltest.Peer(t, tmp, "server-ns", "tsrv0", netip.MustParsePrefix("192.0.2.254/24"),
		netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("192.0.2.2/24"))
	netpooltest.Listen(t, srv, "0.0.0.0:8080")
	api := netpooltest.Listen(t, "", "0.0.0.0:0") // the daemon's API port, on every host address
	apiPort := api.Addr().(*net.TCPAddr).Port

	free0 := p.Free()
	if free0 != 253 {
		t.Errorf("Free = %d, want 253", free0)
	}
	none, err := p.Attach(ctx, "none1", KindVeth, nil)
	if err != nil {
		t.Fatal(err)
	}
	allow, err := p.Attach(ctx, "allow1", KindVeth, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")})
	if err != nil {
		t.Fatal(err)
	}
	all, err := p.Attach(ctx, "all1", KindVeth, []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := []string{none.Addr.String(), allow.Addr.String(), all.Addr.String()}, []string{"10.99.0.2/24", "10.99.0.3/24", "10.99.0.4/24"}; !slices.Equal(got, want) {
		t.Errorf("addresses %v, want %v", got, want)
	}
	if none.Gateway.String() != "10.99.0.1" || len(none.DNS) != 1 || none.TAP != "" || none.Netns != filepath.Join(cfg.NetnsDir, "cubicle-none1") {
		t.Errorf("net = %+v", none)
	}
	if got := p.Free(); got != free0-3 {
		t.Errorf("Free = %d, want %d", got, free0-3)
	}
	netpooltest.Listen(t, allow.Netns, "0.0.0.0:9000")
	netpooltest.Listen(t, all.Netns, "0.0.0.0:9000")

	gw := "10.99.0.1"
	for _, tc := range []struct {
		name, from, to string
		ok             bool
	}{
		{"host reaches guest (control)", "", all.Addr.Addr().String() + ":9000", true},
		{"host reaches own API (control)", "", fmt.Sprintf("%s:%d", gw, apiPort), true},
		{"none: allowed server", none.Netns, "192.0.2.1:8080", false},
		{"none: other server", none.Netns, "192.0.2.2:8080", false},
		{"allow-list: allowed server", allow.Netns, "192.0.2.1:8080", true},
		{"allow-list: other server", allow.Netns, "192.0.2.2:8080", false},
		{"all: server 1", all.Netns, "192.0.2.1:8080", true},
		{"all: server 2", all.Netns, "192.0.2.2:8080", true},
		{"all: API on gateway", all.Netns, fmt.Sprintf("%s:%d", gw, apiPort), false},
		{"all: API on host's other address", all.Netns, fmt.Sprintf("192.0.2.254:%d", apiPort), false},
		{"all: API on loopback name", all.Netns, fmt.Sprintf("127.0.0.1:%d", apiPort), false},
		{"allow-list: API on gateway", allow.Netns, fmt.Sprintf("%s:%d", gw, apiPort), false},
		{"all → other guest", all.Netns, allow.Addr.Addr().String() + ":9000", false},
		{"allow-list → other guest", allow.Netns, all.Addr.Addr().String() + ":9000", false},
		{"none → other guest", none.Netns, all.Addr.Addr().String() + ":9000", false},
	} {
		err := netpooltest.Dial(tc.from, tc.to)
		if (err == nil) != tc.ok {
			t.Errorf("%s: dial %s = %v, want ok=%v", tc.name, tc.to, err, tc.ok)
		}
	}

	// Detach leaves nothing; the address is reused at once.
	if err := p.Detach(ctx, "none1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Detach(ctx, "none1"); err != nil {
		t.Errorf("second detach: %v", err)
	}
	assertGone(t, p, "none1", none)
	re, err := p.Attach(ctx, "reuse1", KindVeth, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	if re.Addr != none.Addr {
		t.Errorf("reattach got %v, want the released %v", re.Addr, none.Addr)
	}
	if err := netpooltest.Dial(re.Netns, "192.0.2.2:8080"); err != nil {
		t.Errorf("sandbox on a reused address: %v", err)
	}

	// A TAP for VMs: on the bridge, in this namespace, isolated.
	tap, err := p.Attach(ctx, "vm1", KindTAP, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tap.Netns != "" || tap.TAP != hostIfName(KindTAP, "vm1") {
		t.Errorf("tap net = %+v", tap)
	}
	l, err := netlink.LinkByName(tap.TAP)
	if err != nil {
		t.Fatal(err)
	}
	if br, _ := netlink.LinkByName(cfg.Bridge); l.Attrs().MasterIndex != br.Attrs().Index {
		t.Errorf("tap %s is not on the bridge", tap.TAP)
	}
	if pi, err := netlink.LinkGetProtinfo(l); err != nil || !pi.Isolated {
		t.Errorf("tap %s isolated = %v, %v", tap.TAP, pi.Isolated, err)
	}

	// A restarted daemon takes the attachments back and cleans the ones it
	// does not keep.
	p2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Free() != p.Free() {
		t.Errorf("after restart Free = %d, want %d", p2.Free(), p.Free())
	}
	if err := netpooltest.Dial(allow.Netns, "192.0.2.1:8080"); err != nil {
		t.Errorf("kept sandbox after restart: %v", err)
	}
	if err := netpooltest.Dial(allow.Netns, "192.0.2.2:8080"); err == nil {
		t.Error("kept sandbox's policy lost after restart")
	}
	orphan := "cbv0123456789"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: orphan, MasterIndex: mustIndex(t, cfg.Bridge)}, PeerName: "cbtestpeer"}); err != nil {
		t.Fatal(err)
	}
	if err := p2.Cleanup(ctx, map[string]bool{"allow1": true}); err != nil {
		t.Fatal(err)
	}
	for id, n := range map[string]*driver.Net{"all1": all, "reuse1": re, "vm1": tap} {
		assertGone(t, p2, id, n)
	}
	if _, err := netlink.LinkByName(orphan); err == nil {
		t.Errorf("orphan bridge port %s survived Cleanup", orphan)
	}
	if got := p2.Free(); got != free0-1 {
		t.Errorf("Free = %d, want %d", got, free0-1)
	}
	if err := netpooltest.Dial(allow.Netns, "192.0.2.1:8080"); err != nil {
		t.Errorf("kept sandbox after cleanup: %v", err)
	}
	p = p2 // tear down through the pool that knows the state
}

func mustIndex(t *testing.T, name string) int {
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

// assertGone checks that nothing of sandbox id is left.
func assertGone(t *testing.T, p *Pool, id string, n *driver.Net) {
	t.Helper()
	for _, kind := range []string{KindVeth, KindTAP} {
		if _, err := netlink.LinkByName(hostIfName(kind, id)); err == nil {
			t.Errorf("%s: link %s left", id, hostIfName(kind, id))
		}
	}
	if n.Netns != "" {
		if _, err := os.Stat(n.Netns); err == nil {
			t.Errorf("%s: namespace %s left", id, n.Netns)
		}
	}
	if _, err := os.Stat(p.statePath(id)); err == nil {
		t.Errorf("%s: state file left", id)
	}
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err == nil && (strings.Contains(string(out), id) || strings.Contains(string(out), hostIfName(KindVeth, id)) ||
		strings.Contains(string(out), hostIfName(KindTAP, id)) || strings.Contains(string(out), n.Addr.Addr().String()+" ")) {
		t.Errorf("%s: rules left:\n%s", id, out)
	}
	br, _ := netlink.LinkByName(p.cfg.Bridge)
	addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4)
	for _, a := range addrs {
		if a.IP.String() == n.Addr.Addr().String() {
			t.Errorf("%s: address %s left on the bridge", id, a.IP)
		}
	}
}

// TestAttachTime measures attach and detach of a veth sandbox network (a
// namespace, a veth pair, addresses, a route, and a rule-set replacement).
func TestAttachTime(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	ctx := context.Background()
	tmp := t.TempDir()
	p, err := New(ctx, Config{Bridge: "cbtest0", CIDR: netip.MustParsePrefix("10.99.0.0/24"),
		StateDir: filepath.Join(tmp, "state"), NetnsDir: filepath.Join(tmp, "netns")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Teardown(ctx)
	for _, kind := range []string{KindVeth, KindTAP} {
		var att, det []time.Duration
		for i := range 20 {
			id := fmt.Sprintf("t%d", i)
			t0 := time.Now()
			if _, err := p.Attach(ctx, id, kind, nil); err != nil {
				t.Fatal(err)
			}
			att = append(att, time.Since(t0))
			t0 = time.Now()
			if err := p.Detach(ctx, id); err != nil {
				t.Fatal(err)
			}
			det = append(det, time.Since(t0))
		}
		slices.Sort(att)
		slices.Sort(det)
		t.Logf("%s: attach median %v p90 %v; detach median %v p90 %v (n=20)", kind, att[10], att[18], det[10], det[18])
	}
}
