package identity

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
)

func TestValidate(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:09")
	a, old := netip.MustParsePrefix("10.1.0.9/24"), netip.MustParsePrefix("10.1.0.5/24")
	for _, c := range []struct {
		name string
		c    Change
		ok   bool
	}{
		{"empty", Change{}, true},
		{"all", Change{Hostname: "cubicle-abc", MachineID: strings.Repeat("ab", 16), Entropy: make([]byte, 64), MAC: mac, Addr: a, OldAddr: old}, true},
		{"hostname with a dot", Change{Hostname: "a.b"}, false},
		{"hostname too long", Change{Hostname: strings.Repeat("a", 64)}, false},
		{"machine-id short", Change{MachineID: "abc"}, false},
		{"machine-id upper", Change{MachineID: strings.Repeat("AB", 16)}, false},
		{"too much entropy", Change{Entropy: make([]byte, 4097)}, false},
		{"address without old", Change{MAC: mac, Addr: a}, false},
		{"address without MAC", Change{Addr: a, OldAddr: old}, false},
	} {
		if err := c.c.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate = %v, want ok %v", c.name, err, c.ok)
		}
	}
}

func TestApplyFiles(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"etc", "var/lib/dbus", "dev"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "etc/machine-id"), []byte("parent\n"), 0o444)
	os.WriteFile(filepath.Join(root, "var/lib/dbus/machine-id"), []byte("parent\n"), 0o444)
	// A regular file refuses the ioctl: the entropy is written instead.
	os.WriteFile(filepath.Join(root, "dev/urandom"), nil, 0o644)
	id := strings.Repeat("0f", 16)
	entropy := bytes.Repeat([]byte{7}, 64)
	if err := Apply(Change{MachineID: id, Entropy: entropy}, root); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"etc/machine-id", "var/lib/dbus/machine-id"} {
		if b, _ := os.ReadFile(filepath.Join(root, p)); string(b) != id+"\n" {
			t.Errorf("%s = %q, want the new machine-id", p, b)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "dev/urandom")); !bytes.Equal(b, entropy) {
		t.Errorf("entropy written: %d bytes, want the 64 given", len(b))
	}
	if err := Apply(Change{MachineID: "nope"}, root); err == nil {
		t.Error("a bad machine-id was applied")
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/machine-id")); string(b) != id+"\n" {
		t.Errorf("a refused change wrote %q", b)
	}
}

func TestRenumber(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	old, nw := netip.MustParsePrefix("10.1.0.5/24"), netip.MustParsePrefix("10.1.0.9/24")
	la := netlink.NewLinkAttrs()
	la.Name = "eth0"
	// A veth pair: this kernel has no dummy links.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0p"}); err != nil {
		t.Fatal(err)
	}
	link, _ := netlink.LinkByName("eth0")
	netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: old.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}})
	netlink.LinkSetUp(link)
	mac, _ := net.ParseMAC("02:00:0a:01:00:09")
	gw := netip.MustParseAddr("10.1.0.1")

	if err := Apply(Change{MAC: mac, Addr: nw, OldAddr: netip.MustParsePrefix("10.9.9.9/24"), Gateway: gw}, "/"); err == nil {
		t.Error("renumbered an address no interface holds")
	}
	if err := Apply(Change{MAC: mac, Addr: nw, OldAddr: old, Gateway: gw}, "/"); err != nil {
		t.Fatal(err)
	}
	link, _ = netlink.LinkByName("eth0")
	if got := link.Attrs().HardwareAddr.String(); got != mac.String() {
		t.Errorf("MAC %s, want %s", got, mac)
	}
	addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != nw.String() {
		t.Errorf("addresses %v, want %s alone", addrs, nw)
	}
	routes, _ := netlink.RouteList(link, netlink.FAMILY_V4)
	found := false
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(gw.AsSlice()) {
			found = true
		}
	}
	if !found {
		t.Errorf("no default route via %s: %v", gw, routes)
	}
}
