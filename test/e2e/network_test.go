package e2e

import (
	"context"
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
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestNetwork runs a cubicled with sandbox networking on the gvisor backend
// entirely inside a network namespace this test made (the test binary
// re-executes itself under `unshare --net`), with "the internet" — HTTP
// servers at 192.0.2.1 and 192.0.2.2 — in a second namespace behind a veth.
// Nothing is added to the host's own network.
func TestNetwork(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Runtime(t, "runsc")
	needs.Command(t, "nft")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	const (
		bridge = "cbe2e0"
		cidr   = "10.89.0.0/24"
		gw     = "10.89.0.1"
	)
	tmp := t.TempDir()
	srv := netpooltest.Peer(t, tmp, "internet", "tinet0", netip.MustParsePrefix("192.0.2.254/24"),
		netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("192.0.2.2/24"))
	var web net.Listener
	if err := netpooltest.Do(srv, func() (err error) { web, err = net.Listen("tcp4", "0.0.0.0:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	defer web.Close()
	go http.Serve(web, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.Host)
	}))

	dataDir := filepath.Join(tmp, "data")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := harness.Start(ctx, harness.Options{DataDir: dataDir, ImageDir: imageDir(), DefaultBackend: "gvisor",
		ListenHost: "0.0.0.0", Args: []string{"--net", "--net-bridge", bridge, "--net-cidr", cidr, "--net-dns", "192.0.2.53"}})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(3*time.Minute))
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
		t.Logf("network attach times (netns + veth + rules): %v", ms)
	})
	apiPort := d.Addr[strings.LastIndex(d.Addr, ":")+1:]

	create := func(n *client.Network) client.Sandbox {
		t.Helper()
		sb, err := c.Create(context.Background(), client.CreateRequest{Backend: "gvisor", Network: n})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if !netip.MustParsePrefix(cidr).Contains(netip.MustParseAddr(sb.IP)) || sb.IP == gw {
			t.Fatalf("sandbox IP %q not a guest address of %s", sb.IP, cidr)
		}
		return sb
	}
	sh := func(id, script string) string {
		t.Helper()
		res, err := c.Exec(context.Background(), id, client.ExecRequest{Argv: []string{"bash", "-c", script}, TimeoutSeconds: 30})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	// probe says whether a TCP connection from sandbox id to addr opens.
	probe := func(id, addr string) string {
		host, port, _ := net.SplitHostPort(addr)
		return sh(id, fmt.Sprintf("timeout 3 bash -c 'echo > /dev/tcp/%s/%s' 2>/dev/null && echo open || echo closed", host, port))
	}
	get := func(id, host string) string {
		return sh(id, fmt.Sprintf(`timeout 5 bash -c 'exec 3<>/dev/tcp/%s/8080; printf "GET / HTTP/1.0\r\nHost: %s\r\n\r\n" >&3; cat <&3' 2>&1 | tail -n 1`, host, host))
	}

	none := create(&client.Network{Egress: client.EgressNone})
	allow := create(&client.Network{Allow: []string{"192.0.2.1/32"}})
	all := create(&client.Network{Egress: client.EgressAll})
	t.Logf("sandboxes: none %s, allow %s, all %s", none.IP, allow.IP, all.IP)
	if ips := []string{none.IP, allow.IP, all.IP}; len(slices.Compact(slices.Sorted(slices.Values(ips)))) != 3 {
		t.Fatalf("addresses not distinct: %v", ips)
	}
	if got := sh(none.ID, "cat /etc/resolv.conf"); got != "nameserver 192.0.2.53" {
		t.Errorf("resolv.conf = %q", got)
	}
	// A listener in the allow-list sandbox, for the guest ↔ guest check.
	sh(allow.ID, "(setsid python3 -m http.server 9000 --bind 0.0.0.0 >/dev/null 2>&1 &); for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/9000) 2>/dev/null && break; sleep 0.1; done")
	if err := netpooltest.Dial("", allow.IP+":9000"); err != nil {
		t.Errorf("host → guest listener (control): %v", err)
	}

	for _, tc := range []struct {
		name, id, addr, want string
	}{
		{"none → allowed server", none.ID, "192.0.2.1:8080", "closed"},
		{"none → other server", none.ID, "192.0.2.2:8080", "closed"},
		{"allow-list → other server", allow.ID, "192.0.2.2:8080", "closed"},
		{"all → server 1 (control)", all.ID, "192.0.2.1:8080", "open"},
		{"all → server 2 (control)", all.ID, "192.0.2.2:8080", "open"},
		{"all → API on the gateway", all.ID, gw + ":" + apiPort, "closed"},
		{"all → API on the host's other address", all.ID, "192.0.2.254:" + apiPort, "closed"},
		{"allow-list → API on the gateway", allow.ID, gw + ":" + apiPort, "closed"},
		{"none → API on the gateway", none.ID, gw + ":" + apiPort, "closed"},
		{"all → other guest", all.ID, allow.IP + ":9000", "closed"},
		{"none → other guest", none.ID, allow.IP + ":9000", "closed"},
	} {
		if got := probe(tc.id, tc.addr); got != tc.want {
			t.Errorf("%s (%s): %s, want %s", tc.name, tc.addr, got, tc.want)
		}
	}
	if got, want := get(allow.ID, "192.0.2.1"), "hello from 192.0.2.1"; got != want {
		t.Errorf("allow-list → allowed server: GET = %q, want %q", got, want)
	}
	if got := get(all.ID, "192.0.2.2"); got != "hello from 192.0.2.2" {
		t.Errorf("all → server 2: GET = %q", got)
	}
	if resp, err := http.Get(fmt.Sprintf("http://%s:%s/healthz", gw, apiPort)); err != nil {
		t.Errorf("host → API on the gateway (control): %v", err)
	} else {
		resp.Body.Close()
	}

	// Destroy leaves nothing of the sandbox's network; its address is
	// reused at once, without conflict.
	portsBefore := bridgePorts(t, bridge)
	if err := c.Destroy(context.Background(), none.ID); err != nil {
		t.Fatal(err)
	}
	assertNetGone(t, dataDir, none)
	if got := bridgePorts(t, bridge); got != portsBefore-1 {
		t.Errorf("bridge ports %d after destroy, want %d", got, portsBefore-1)
	}
	reuse := create(&client.Network{Egress: client.EgressAll})
	if reuse.IP != none.IP {
		t.Errorf("new sandbox got %s, want the released %s", reuse.IP, none.IP)
	}
	if got := get(reuse.ID, "192.0.2.2"); got != "hello from 192.0.2.2" {
		t.Errorf("sandbox on a reused address: GET = %q", got)
	}
	if got := probe(allow.ID, "192.0.2.1:8080"); got != "open" {
		t.Errorf("allow-list sandbox after another's destroy: %s", got)
	}
	for _, sb := range []client.Sandbox{allow, all, reuse} {
		if err := c.Destroy(context.Background(), sb.ID); err != nil {
			t.Fatal(err)
		}
		assertNetGone(t, dataDir, sb)
	}
	if got := bridgePorts(t, bridge); got != 0 {
		t.Errorf("bridge has %d ports after every sandbox is gone", got)
	}
	if out, _ := exec.Command("nft", "list", "ruleset").CombinedOutput(); strings.Contains(string(out), "sb-") {
		t.Errorf("per-sandbox rules left:\n%s", out)
	}
	body := metricsText(t, d)
	if !strings.Contains(body, "cubicle_netpool_free 253") {
		t.Errorf("metrics: want cubicle_netpool_free 253 with every address free:\n%s", grepLines(body, "netpool"))
	}
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
	if strings.Contains(string(out), sb.ID) || strings.Contains(string(out), sb.IP+" ") {
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
