package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// runCluster is `bench -only-cluster`: three cubicled nodes on one etcd
// (Debian's etcd-server) on this machine. It measures what the extra hop
// costs (a screenshot and a click of a sandbox on node b, asked of b and
// asked of a, alternately), and creates per second through one node with
// the cluster at one node and at three.
func runCluster(imageDir, out string, n, nCreates int) error {
	defer harness.RemoveBuild()
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "cubicle-bench-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	stopEtcd, endpoint, err := startEtcd(tmp)
	if err != nil {
		return err
	}
	defer stopEtcd()
	raw := make([]byte, 16)
	rand.Read(raw)
	key := "bench-" + hex.EncodeToString(raw)
	nodes := map[string]*harness.Daemon{}
	start := func(name string) error {
		d, err := harness.Start(ctx, harness.Options{DataDir: filepath.Join(tmp, name), ImageDir: imageDir, APIKey: key,
			Args: []string{"--cluster-etcd", endpoint, "--node-name", name, "--max-sandboxes", "12"}})
		if err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		nodes[name] = d
		return nil
	}
	defer func() {
		for _, d := range nodes {
			c := client.New(d.URL, client.WithAPIKey(key))
			if sbs, err := c.List(ctx, client.ListOptions{}); err == nil {
				for _, sb := range sbs {
					c.Destroy(ctx, sb.ID)
				}
			}
		}
		for _, d := range nodes {
			d.Stop()
		}
	}()
	cl := func(name string) *client.Client {
		return client.New(nodes[name].URL, client.WithAPIKey(key), client.WithTimeout(5*time.Minute))
	}
	waitNodes := func(k int) error {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			info, err := cl("a").Info(ctx)
			if err == nil && info.Cluster != nil && len(info.Cluster.Nodes) == k && info.Cluster.Degraded == "" {
				return nil
			}
		}
		return fmt.Errorf("the cluster did not show %d nodes", k)
	}

	// Creates per second through a, with a alone.
	if err := start("a"); err != nil {
		return err
	}
	if err := waitNodes(1); err != nil {
		return err
	}
	one, err := createBursts(ctx, cl("a"), nCreates)
	if err != nil {
		return fmt.Errorf("creates on one node: %w", err)
	}
	for _, name := range []string{"b", "c"} {
		if err := start(name); err != nil {
			return err
		}
	}
	if err := waitNodes(3); err != nil {
		return err
	}
	three, err := createBursts(ctx, cl("a"), nCreates)
	if err != nil {
		return fmt.Errorf("creates on three nodes: %w", err)
	}

	// The hop: one sandbox on b, asked of b (local) and of a (proxied).
	var sb client.Sandbox
	for {
		sb, err = cl("a").Create(ctx, client.CreateRequest{Backend: "gvisor"})
		if err != nil {
			return err
		}
		if sb.Node == "b" {
			break
		}
		cl("a").Destroy(ctx, sb.ID)
	}
	local, proxied := cl("b"), cl("a")
	var shotL, shotP, clickL, clickP, getL, getP result
	shotL.name, shotP.name, clickL.name, clickP.name = "screenshot, local", "screenshot, proxied", "click, local", "click, proxied"
	getL.name, getP.name = "GET the sandbox (no agent call), local", "GET the sandbox (no agent call), proxied"
	for i := 0; i < n; i++ {
		// Alternate, so drift hits both alike.
		for _, m := range []struct {
			c    *client.Client
			shot *result
			clk  *result
			get  *result
		}{{local, &shotL, &clickL, &getL}, {proxied, &shotP, &clickP, &getP}} {
			t0 := time.Now()
			if _, err := m.c.Get(ctx, sb.ID); err != nil {
				return err
			}
			m.get.samples = append(m.get.samples, time.Since(t0))
			t0 = time.Now()
			if _, err := m.c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{Format: "png"}); err != nil {
				return err
			}
			m.shot.samples = append(m.shot.samples, time.Since(t0))
			t0 = time.Now()
			if _, err := m.c.Actions(ctx, sb.ID, client.ClickAt(100+i%300, 200)); err != nil {
				return err
			}
			m.clk.samples = append(m.clk.samples, time.Since(t0))
		}
	}
	for _, r := range []result{getL, getP, shotL, shotP, clickL, clickP} {
		log.Printf("%-40s p50 %8s  p95 %8s", r.name, ms(r.pct(.5)), ms(r.pct(.95)))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Cluster: the extra hop and creates (`go run ./test/bench -only-cluster`, %s)\n\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "Three cubicled nodes (own data dirs and ports) on one etcd member, all on this 2-core machine, gvisor, desktop-lite. A sandbox on node b is asked for its record (no agent call: the hop alone), a PNG screenshot (of an unchanged screen) and a click %d times directly (b) and through node a, alternately. Differences below a millisecond are within this machine's noise, where the sandbox's own work varies by more than the hop costs. The hop is loopback HTTP with a pooled connection; across real hosts add the network's round trip.\n\n", n)
	b.WriteString("| call | local p50 | local p95 | through another node p50 | p95 | extra p50 | extra p95 |\n|---|---|---|---|---|---|---|\n")
	for _, p := range [][2]result{{getL, getP}, {shotL, shotP}, {clickL, clickP}} {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %+.2f ms | %+.2f ms |\n", strings.TrimSuffix(p[0].name, ", local"),
			ms(p[0].pct(.5)), ms(p[0].pct(.95)), ms(p[1].pct(.5)), ms(p[1].pct(.95)),
			float64(p[1].pct(.5)-p[0].pct(.5))/1e6, float64(p[1].pct(.95)-p[0].pct(.95))/1e6)
	}
	fmt.Fprintf(&b, "\nCreates through node a, %d at once, each to a ready desktop, %d bursts each (median, and the slowest and fastest burst): with the cluster at one node %s, at three nodes %s (the last burst placed %s). The three nodes share this machine's two cores and its one disk, so three nodes cannot create faster here than one, and three daemons' boots at once contend for them; on three hosts the creates run on three machines.\n",
		nCreates, len(one), rates(nCreates, one), rates(nCreates, three), three[len(three)-1].spread)
	return harness.ReplaceSection(out, "cluster", b.String())
}

// burst is a burst of creates: its wall time and where they went.
type burst struct {
	wall   time.Duration
	spread string
}

// createBursts is three bursts of k creates.
func createBursts(ctx context.Context, c *client.Client, k int) ([]burst, error) {
	var out []burst
	for range 3 {
		b, err := createBurst(ctx, c, k)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// rates is "R creates/s (slowest–fastest)" of bursts of k creates.
func rates(k int, bs []burst) string {
	var r []float64
	for _, b := range bs {
		r = append(r, float64(k)/b.wall.Seconds())
	}
	slices.Sort(r)
	return fmt.Sprintf("%.2f creates/s (%.2f–%.2f)", r[len(r)/2], r[0], r[len(r)-1])
}

// createBurst creates k sandboxes at once through c, then destroys them.
func createBurst(ctx context.Context, c *client.Client, k int) (burst, error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		ids  []string
		per  = map[string]int{}
	)
	t0 := time.Now()
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.Create(ctx, client.CreateRequest{Backend: "gvisor"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			ids = append(ids, sb.ID)
			per[sb.Node]++
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	for _, id := range ids {
		c.Destroy(ctx, id)
	}
	if err := errors.Join(errs...); err != nil {
		return burst{}, err
	}
	log.Printf("%d creates in %v: %v", k, wall, per)
	return burst{wall: wall, spread: fmt.Sprintf("a %d, b %d, c %d", per["a"], per["b"], per["c"])}, nil
}

// startEtcd runs one etcd member in dir on free loopback ports.
func startEtcd(dir string) (stop func(), endpoint string, err error) {
	free := func() string {
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		defer l.Close()
		return l.Addr().String()
	}
	client, peer := "http://"+free(), "http://"+free()
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command("etcd", "--name", "bench", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "bench="+peer)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() }
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(client + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return stop, client, nil
			}
		}
	}
	stop()
	return nil, "", errors.New("etcd did not answer in 30 s")
}
