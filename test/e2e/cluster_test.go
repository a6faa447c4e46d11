package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/cluster/etcdtest"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// clusterLease is the nodes' --lease-ttl in these tests: short, so that a
// dead node's sandboxes turn lost within seconds.
const clusterLease = 4 * time.Second

// clusterSandboxesEnv is how many sandboxes TestCluster and
// TestClusterE2BSDK start with, and TestClusterRollingUpgrade drives two
// thirds of (at least 3): the acceptance's 9 unless set. Each is a
// desktop's boot, 10-20 s of CPU. make test sets 3, one a node: the
// creates through a still have to use every node, the E2B list still
// pages (2 to a page), the drain still pauses what a holds, and every
// other check is the same.
const clusterSandboxesEnv = "CUBICLE_E2E_CLUSTER_SANDBOXES"

// clusterSandboxes is clusterSandboxesEnv's count: at least one a node.
func clusterSandboxes(t *testing.T) int {
	t.Helper()
	s := os.Getenv(clusterSandboxesEnv)
	if s == "" {
		return 9
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 3 {
		t.Fatalf("%s=%q: want a count of at least 3, one for each node", clusterSandboxesEnv, s)
	}
	return n
}

// createAll makes k gvisor sandboxes through c at once, as agents
// starting together would: a boot leaves CPU to another's, and each
// create placed but not yet counted in its node's record counts there,
// so that they spread over the nodes.
func createAll(t *testing.T, c *client.Client, k int, what string) []client.Sandbox {
	t.Helper()
	sbs := make([]client.Sandbox, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs[i], errs[i] = c.Create(context.Background(), client.CreateRequest{Backend: "gvisor"})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d of %d %s: %v", i+1, k, what, err)
		}
	}
	return sbs
}

// spreadOver counts sbs by node and fails the test unless every one of
// names holds at least one.
func spreadOver(t *testing.T, sbs []client.Sandbox, names ...string) map[string]int {
	t.Helper()
	perNode := map[string]int{}
	for _, sb := range sbs {
		perNode[sb.Node]++
	}
	t.Logf("%d creates through a went %v", len(sbs), perNode)
	for _, n := range names {
		if perNode[n] == 0 {
			t.Fatalf("%d creates went %v; want every node of %v used", len(sbs), perNode, names)
		}
	}
	return perNode
}

// testCluster is three cubicled nodes (own data dirs and ports) on a
// three-member etcd, with one API key.
type testCluster struct {
	t     *testing.T
	etcd  *etcdtest.Cluster
	nodes map[string]*harness.Daemon
	dirs  map[string]string
	key   string
}

func startCluster(t *testing.T, names ...string) *testCluster {
	t.Helper()
	return startClusterNet(t, false, nil, names...)
}

// startClusterNet is startCluster with, when netns, each node in a
// network namespace of its own, on a bridge of the test's namespace
// (which InOwnNetns made) where etcd listens: 10.213.0.1 is the test's
// side, 10.213.0.11 the first node, and so on. Nothing is added to the
// host's own network. extra, when not nil, gives a node's own flags.
func startClusterNet(t *testing.T, netns bool, extra func(name string) []string, names ...string) *testCluster {
	t.Helper()
	needs.Root(t)
	needs.Runtime(t, "runsc")
	needs.Image(t, filepath.Join(imageDir(), "desktop-lite"))
	raw := make([]byte, 20)
	rand.Read(raw)
	etcdHost := "127.0.0.1"
	nsOf, hostOf := map[string]string{}, map[string]string{}
	if netns {
		needs.Command(t, "ip", "nsenter")
		etcdHost = "10.213.0.1"
		ip := func(args ...string) {
			t.Helper()
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v: %s", args, err, out)
			}
		}
		ip("link", "add", "cbcl0", "type", "bridge")
		ip("addr", "add", etcdHost+"/24", "dev", "cbcl0")
		ip("link", "set", "cbcl0", "up")
		for i, name := range names {
			ns := fmt.Sprintf("cbcl-%s-%s", hex.EncodeToString(raw[:3]), name)
			ip("netns", "add", ns)
			t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
			host := fmt.Sprintf("cbclh%d", i)
			ip("link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
			ip("link", "set", host, "master", "cbcl0", "up")
			nsOf[name], hostOf[name] = ns, fmt.Sprintf("10.213.0.%d", 11+i)
			ip("-n", ns, "addr", "add", hostOf[name]+"/24", "dev", "eth0")
			ip("-n", ns, "link", "set", "eth0", "up")
			ip("-n", ns, "link", "set", "lo", "up")
		}
	}
	// Room for a third of the sandboxes a test starts with and the
	// creates TestCluster adds on one node: 6 up to 9 sandboxes.
	maxSandboxes := max(6, (clusterSandboxes(t)+2)/3+3)
	tc := &testCluster{t: t, etcd: etcdtest.StartOn(t, 3, etcdHost), nodes: map[string]*harness.Daemon{}, dirs: map[string]string{},
		key: "e2b_" + hex.EncodeToString(raw)} // E2B's key format: the E2B SDK test uses it too
	for _, name := range names {
		dir, err := os.MkdirTemp("", "cubicle-cluster-"+name+"-")
		if err != nil {
			t.Fatal(err)
		}
		tc.dirs[name] = dir
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		args := []string{
			"--cluster-etcd", strings.Join(tc.etcd.Endpoints(), ","), "--node-name", name,
			"--lease-ttl", clusterLease.String(), "--max-sandboxes", strconv.Itoa(maxSandboxes),
		}
		if extra != nil {
			args = append(args, extra(name)...)
		}
		d, err := harness.Start(ctx, harness.Options{DataDir: dir, ImageDir: imageDir(), APIKey: tc.key,
			Netns: nsOf[name], ListenHost: hostOf[name], Args: args})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		tc.nodes[name] = d
	}
	t.Cleanup(func() {
		// Every node's own sandboxes, asked of each node directly.
		for _, name := range names {
			c := tc.client(name)
			if sbs, err := c.List(context.Background(), client.ListOptions{}); err == nil {
				for _, sb := range sbs {
					if sb.Node == name {
						c.Destroy(context.Background(), sb.ID)
					}
				}
			}
		}
		for _, name := range names {
			d := tc.nodes[name]
			d.Stop()
			if t.Failed() {
				log, _ := os.ReadFile(d.Log)
				t.Logf("node %s log (tail):\n%s", name, tail(string(log), 40))
			}
			os.RemoveAll(tc.dirs[name])
		}
	})
	a := tc.client(names[0])
	waitFor(t, "every node in the cluster", func() bool {
		info, err := a.Info(context.Background())
		return err == nil && info.Cluster != nil && len(info.Cluster.Nodes) == len(names) && info.Cluster.Degraded == ""
	})
	return tc
}

func (tc *testCluster) client(name string) *client.Client {
	return client.New(tc.nodes[name].URL, client.WithAPIKey(tc.key), client.WithTimeout(3*time.Minute))
}

// health is a node's /healthz status.
func (tc *testCluster) health(name string) string {
	resp, err := http.Get(tc.nodes[name].URL + "/healthz")
	if err != nil {
		return "down"
	}
	defer resp.Body.Close()
	var h struct{ Status, Reason string }
	json.NewDecoder(resp.Body).Decode(&h)
	return h.Status
}

// TestCluster is issue 15's acceptance on this machine: three nodes, each
// in a network namespace of its own, on a three-member etcd, behind node
// a's URL. The Go SDK, pointed at a only, creates 9 sandboxes
// (CUBICLE_E2E_CLUSTER_SANDBOXES), which spread over all three nodes, and
// drives each through a (screenshot, click, command, files, live view);
// MCP's tools and CDP reach the other nodes' sandboxes through a, and a
// volume stays on its node but is used through the others. A drained
// node takes no new sandbox, and one drained with pause pauses its own,
// resumed through another node. Node b is killed -9: its sandboxes turn
// lost within the lease, creates go to a and c, and once b is back they
// are running again. One etcd member stopped changes nothing; two
// stopped leave every node serving its own sandboxes and saying it is
// degraded; restored, the catalog converges. Nothing is left on the host.
func TestCluster(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	tc := startClusterNet(t, true, nil, "a", "b", "c")
	ctx := context.Background()
	a := tc.client("a")

	n := clusterSandboxes(t)
	sbs := createAll(t, a, n, "through a")
	spreadOver(t, sbs, "a", "b", "c")

	// Each is driven through a, and answers from its own node.
	for _, sb := range sbs {
		driveThrough(t, tc, "a", sb)
	}
	list, err := a.List(ctx, client.ListOptions{})
	if err != nil || len(list) != n {
		t.Fatalf("list through a: %d sandboxes, %v; want %d", len(list), err, n)
	}
	// MCP's tools reach the other nodes' sandboxes through a too; a
	// volume of b's is used through a, by a sandbox on b that CDP then
	// reaches through a.
	mcpThrough(t, tc, "a", sbs)
	heldThrough(t, tc)

	// Drained (the operator's file in its data dir), a takes no new
	// sandboxes: creates through it go to b and c, and its own run on.
	drain := filepath.Join(tc.dirs["a"], "drain")
	if err := os.WriteFile(drain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a draining", func() bool {
		info, err := a.Info(ctx)
		return err == nil && info.Cluster != nil && info.Cluster.Draining
	})
	for _, sb := range createAll(t, a, 2, "through draining a") {
		if sb.Node == "a" {
			t.Fatal("a draining node took a new sandbox")
		}
		sbs = append(sbs, sb)
	}
	// A drain file that says "pause" pauses a's own sandboxes: each waits
	// on a's disk, and is resumed there through another node.
	if err := os.WriteFile(drain, []byte("pause\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var onA []client.Sandbox
	for _, sb := range sbs {
		if sb.Node == "a" {
			onA = append(onA, sb)
		}
	}
	c := tc.client("c")
	paused := time.Now()
	// One at a time, each a save of a desktop's memory: tens of seconds
	// for three on this loaded 2-core host.
	if !eventually(3*time.Minute, func() bool {
		for _, sb := range onA {
			if got, err := c.Get(ctx, sb.ID); err != nil || got.State != client.StatePaused {
				return false
			}
		}
		return true
	}) {
		t.Fatal("a's sandboxes were not all paused by the drain in 3 min")
	}
	t.Logf("a's %d sandboxes paused by the drain in %v", len(onA), time.Since(paused).Round(100*time.Millisecond))
	os.Remove(drain)
	for _, sb := range onA {
		got, err := c.Resume(ctx, sb.ID, 0)
		if err != nil || got.State != client.StateRunning || got.Node != "a" {
			t.Fatalf("resume of %s through c: %+v, %v; want running on a", sb.ID, got, err)
		}
	}
	driveThrough(t, tc, "c", onA[0])
	waitFor(t, "a undrained", func() bool {
		info, err := a.Info(ctx)
		return err == nil && info.Cluster != nil && !info.Cluster.Draining
	})

	// kill -9 of b: its sandboxes turn lost within the lease.
	var onB []string
	for _, sb := range sbs {
		if sb.Node == "b" {
			onB = append(onB, sb.ID)
		}
	}
	tc.nodes["b"].Kill9()
	killed := time.Now()
	waitFor(t, "b's sandboxes lost", func() bool {
		for _, id := range onB {
			sb, err := a.Get(ctx, id)
			if err != nil || sb.State != client.StateLost {
				return false
			}
		}
		return true
	})
	t.Logf("b's %d sandboxes lost %v after kill -9 (lease %v)", len(onB), time.Since(killed).Round(100*time.Millisecond), clusterLease)
	if took := time.Since(killed); took > clusterLease+5*time.Second {
		t.Errorf("lost after %v, beyond the lease (%v) and 5 s", took, clusterLease)
	}
	sb, _ := a.Get(ctx, onB[0])
	if sb.Node != "b" || !strings.Contains(sb.Error, "node b") {
		t.Errorf("a lost sandbox reads %+v; want node b and the reason", sb)
	}
	if _, err := a.Exec(ctx, onB[0], client.ExecRequest{Command: "true"}); !client.IsConflict(err) {
		t.Errorf("exec in a lost sandbox: %v, want a conflict", err)
	}
	// Creates go to a and c.
	for _, sb := range createAll(t, a, 2, "with b dead") {
		if sb.Node == "b" || sb.Node == "" {
			t.Fatalf("created on %q with b dead", sb.Node)
		}
		sbs = append(sbs, sb)
	}

	// b comes back: its sandboxes, which ran on, are running again.
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	if err := tc.nodes["b"].Restart(rctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	// Every node sees it, each through its own watch of b's record: one
	// that has not seen b back yet still calls its sandboxes lost.
	waitFor(t, "b's sandboxes running again, through every node", func() bool {
		for _, via := range []string{"a", "b", "c"} {
			for _, id := range onB {
				sb, err := tc.client(via).Get(ctx, id)
				if err != nil || sb.State != client.StateRunning {
					return false
				}
			}
		}
		return true
	})
	for _, sb := range sbs {
		if sb.Node == "b" {
			driveThrough(t, tc, "c", sb)
		}
	}

	// One etcd member down: nothing changes, for as long as a change
	// would take to show (unchangedAfterMemberStop says how long, and
	// why).
	tc.etcd.Stop(0)
	stopped := time.Now()
	up := []string{tc.etcd.Members[1].ClientURL, tc.etcd.Members[2].ClientURL}
	if err := unchangedAfterMemberStop(ctx, up, []string{"a", "b", "c"}, clusterLease, tc.health); err != nil {
		t.Error(err)
	} else {
		t.Logf("one etcd member stopped: every node healthy and renewing its lease through the others for %v", time.Since(stopped).Round(100*time.Millisecond))
	}
	sb, err = a.Create(ctx, client.CreateRequest{Backend: "gvisor"})
	if err != nil {
		t.Fatalf("create with 2 of 3 etcd members: %v", err)
	}
	sbs = append(sbs, sb)

	// Two down: no quorum. Every node says it is degraded and serves its
	// own sandboxes; a create through a lands on a.
	tc.etcd.Stop(1)
	waitFor(t, "every node degraded", func() bool {
		for name := range tc.nodes {
			if tc.health(name) != "degraded" {
				return false
			}
		}
		return true
	})
	for _, sb := range sbs {
		shot, err := tc.client(sb.Node).Screenshot(ctx, sb.ID, client.ScreenshotOptions{Format: "png"})
		if err != nil {
			t.Fatalf("screenshot of %s on its own node %s without quorum: %v", sb.ID, sb.Node, err)
		}
		if _, err := png.Decode(bytes.NewReader(shot)); err != nil {
			t.Fatal(err)
		}
	}
	local, err := a.Create(ctx, client.CreateRequest{Backend: "gvisor"})
	if err != nil {
		t.Fatalf("create through a without quorum: %v", err)
	}
	if local.Node != "a" {
		t.Fatalf("created on %q without quorum; want a", local.Node)
	}
	sbs = append(sbs, local)

	// Restored: healthy again, and the sandbox made meanwhile is in the
	// catalog, found through c.
	tc.etcd.StartNoWait(0)
	tc.etcd.StartNoWait(1)
	restored := time.Now()
	cc := tc.client("c")
	waitFor(t, "the catalog to converge", func() bool {
		for name := range tc.nodes {
			if tc.health(name) != "ok" {
				return false
			}
		}
		sb, err := cc.Get(ctx, local.ID)
		return err == nil && sb.Node == "a" && sb.State == client.StateRunning
	})
	t.Logf("converged %v after the etcd members were started again", time.Since(restored).Round(100*time.Millisecond))
	driveThrough(t, tc, "c", local)

	// Destroyed through a, each on its own node; nothing is left.
	for _, sb := range sbs {
		if err := a.Destroy(ctx, sb.ID); err != nil {
			t.Fatalf("destroy %s (node %s) through a: %v", sb.ID, sb.Node, err)
		}
	}
	for _, sb := range sbs {
		if p := harness.HostProcesses(sb.ID); len(p) > 0 {
			t.Errorf("sandbox %s (node %s): processes %v left", sb.ID, sb.Node, p)
		}
		if left := backendTraces(tc.dirs[sb.Node], "gvisor", sb.ID); len(left) > 0 {
			t.Errorf("sandbox %s (node %s): %v left", sb.ID, sb.Node, left)
		}
	}
	waitFor(t, "an empty list", func() bool {
		list, err := a.List(ctx, client.ListOptions{State: client.StateRunning})
		return err == nil && len(list) == 0
	})
}

// driveThrough drives sandbox sb through node via: a screenshot (a real
// PNG of the desktop), a file round trip, a click and a command that
// prints the file and where the pointer went (so it ran in that very
// sandbox), and the live view's RFB greeting over the WebSocket.
func driveThrough(t *testing.T, tc *testCluster, via string, sb client.Sandbox) {
	t.Helper()
	ctx := context.Background()
	c := tc.client(via)
	shot, err := c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{Format: "png"})
	if err != nil {
		t.Fatalf("screenshot of %s (node %s) through %s: %v", sb.ID, sb.Node, via, err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil || img.Bounds().Dx() != 1024 || img.Bounds().Dy() != 768 {
		t.Fatalf("screenshot through %s: %v, %v", via, img.Bounds(), err)
	}
	body := []byte("through " + via + " to " + sb.ID)
	if _, err := c.Upload(ctx, sb.ID, "/tmp/cluster.txt", bytes.NewReader(body)); err != nil {
		t.Fatalf("upload through %s: %v", via, err)
	}
	rc, err := c.Download(ctx, sb.ID, "/tmp/cluster.txt")
	if err != nil {
		t.Fatalf("download through %s: %v", via, err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, body) {
		t.Fatalf("download through %s: %q, want %q", via, got, body)
	}
	x, y := 100+int(sb.ID[0])%50, 200+int(sb.ID[1])%50
	if _, err := c.Actions(ctx, sb.ID, client.ClickAt(x, y)); err != nil {
		t.Fatalf("click through %s: %v", via, err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: `cat /tmp/cluster.txt; echo; xdotool getmouselocation --shell | head -2 | tr '\n' ' '`})
	if err != nil {
		t.Fatalf("exec through %s: %v", via, err)
	}
	want := fmt.Sprintf("%s\nX=%d Y=%d ", body, x, y)
	if res.Stdout != want {
		t.Fatalf("exec in %s (node %s) through %s printed %q, want %q", sb.ID, sb.Node, via, res.Stdout, want)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(tc.nodes[via].URL, "http") + "/v1/sandboxes/" + sb.ID + "/vnc"
	ws, _, err := websocket.Dial(wctx, u, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + tc.key}}, Subprotocols: []string{"binary"}})
	if err != nil {
		t.Fatalf("live view of %s (node %s) through %s: %v", sb.ID, sb.Node, via, err)
	}
	defer ws.CloseNow()
	_, greeting, err := ws.Read(wctx)
	if err != nil || !bytes.HasPrefix(greeting, []byte("RFB 003.")) {
		t.Fatalf("live view through %s: %q, %v; want the RFB greeting", via, greeting, err)
	}
}

// heldThrough checks that a volume, which stays on the node that made
// it, is listed, read and used through another node: made through b, it
// is listed and read through a, and a create through a that names it is
// made on b, where a command writes to it. That sandbox also has
// DevTools on: being on b, it is the one CDP reaches through a
// (cdpThrough), a boot saved. (Snapshots across nodes are
// TestClusterItems' and TestClusterProxy's, against a fake node.)
func heldThrough(t *testing.T, tc *testCluster) {
	t.Helper()
	ctx := context.Background()
	a, b := tc.client("a"), tc.client("b")
	if _, err := b.CreateVolume(ctx, "held", 64); err != nil {
		t.Fatalf("create a volume through b: %v", err)
	}
	vols, err := a.ListVolumes(ctx)
	if err != nil || len(vols) != 1 || vols[0].Name != "held" {
		t.Fatalf("volumes listed through a: %+v, %v", vols, err)
	}
	if v, err := a.GetVolume(ctx, "held"); err != nil || v.Name != "held" {
		t.Fatalf("b's volume read through a: %+v, %v", v, err)
	}
	// DevTools is on by default (the CDP proxying below).
	withVol, err := a.Create(ctx, client.CreateRequest{Backend: "gvisor",
		Volumes: []client.VolumeMount{{Name: "held", Path: "/mnt/held"}}})
	if err != nil || withVol.Node != "b" {
		t.Fatalf("create naming b's volume through a: node %q, %v; want b", withVol.Node, err)
	}
	res, err := a.Exec(ctx, withVol.ID, client.ExecRequest{Command: "echo kept > /mnt/held/f && cat /mnt/held/f"})
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("write to the volume through a: %+v, %v", res, err)
	}
	cdpThrough(t, tc, "a", withVol)
	if err := a.Destroy(ctx, withVol.ID); err != nil {
		t.Fatal(err)
	}
	// Deleted through c, which passes it to b.
	if err := tc.client("c").DeleteVolume(ctx, "held"); err != nil {
		t.Fatalf("delete b's volume through c: %v", err)
	}
	if _, err := b.GetVolume(ctx, "held"); !client.IsNotFound(err) {
		t.Errorf("b's volume after its delete through c: %v", err)
	}
}

// mcpThrough drives, through node via, one sandbox of each other node
// by MCP: a command whose output is checked, a screenshot of the
// screen's size.
func mcpThrough(t *testing.T, tc *testCluster, via string, sbs []client.Sandbox) {
	t.Helper()
	d := tc.nodes[via]
	cs := mcpHTTP(t, d)
	done := map[string]bool{via: true}
	for _, sb := range sbs {
		if done[sb.Node] {
			continue
		}
		done[sb.Node] = true
		res := mcpCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.ID, "command": "echo node-$((6*7)) $(hostname)"})
		if got := mcpText(res); !strings.Contains(got, "node-42") {
			t.Errorf("MCP run_command in %s (node %s) through %s: %q", sb.ID, sb.Node, via, got)
		}
		if w, h := mcpPicture(t, mcpCall(t, cs, "screenshot", map[string]any{"sandbox_id": sb.ID})); w != 1024 || h != 768 {
			t.Errorf("MCP screenshot of %s (node %s) through %s: %dx%d", sb.ID, sb.Node, via, w, h)
		}
		t.Logf("MCP reaches %s on node %s through %s", sb.ID, sb.Node, via)
	}
	if len(done) != len(tc.nodes) {
		t.Errorf("MCP reached the sandboxes of %d nodes, want %d", len(done), len(tc.nodes))
	}
}

// cdpThrough drives sb, a sandbox with DevTools on another node than
// via, by CDP through via: the browser's version over the DevTools
// WebSocket that json/version names, which must be via's own address.
func cdpThrough(t *testing.T, tc *testCluster, via string, sb client.Sandbox) {
	t.Helper()
	ctx := context.Background()
	d := tc.nodes[via]
	if sb.Node == via {
		t.Fatalf("CDP through %s to %s, which is on %s itself", via, sb.ID, via)
	}

	// Chromium opens DevTools some seconds after the desktop is ready
	// (more on a loaded host): json/version answers 504 until then.
	var version struct {
		Browser string `json:"Browser"`
		WS      string `json:"webSocketDebuggerUrl"`
	}
	var last string
	if !eventually(90*time.Second, func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.URL+"/v1/sandboxes/"+sb.ID+"/cdp/json/version", nil)
		req.Header.Set("X-API-Key", tc.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		return resp.StatusCode == 200 && json.Unmarshal(body, &version) == nil && strings.Contains(version.Browser, "Chrome")
	}) {
		t.Fatalf("CDP json/version of %s (node %s) through %s: %s", sb.ID, sb.Node, via, last)
	}
	wsURL, err := url.Parse(version.WS)
	if err != nil || wsURL.Host != strings.TrimPrefix(d.URL, "http://") {
		t.Fatalf("CDP WebSocket URL %q of %s through %s: want %s's own host", version.WS, sb.ID, via, via)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ws, _, err := websocket.Dial(wctx, version.WS, &websocket.DialOptions{HTTPHeader: http.Header{"X-API-Key": {tc.key}}})
	if err != nil {
		cancel()
		t.Fatalf("CDP WebSocket of %s (node %s) through %s: %v", sb.ID, sb.Node, via, err)
	}
	if err := ws.Write(wctx, websocket.MessageText, []byte(`{"id":1,"method":"Browser.getVersion"}`)); err != nil {
		t.Fatal(err)
	}
	_, msg, err := ws.Read(wctx)
	ws.CloseNow()
	cancel()
	if err != nil || !bytes.Contains(msg, []byte(`"id":1`)) || !bytes.Contains(msg, []byte("Chrome")) {
		t.Fatalf("CDP Browser.getVersion in %s (node %s) through %s: %s, %v", sb.ID, sb.Node, via, msg, err)
	}
	t.Logf("CDP reaches %s on node %s through %s", sb.ID, sb.Node, via)
}

// TestClusterE2BSDK runs the unmodified e2b and @e2b/desktop SDKs against
// a three-node cluster, configured with node a's URL only: 9 creates
// (CUBICLE_E2E_CLUSTER_SANDBOXES) are placed across the nodes, and E2B's
// control and data planes reach each sandbox through a — the desktop's
// screenshot, a click, a command, files, and the live view (stream.start,
// noVNC's page and its WebSocket over a's TLS listener, host-routed to
// the sandbox's node) — and E2B's Sandbox.list through a, a page at a
// time (4 to a page, 2 below 9 sandboxes: always more than one page),
// lists them all (test/e2b-js/cluster.mjs).
func TestClusterE2BSDK(t *testing.T) {
	needs.Command(t, "node", "npm")
	nodeForSDK(t)
	jsDir := filepath.Join(harness.RepoRoot(), "test", "e2b-js")
	npmCI(t, jsDir)
	caFile, certFile, keyFile := writeTestPKI(t, t.TempDir(), "*."+e2bDomain, e2bDomain)
	tlsAddr := freeAddr(t)
	tc := startClusterNet(t, false, func(name string) []string {
		// Every node routes E2B's sandbox hosts; a, the one the SDKs
		// know, also answers them over TLS.
		args := []string{"--e2b-domain", e2bDomain}
		if name == "a" {
			args = append(args, "--tls-listen", tlsAddr, "--tls-cert", certFile, "--tls-key", keyFile)
		}
		return args
	}, "a", "b", "c")
	checkTLS(t, tlsAddr, caFile)
	env := []string{
		"E2B_API_URL=" + tc.nodes["a"].URL,
		"E2B_SANDBOX_URL=" + tc.nodes["a"].URL,
		"E2B_DOMAIN=" + e2bDomain,
		"E2B_API_KEY=" + tc.key,
		"NODE_EXTRA_CA_CERTS=" + caFile,
		"CUBICLE_TLS_ADDR=" + tlsAddr,
		clusterSandboxesEnv + "=" + strconv.Itoa(clusterSandboxes(t)),
		"NO_COLOR=1",
	}
	out, err := runLogged(t, 12*time.Minute, jsDir, env, "node", "--test", "--test-reporter=spec", "cluster.mjs")
	if err != nil {
		t.Fatalf("node --test cluster.mjs: %v", err)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "CLUSTER_NODES") {
			t.Log(strings.TrimSpace(line))
		}
	}
	for name := range tc.nodes {
		if list, err := tc.client(name).List(context.Background(), client.ListOptions{State: client.StateRunning}); err != nil || len(list) != 0 {
			t.Errorf("after the suite, node %s lists %d running, %v", name, len(list), err)
		}
	}
}

// TestClusterRollingUpgrade upgrades the three nodes one at a time
// (SIGTERM, then the daemon again on its data dir from binaries stamped
// with another version, which the other nodes must then show) while
// agent loops drive as many sandboxes, spread over every node (six; two
// thirds of CUBICLE_E2E_CLUSTER_SANDBOXES, at least 3). Each step is a
// screenshot that must decode, a click and a command whose output must
// show the step and where the click put the pointer (agentStep). A loop
// whose node is down tries the same step on the next node's URL, as
// behind a load balancer. Every answer must be right: a wrong one fails
// the test, and so does an error, unless it is one a restart explains
// (no answer, 502/503/504, lost; judgeStep) and came while a node was
// restarting. No sandbox is lost: every one runs at the end, and every
// loop made a step before the first restart, after each node came back
// and after the last.
func TestClusterRollingUpgrade(t *testing.T) {
	tc := startCluster(t, "a", "b", "c")
	// The release the nodes move to: the same code, stamped with
	// another version, as a build of the next release would be.
	const nextVersion = "next-release"
	next, err := harness.BuildVersion(nextVersion)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(next) })
	ctx := context.Background()
	a := tc.client("a")
	sbs := createAll(t, a, max(3, 2*clusterSandboxes(t)/3), "through a")
	urls := []string{"a", "b", "c"}
	spreadOver(t, sbs, urls...) // every restart is of a node holding a sandbox
	type loopStats struct{ ok, retried, failed int }
	stats := make([]loopStats, len(sbs))
	var (
		mu       sync.Mutex
		restarts restartWindows
		wg       sync.WaitGroup
	)
	lctx, stop := context.WithCancel(ctx)
	// Also when the test fails midway: no loop may log after it ended.
	defer func() { stop(); wg.Wait() }()
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := i % len(urls)
			for step := 0; lctx.Err() == nil; {
				c := client.New(tc.nodes[urls[via]].URL, client.WithAPIKey(tc.key), client.WithTimeout(20*time.Second))
				began := time.Now()
				err := agentStep(lctx, c, sb.ID, step)
				if lctx.Err() != nil {
					return // cut short by the test's end
				}
				verdict := judgeStep(err, restarts.overlaps(began, time.Now()))
				mu.Lock()
				switch verdict {
				case stepDone:
					stats[i].ok++
				case stepRetried:
					stats[i].retried++
					if stats[i].retried <= 3 {
						t.Logf("loop %d (sandbox on %s), step %d through %s during a restart: %v; tried again on the next node", i, sb.Node, step, urls[via], err)
					}
				case stepFailed:
					stats[i].failed++
					if stats[i].failed <= 3 {
						t.Errorf("loop %d (sandbox %s on %s), step %d through %s: %v", i, sb.ID, sb.Node, step, urls[via], err)
					}
				}
				mu.Unlock()
				if err == nil {
					step++
					continue
				}
				via = (via + 1) % len(urls)
				sleepCtx(lctx, 200*time.Millisecond)
			}
		}()
	}
	// stepsMade waits until every loop has made a step since it was
	// called: a condition, where a sleep would only hope for it.
	stepsMade := func(when string) {
		t.Helper()
		mu.Lock()
		since := make([]int, len(stats))
		for i := range stats {
			since[i] = stats[i].ok
		}
		mu.Unlock()
		var now []loopStats
		if !eventually(2*time.Minute, func() bool {
			mu.Lock()
			defer mu.Unlock()
			now = append(now[:0], stats...)
			for i := range stats {
				if stats[i].ok <= since[i] {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("not every agent loop made a step %s within 2 min: %+v", when, now)
		}
	}
	stepsMade("before the first restart")
	for k, name := range urls {
		w := restarts.begin()
		began := time.Now()
		tc.nodes[name].Stop()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := tc.nodes[name].Upgrade(rctx, next)
		cancel()
		if err != nil {
			t.Fatalf("restart %s: %v", name, err)
		}
		other := tc.client(urls[(k+1)%len(urls)])
		waitFor(t, "node "+name+" back in the cluster", func() bool {
			info, err := other.Info(ctx)
			if err != nil || info.Cluster == nil {
				return false
			}
			for _, n := range info.Cluster.Nodes {
				if n.Name == name && n.Started.After(began) && n.Version == nextVersion {
					return true
				}
			}
			return false
		})
		// A lease's grace after one node saw it back: the others' views
		// of it, and calls begun before, settle within it.
		restarts.end(w, clusterLease)
		t.Logf("node %s upgraded to %s in %v", name, nextVersion, time.Since(began).Round(100*time.Millisecond))
		stepsMade("after node " + name + " came back")
	}
	stop()
	wg.Wait()
	var total loopStats
	for _, s := range stats {
		total.ok += s.ok
		total.retried += s.retried
		total.failed += s.failed
	}
	t.Logf("%d agent loops: %d steps done, %d retried on another node during the restarts, %d failed", len(sbs), total.ok, total.retried, total.failed)
	for _, sb := range sbs {
		got, err := tc.client("c").Get(ctx, sb.ID)
		if err != nil || got.State != client.StateRunning || got.Node != sb.Node {
			t.Errorf("after the upgrade, sandbox %s (node %s): %+v, %v", sb.ID, sb.Node, got, err)
		}
	}
}
