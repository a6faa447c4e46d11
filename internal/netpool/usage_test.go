package netpool

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
)

// TestUsage: what a sandbox sends shows as its transmit counters, what
// the host sends it as its receive counters, on its own device only.
func TestUsage(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	ctx := context.Background()
	tmp := t.TempDir()
	p, err := New(ctx, Config{Bridge: "cbuse0", CIDR: netip.MustParsePrefix("10.98.0.0/24"),
		StateDir: filepath.Join(tmp, "state"), NetnsDir: filepath.Join(tmp, "netns")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Teardown(ctx) })
	talker, err := p.Attach(ctx, "talker1", KindVeth, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Attach(ctx, "quiet1", KindVeth, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Attach(ctx, "vm1", KindTAP, nil); err != nil {
		t.Fatal(err)
	}
	before, err := p.Usage(ctx, "talker1")
	if err != nil {
		t.Fatal(err)
	}
	quiet0, _ := p.Usage(ctx, "quiet1")
	// 20 datagrams of 1000 bytes from the sandbox to its gateway (the
	// rules drop them on the host; the device has carried them).
	const n, size = 20, 1000
	err = netpooltest.Do(talker.Netns, func() error {
		c, err := net.Dial("udp4", talker.Gateway.String()+":9")
		if err != nil {
			return err
		}
		defer c.Close()
		for range n {
			if _, err := c.Write(make([]byte, size)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := p.Usage(ctx, "talker1")
	if err != nil {
		t.Fatal(err)
	}
	if sent := after.TxPackets - before.TxPackets; sent < n {
		t.Errorf("sandbox sent %d datagrams; its transmit counter grew by %d", n, sent)
	}
	if sent := after.TxBytes - before.TxBytes; sent < n*size {
		t.Errorf("sandbox sent %d bytes; its transmit counter grew by %d", n*size, sent)
	}
	// The gateway answered its ARP request: received, not sent.
	if after.RxPackets == 0 {
		t.Errorf("receive counter is 0 after the gateway's ARP answer: %+v", after)
	}
	if quiet, _ := p.Usage(ctx, "quiet1"); quiet.TxBytes-quiet0.TxBytes >= n*size {
		t.Errorf("the quiet sandbox's counter took the talker's traffic: %+v", quiet)
	}
	if _, err := p.Usage(ctx, "vm1"); err != nil {
		t.Errorf("TAP: %v", err)
	}
	if _, err := p.Usage(ctx, "nobody"); err == nil {
		t.Error("usage of an unattached sandbox")
	}
}
