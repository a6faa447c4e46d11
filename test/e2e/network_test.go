package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// metadataAddr is where most clouds serve instance metadata and
// credentials; alibabaMetadataAddr is Alibaba Cloud's. The test serves
// both itself, in its "internet" namespace, so that a sandbox reaching
// them would be seen.
const (
	metadataAddr        = "169.254.169.254"
	alibabaMetadataAddr = "100.100.100.200"
)

// TestNetwork runs cubicled with sandbox networking entirely inside a
// network namespace this test made (the test binary re-executes itself
// under `unshare --net`), with "the internet" — HTTP servers at 192.0.2.1
// and 192.0.2.2 — in a second namespace behind a veth. Nothing is added to
// the host's own network. It runs the same reachability matrix on gvisor
// (a netns and veth per sandbox) and on qemu (a TAP per VM, the guest's
// kernel configuring eth0 from ip=), each with its own daemon, bridge and
// address range. At most two sandboxes run at once: under TCG each VM
// costs a core. Midway the daemon is killed (-9) and restarted: the
// sandboxes it re-adopts keep their addresses, rules and reachability, and
// destroying them afterwards leaves nothing. Backends: gvisor, runc and
// qemu (runc's matrix is gvisor's: a netns and veth per sandbox), or those
// CUBICLE_E2E_BACKEND names.
func TestNetwork(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Command(t, "nft")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	tmp := t.TempDir()
	// The internet namespace also answers at 169.254.169.254, the cloud
	// metadata address, routed from the host: on a cloud VM a sandbox
	// with egress "all" would reach it the same way.
	srv := netpooltest.Peer(t, tmp, "internet", "tinet0", netip.MustParsePrefix("192.0.2.254/24"),
		netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("192.0.2.2/24"),
		netip.MustParsePrefix(metadataAddr+"/32"), netip.MustParsePrefix(alibabaMetadataAddr+"/32"))
	l, err := netlink.LinkByName("tinet0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{metadataAddr, alibabaMetadataAddr} {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index,
			Dst: &net.IPNet{IP: net.ParseIP(a).To4(), Mask: net.CIDRMask(32, 32)}, Gw: net.ParseIP("192.0.2.1")}); err != nil {
			t.Fatal(err)
		}
	}
	var web net.Listener
	if err := netpooltest.Do(srv, func() (err error) { web, err = net.Listen("tcp4", "0.0.0.0:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	defer web.Close()
	go http.Serve(web, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.Host)
	}))

	for i, backend := range selectedBackends("gvisor", "runc", "qemu") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testNetwork(t, backend, fmt.Sprintf("cbe2e%d", i), fmt.Sprintf("10.89.%d.0/24", i))
		})
	}
}

// testNetwork checks one backend: sandboxes with egress none and with an
// allow-list, then (after destroying the first, whose address the next
// one reuses) one with egress all.
func testNetwork(t *testing.T, backend, bridge, cidr string) {
	prefix := netip.MustParsePrefix(cidr)
	gw := prefix.Addr().Next().String()
	// Not t.TempDir: the VM's socket paths must stay short.
	dataDir, err := os.MkdirTemp("", "cubicle-e2e-net-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := harness.Start(ctx, harness.Options{DataDir: dataDir, ImageDir: imageDir(), DefaultBackend: backend,
		ListenHost: "0.0.0.0", Args: []string{"--net", "--net-bridge", bridge, "--net-cidr", cidr, "--net-dns", "192.0.2.53"}})
	if err != nil {
		os.RemoveAll(dataDir)
		t.Fatal(err)
	}
	c := client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(5*time.Minute))
	t.Cleanup(func() {
		if sbs, err := c.List(context.Background(), client.ListOptions{}); err == nil {
			for _, sb := range sbs {
				c.Destroy(context.Background(), sb.ID)
			}
		}
		d.Stop()
		log, _ := os.ReadFile(d.Log)
		if t.Failed() {
			t.Logf("cubicled log (tail):\n%s", tail(string(log), 60))
		}
		var ms []string
		for _, m := range regexp.MustCompile(`"msg":"network attached".*?"ms":(\d+)`).FindAllStringSubmatch(string(log), -1) {
			ms = append(ms, m[1]+"ms")
		}
		t.Logf("network attach times: %v", ms)
		os.RemoveAll(dataDir)
	})
	apiPort := d.Addr[strings.LastIndex(d.Addr, ":")+1:]

	create := func(n *client.Network) (client.Sandbox, error) {
		t0 := time.Now()
		req := client.CreateRequest{Backend: backend, Network: n}
		if isVM(backend) {
			req.MemoryMB, req.Resolution = 768, &client.Resolution{Width: 800, Height: 600}
		}
		sb, err := c.Create(context.Background(), req)
		if err != nil {
			return sb, fmt.Errorf("create: %w", err)
		}
		t.Logf("sandbox %s (%s) at %s ready in %s", sb.ID, sb.Isolation, sb.IP, time.Since(t0).Round(time.Millisecond))
		if !prefix.Contains(netip.MustParseAddr(sb.IP)) || sb.IP == gw {
			return sb, fmt.Errorf("sandbox IP %q not a guest address of %s", sb.IP, cidr)
		}
		return sb, nil
	}
	sh := func(id, script string) string {
		t.Helper()
		res, err := c.Exec(context.Background(), id, client.ExecRequest{Argv: []string{"bash", "-c", script}, TimeoutSeconds: 60})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	// probe says whether a TCP connection from sandbox id to addr opens
	// within 5 s: a dropped SYN is never answered, so "closed" costs the
	// whole bound, and check runs its probes at once.
	probe := func(id, addr string) (string, error) {
		host, port, _ := net.SplitHostPort(addr)
		script := fmt.Sprintf("timeout 5 bash -c 'echo > /dev/tcp/%s/%s' 2>/dev/null && echo open || echo closed", host, port)
		res, err := c.Exec(context.Background(), id, client.ExecRequest{Argv: []string{"bash", "-c", script}, TimeoutSeconds: 60})
		if err != nil {
			return "", fmt.Errorf("exec %q: %w", script, err)
		}
		return strings.TrimSpace(res.Stdout), nil
	}
	get := func(id, host string) string {
		return sh(id, fmt.Sprintf(`timeout 10 bash -c 'exec 3<>/dev/tcp/%s/8080; printf "GET / HTTP/1.0\r\nHost: %s\r\n\r\n" >&3; cat <&3' 2>&1 | tail -n 1`, host, host))
	}
	// check probes every case at once: each refused one waits out its
	// bound, which one after another took most of this test's time.
	check := func(cases []struct{ name, id, addr, want string }) {
		t.Helper()
		got := make([]string, len(cases))
		errs := make([]error, len(cases))
		var wg sync.WaitGroup
		for i, tc := range cases {
			wg.Go(func() { got[i], errs[i] = probe(tc.id, tc.addr) })
		}
		wg.Wait()
		for i, tc := range cases {
			if errs[i] != nil {
				t.Errorf("%s (%s): %v", tc.name, tc.addr, errs[i])
			} else if got[i] != tc.want {
				t.Errorf("%s (%s): %s, want %s", tc.name, tc.addr, got[i], tc.want)
			}
		}
	}
	// destroy destroys sb and checks that nothing of it is left.
	destroy := func(sb client.Sandbox) {
		t.Helper()
		ports, links := bridgePorts(t, bridge), hostLinks(t)
		if err := c.Destroy(context.Background(), sb.ID); err != nil {
			t.Fatal(err)
		}
		assertNetGone(t, dataDir, sb)
		if got := bridgePorts(t, bridge); got != ports-1 {
			t.Errorf("%s: bridge ports %d after destroy, want %d", sb.ID, got, ports-1)
		}
		after := hostLinks(t)
		if gone := slices.DeleteFunc(slices.Clone(links), func(l string) bool { return slices.Contains(after, l) }); len(gone) != 1 || len(after) != len(links)-1 {
			t.Errorf("%s: sandbox links before destroy %v, after %v: want exactly one gone", sb.ID, links, after)
		}
		if p := hostQEMU(sb.ID); len(p) > 0 {
			t.Errorf("%s: qemu still running: %v", sb.ID, p)
		}
		assertNoTrace(t, d, backend, sb.ID)
	}

	// Two at once: egress none and an allow-list.
	var none, allow client.Sandbox
	var errNone, errAllow error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); none, errNone = create(&client.Network{Egress: client.EgressNone}) }()
	// The allow-list names the metadata addresses too: they stay dropped.
	go func() {
		defer wg.Done()
		allow, errAllow = create(&client.Network{Allow: []string{"192.0.2.1/32", metadataAddr + "/32", alibabaMetadataAddr + "/32"}})
	}()
	wg.Wait()
	if err := errors.Join(errNone, errAllow); err != nil {
		t.Fatal(err)
	}
	if none.IP == allow.IP {
		t.Fatalf("addresses not distinct: %s, %s", none.IP, allow.IP)
	}
	if got := sh(none.ID, "grep -v '^#' /etc/resolv.conf"); got != "nameserver 192.0.2.53" {
		t.Errorf("resolv.conf = %q", got)
	}
	// The guest's NIC has the MAC the bridge's anti-spoofing rules expect
	// of its port (a VM's is set by the driver; gVisor's netstack may not
	// show it in sysfs).
	if mac := sh(none.ID, "cat /sys/class/net/eth0/address 2>/dev/null"); mac != "" {
		out, _ := exec.Command("nft", "list", "table", "bridge", "cubicle").CombinedOutput()
		if !strings.Contains(string(out), "ether saddr != "+mac+" ") {
			t.Errorf("guest eth0 MAC %s not the one its port's rules expect:\n%s", mac, out)
		}
	} else if isVM(backend) {
		t.Errorf("VM guest has no eth0")
	}
	// A listener in the allow-list sandbox, for the guest ↔ guest check.
	sh(allow.ID, "(setsid python3 -m http.server 9000 --bind 0.0.0.0 >/dev/null 2>&1 &); for i in $(seq 300); do (echo > /dev/tcp/127.0.0.1/9000) 2>/dev/null && break; sleep 0.1; done")
	if err := netpooltest.Dial("", allow.IP+":9000"); err != nil {
		t.Errorf("host → guest listener (control): %v", err)
	}
	check([]struct{ name, id, addr, want string }{
		{"none → allowed server", none.ID, "192.0.2.1:8080", "closed"},
		{"none → other server", none.ID, "192.0.2.2:8080", "closed"},
		{"none → API on the gateway", none.ID, gw + ":" + apiPort, "closed"},
		{"none → other guest", none.ID, allow.IP + ":9000", "closed"},
		{"allow-list → other server", allow.ID, "192.0.2.2:8080", "closed"},
		{"allow-list → API on the gateway", allow.ID, gw + ":" + apiPort, "closed"},
		{"allow-list naming it → cloud metadata address", allow.ID, metadataAddr + ":8080", "closed"},
		{"allow-list naming it → Alibaba metadata address", allow.ID, alibabaMetadataAddr + ":8080", "closed"},
	})
	if got, want := get(allow.ID, "192.0.2.1"), "hello from 192.0.2.1"; got != want {
		t.Errorf("allow-list → allowed server: GET = %q, want %q", got, want)
	}
	// Controls: the metadata servers answer whoever the rules let through
	// (the host, whose traffic no sandbox rule sees).
	for _, a := range []string{metadataAddr, alibabaMetadataAddr} {
		if err := netpooltest.Dial("", a+":8080"); err != nil {
			t.Errorf("host → metadata address %s (control): %v", a, err)
		}
	}
	if resp, err := http.Get(fmt.Sprintf("http://%s:%s/healthz", gw, apiPort)); err != nil {
		t.Errorf("host → API on the gateway (control): %v", err)
	} else {
		resp.Body.Close()
	}

	// Destroy leaves nothing of the sandbox's network; its address is
	// reused at once, without conflict, by a sandbox with egress all.
	destroy(none)
	all, err := create(&client.Network{Egress: client.EgressAll})
	if err != nil {
		t.Fatal(err)
	}
	if all.IP != none.IP {
		t.Errorf("new sandbox got %s, want the released %s", all.IP, none.IP)
	}
	check([]struct{ name, id, addr, want string }{
		{"all → server 1 (control)", all.ID, "192.0.2.1:8080", "open"},
		{"all → API on the gateway", all.ID, gw + ":" + apiPort, "closed"},
		{"all → API on the host's other address", all.ID, "192.0.2.254:" + apiPort, "closed"},
		{"all → other guest", all.ID, allow.IP + ":9000", "closed"},
		{"all → cloud metadata address", all.ID, metadataAddr + ":8080", "closed"},
		{"all → Alibaba metadata address", all.ID, alibabaMetadataAddr + ":8080", "closed"},
		{"allow-list after another's destroy → allowed server", allow.ID, "192.0.2.1:8080", "open"},
	})
	if got := get(all.ID, "192.0.2.2"); got != "hello from 192.0.2.2" {
		t.Errorf("all → server 2 on a reused address: GET = %q", got)
	}

	// kill -9 the daemon and restart it: both sandboxes are re-adopted
	// with their addresses, the pool, links, bridge ports and rules are as
	// they were, and their networks and policies still work.
	free, links, ports, rules := metricValue(t, d, "cubicle_netpool_free"), hostLinks(t), bridgePorts(t, bridge), nftRules()
	d.Kill9()
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	if err := d.Restart(rctx); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []client.Sandbox{allow, all} {
		got, err := c.Get(context.Background(), sb.ID)
		if err != nil || got.State != "running" || got.IP != sb.IP {
			t.Fatalf("%s after the restart: %+v %v, want running at %s", sb.ID, got, err, sb.IP)
		}
	}
	if got := metricValue(t, d, "cubicle_netpool_free"); got != free {
		t.Errorf("after the restart: %v addresses free, %v before", got, free)
	}
	if got := hostLinks(t); !slices.Equal(got, links) {
		t.Errorf("after the restart: sandbox links %v, %v before", got, links)
	}
	if got := bridgePorts(t, bridge); got != ports {
		t.Errorf("after the restart: %d bridge ports, %d before", got, ports)
	}
	if got := nftRules(); !slices.Equal(got, rules) {
		t.Errorf("after the restart: nft rules\n%s\nbefore:\n%s", strings.Join(got, "\n"), strings.Join(rules, "\n"))
	}
	check([]struct{ name, id, addr, want string }{
		{"after restart: allow-list → allowed server", allow.ID, "192.0.2.1:8080", "open"},
		{"after restart: allow-list → other server", allow.ID, "192.0.2.2:8080", "closed"},
		{"after restart: allow-list naming it → cloud metadata address", allow.ID, metadataAddr + ":8080", "closed"},
		{"after restart: all → API on the gateway", all.ID, gw + ":" + apiPort, "closed"},
		{"after restart: all → other guest", all.ID, allow.IP + ":9000", "closed"},
		{"after restart: all → Alibaba metadata address", all.ID, alibabaMetadataAddr + ":8080", "closed"},
	})
	if got := get(all.ID, "192.0.2.2"); got != "hello from 192.0.2.2" {
		t.Errorf("after restart: all → server 2: GET = %q", got)
	}
	for _, sb := range []client.Sandbox{allow, all} {
		destroy(sb)
	}
	if got := bridgePorts(t, bridge); got != 0 {
		t.Errorf("bridge has %d ports after every sandbox is gone", got)
	}
	if l := hostLinks(t); len(l) > 0 {
		t.Errorf("sandbox links left: %v", l)
	}
	if out, _ := exec.Command("nft", "list", "ruleset").CombinedOutput(); strings.Contains(string(out), "sb-") {
		t.Errorf("per-sandbox rules left:\n%s", out)
	}
	body := metricsText(t, d)
	if !strings.Contains(body, "cubicle_netpool_free 253") {
		t.Errorf("metrics: want cubicle_netpool_free 253 with every address free:\n%s", grepLines(body, "netpool"))
	}
}

// hostLinks lists the sandbox links (veth host ends "cbv…", TAPs "cbt…")
// in the test's namespace.
func hostLinks(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, "cbv") || strings.HasPrefix(n, "cbt") {
			out = append(out, n)
		}
	}
	return out
}

// assertNetGone checks that no namespace, state file, rule or neighbour of
// sandbox sb is left.
func assertNetGone(t *testing.T, dataDir string, sb client.Sandbox) {
	t.Helper()
	if _, err := os.Stat("/run/netns/cubicle-" + sb.ID); err == nil {
		t.Errorf("%s: network namespace left", sb.ID)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "netpool", sb.ID+".json")); err == nil {
		t.Errorf("%s: netpool state left", sb.ID)
	}
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Errorf("nft: %v: %s", err, out)
	}
	if strings.Contains(string(out), sb.ID) || regexp.MustCompile(`(^|[^0-9.])`+regexp.QuoteMeta(sb.IP)+`([^0-9]|$)`).Match(out) {
		t.Errorf("%s: rules left:\n%s", sb.ID, out)
	}
	if pids := harness.HostProcesses(sb.ID); len(pids) > 0 {
		t.Errorf("%s: processes left: %v", sb.ID, pids)
	}
}

func bridgePorts(t *testing.T, bridge string) int {
	t.Helper()
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatalf("bridge %s: %v", bridge, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			n++
		}
	}
	return n
}

func metricsText(t *testing.T, d *harness.Daemon) string {
	t.Helper()
	req, _ := http.NewRequest("GET", d.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+d.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return sb.String()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n") + " (" + strconv.Itoa(len(out)) + " lines)"
}
