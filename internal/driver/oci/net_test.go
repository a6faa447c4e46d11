package oci

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/netpool"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
)

// TestBoxNetwork runs boxes attached by netpool, inside a network namespace
// the test made: the box joins its namespace, has its address, resolv.conf
// and hosts file, and its egress policy holds.
func TestBoxNetwork(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			tmp := t.TempDir()
			pool, err := netpool.New(ctx, netpool.Config{Bridge: "cbtest0", CIDR: netip.MustParsePrefix("10.99.0.0/24"),
				DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53")}, StateDir: filepath.Join(tmp, "np"), NetnsDir: filepath.Join(tmp, "netns")})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Teardown(context.Background())
			srv := netpooltest.Peer(t, tmp, "srv", "tsrv0", netip.MustParsePrefix("192.0.2.254/24"),
				netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("192.0.2.2/24"))
			netpooltest.Listen(t, srv, "0.0.0.0:8080")
			api := netpooltest.Listen(t, "", "0.0.0.0:0")

			id := "tnet" + rt[3:]
			t0 := time.Now()
			n, err := pool.Attach(ctx, id, netpool.KindVeth, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("attach took %v", time.Since(t0))
			defer pool.Detach(context.Background(), id)
			b, err := d.Create(ctx, driver.Spec{ID: id, Shape: driver.Shape{Image: image, Net: n}, Session: driver.Session{Token: "x"}})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop(context.Background())
			exec := func(script string) string { return strings.TrimSpace(postExec(t, b, script)) }
			if got := exec("cat /etc/resolv.conf"); got != "nameserver 192.0.2.53" {
				t.Errorf("resolv.conf = %q", got)
			}
			if got := exec("cat /etc/hosts"); !strings.Contains(got, n.Addr.Addr().String()+"\t"+hostname(id)) {
				t.Errorf("hosts = %q", got)
			}
			if got := exec("cat /proc/net/fib_trie /proc/net/route 2>/dev/null | head -c 3000"); !strings.Contains(got, n.Addr.Addr().String()) && rt == "runc" {
				t.Errorf("address %s not in the box: %s", n.Addr.Addr(), got)
			}
			probe := func(addr string) string {
				return exec("timeout 3 bash -c 'echo > /dev/tcp/" + strings.ReplaceAll(addr, ":", "/") + "' && echo open || echo closed")
			}
			gw := n.Gateway.String()
			port := api.Addr().String()[strings.LastIndex(api.Addr().String(), ":")+1:]
			for addr, want := range map[string]string{
				"192.0.2.1:8080":      "open",
				"192.0.2.2:8080":      "closed",
				gw + ":" + port:       "closed",
				"192.0.2.254:" + port: "closed",
			} {
				if got := probe(addr); got != want {
					t.Errorf("%s from the box: %s, want %s", addr, got, want)
				}
			}
			if err := b.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if err := pool.Detach(ctx, id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// postExec runs script with /bin/sh in the box (the test agent's /exec).
func postExec(t *testing.T, b driver.Box, script string) string {
	t.Helper()
	c := agentHTTP(b)
	resp, err := c.Post("http://agent/exec", "text/plain", strings.NewReader(script))
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return sb.String()
}

func agentHTTP(b driver.Box) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return b.DialAgent(ctx) },
	}, Timeout: 30 * time.Second}
}
