package qemu

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/driver"
)

func TestQEMUArgs(t *testing.T) {
	d := New(Config{StateDir: "/var/lib/cubicle/qemu", Machine: "microvm"})
	s := withDefaults(driver.Spec{ID: "abc", Shape: driver.Shape{Net: &driver.Net{
		TAP: "tap-abc", MAC: "02:00:00:00:00:01",
		Addr: netip.MustParsePrefix("10.88.0.5/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		DNS: []netip.Addr{netip.MustParseAddr("10.88.0.1")},
	}}})
	args := strings.Join(d.qemuArgs(s, "/d/abc", "/k", "/i", false), " ")
	for _, want := range []string{
		"-M microvm,", "-accel tcg,thread=multi", "-m 1024", "-smp 2",
		"virtio-blk-device,drive=root,serial=" + vminit.RootSerial,
		"virtserialport,chardev=agent,name=" + vminit.AgentPort,
		"socket,id=agent,server=on,wait=off,path=/d/abc/agent.sock",
		"tap,id=net0,ifname=tap-abc,script=no,downscript=no",
		"virtio-net-device,netdev=net0,mac=02:00:00:00:00:01",
		"ip=10.88.0.5::10.88.0.1:255.255.255.0:cubicle-abc:eth0:off:10.88.0.1",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu args lack %q:\n%s", want, args)
		}
	}
	if strings.Contains(args, "token") {
		t.Errorf("the token must not be on the command line: %s", args)
	}
	d.cfg.Machine = "q35"
	if args := strings.Join(d.qemuArgs(withDefaults(driver.Spec{ID: "abc"}), "/d/abc", "/k", "/i", true), " "); !strings.Contains(args, "virtio-blk-pci") ||
		!strings.Contains(args, "-accel kvm -cpu host") || strings.Contains(args, "netdev") {
		t.Errorf("q35/kvm args: %s", args)
	}
}

func TestIPParamRoundTrip(t *testing.T) {
	n := vminit.Net{Addr: netip.MustParsePrefix("192.168.7.9/20"), Gateway: netip.MustParseAddr("192.168.0.1"),
		DNS: []netip.Addr{netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("8.8.8.8")}, Device: "eth0"}
	p := vminit.IPParam(n, "h")
	got, err := vminit.ParseIPParam(strings.TrimPrefix(p, "ip="))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(n) {
		t.Errorf("round trip of %s: got %+v, want %+v", p, got, n)
	}
}
