package e2e

import (
	"context"
	"encoding/json"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	bolt "go.etcd.io/bbolt"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/oci"
	"github.com/cubicle-dev/cubicle/internal/driver/qemu"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// forkCount is how many forks TestFork makes of its parent in one call
// (CUBICLE_E2E_FORKS, default 5; the E2B suite's fork test reads it too,
// with its own default of 2). Two already show each fork to be its own —
// machine-id, hostname, random bytes, address and agent token differ
// between the forks as well as from the parent — so make test asks for 2;
// the default's five start from one parent's stream at once, as make e2e
// keeps. Fewer than 2 would compare no fork with another: 2 is the least
// it runs.
func forkCount() int {
	if n, err := strconv.Atoi(os.Getenv("CUBICLE_E2E_FORKS")); err == nil && n > 0 {
		return max(n, 2)
	}
	return 5
}

// TestFork forks a logged-in desktop forkCount times (5 unless
// CUBICLE_E2E_FORKS says) in one call, on real QEMU and real gVisor, and
// checks what makes each fork itself: every fork shows the logged-in page its parent
// showed, and reloads it from the site (logged in, from its own address);
// the forks' machine-ids, hostnames and random numbers differ; and, read
// from the daemon's store and tried on the boxes' agent channels
// directly, each fork's agent token is refused by every other fork and by
// the parent. The parent runs on. On runc a fork and a snapshot are
// refused as not supported, with the reason, and make nothing.
func TestFork(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Command(t, "nft")
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	site := serveLoginSite(t)

	for i, backend := range selectedBackends("qemu", "gvisor", "runc") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			d, c := startDaemonArgs(t, backend, "--net", "--net-bridge", "cbfork"+string(rune('0'+i)), "--net-cidr", "10.91."+string(rune('0'+i))+".0/24")
			if backend == "runc" {
				testForkRefused(t, c, backend)
				return
			}
			testFork(t, d, c, site, backend)
		})
	}
}

func testForkRefused(t *testing.T, c *client.Client, backend string) {
	bg := context.Background()
	sb, err := c.Create(bg, client.CreateRequest{Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Fork(bg, sb.ID, 2)
	if client.ErrorCode(err) != client.CodeNotSupported || !strings.Contains(err.Error(), "CRIU") {
		t.Fatalf("fork on %s: %v, want not_supported with the reason (CRIU)", backend, err)
	}
	if n := len(mustList(t, c)); n != 1 {
		t.Errorf("the refused fork left %d sandboxes, want the parent alone", n)
	}
	// Snapshots too: refused as such, with nothing kept.
	if _, err := c.CreateSnapshot(bg, sb.ID, client.SnapshotOptions{Name: "refused"}); client.ErrorCode(err) != client.CodeNotSupported {
		t.Errorf("snapshot on %s: %v, want not_supported", backend, err)
	}
	if list, err := c.ListSnapshots(bg, ""); err != nil || len(list) != 0 {
		t.Errorf("after a refused snapshot: %+v, %v; want none", list, err)
	}
}

func testFork(t *testing.T, d *harness.Daemon, c *client.Client, site *loginSite, backend string) {
	bg := context.Background()
	parent, err := c.Create(bg, client.CreateRequest{Backend: backend, MemoryMB: 1536, StartURL: "http://192.0.2.1:8080/login",
		Network: &client.Network{Allow: []string{"192.0.2.1/32"}}})
	if err != nil {
		t.Fatal(err)
	}
	shows := func(id string, want color.RGBA, what string) {
		t.Helper()
		vmShows(t, c, id, want, what)
	}
	shows(parent.ID, loginBlue, "the parent's login page")
	if _, err := c.Actions(bg, parent.ID, client.ClickAt(512, 400)); err != nil {
		t.Fatal(err)
	}
	shows(parent.ID, inGreen, "the parent, logged in")

	count := forkCount()
	t0 := time.Now()
	forks, err := c.Fork(bg, parent.ID, count)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("%d forks of a logged-in %s desktop in %v", count, backend, time.Since(t0).Round(time.Millisecond))
	if len(forks) != count {
		t.Fatalf("%d forks, want %d", len(forks), count)
	}
	ids := map[string]bool{parent.ID: true}
	ips := map[string]bool{parent.IP: true}
	machineIDs := map[string]string{}
	randoms := map[string]string{}
	sh := func(id, script string) string {
		t.Helper()
		res, err := c.Exec(bg, id, client.ExecRequest{Argv: []string{"sh", "-c", script}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q in %s: %+v, %v", script, id, res, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	parentMachineID := sh(parent.ID, "cat /etc/machine-id")
	for _, f := range forks {
		if f.State != client.StateRunning || ids[f.ID] || f.IP == "" || ips[f.IP] {
			t.Errorf("fork %+v: want running, with an id and an address of its own", f)
		}
		ids[f.ID], ips[f.IP] = true, true
		// The page the parent showed, as it was.
		shows(f.ID, inGreen, "fork "+f.ID)
		out := strings.Fields(sh(f.ID, "cat /etc/machine-id; hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"))
		if len(out) != 3 {
			t.Fatalf("fork %s printed %q", f.ID, out)
		}
		if want := "cubicle-" + f.ID[:12]; out[1] != want {
			t.Errorf("fork %s has hostname %q, want %q", f.ID, out[1], want)
		}
		if out[0] == parentMachineID {
			t.Errorf("fork %s kept the parent's machine-id", f.ID)
		}
		if other, dup := machineIDs[out[0]]; dup {
			t.Errorf("forks %s and %s share machine-id %s", f.ID, other, out[0])
		}
		machineIDs[out[0]] = f.ID
		if other, dup := randoms[out[2]]; dup {
			t.Errorf("forks %s and %s read the same random bytes %s", f.ID, other, out[2])
		}
		randoms[out[2]] = f.ID
	}
	// Each fork holds its own address, not the parent's, and reaches
	// the site with it, logged in (the site sees the host's address:
	// egress is masqueraded).
	// (gVisor has no /proc/net/fib_trie: there, the address the box
	// sends from to the site.)
	local := func(id string) string {
		return sh(id, `if [ -e /proc/net/fib_trie ]; then awk '/32 host LOCAL/ {print prev} {prev=$2}' /proc/net/fib_trie | sort -u | tr '\n' ' '; `+
			`else python3 -c "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('192.0.2.1', 8080)); print(s.getsockname()[0])"; fi`)
	}
	for _, f := range forks {
		addrs := strings.Fields(local(f.ID))
		if !slices.Contains(addrs, f.IP) || slices.Contains(addrs, parent.IP) {
			t.Errorf("fork %s (%s) holds addresses %v; want its own and not the parent's (%s)", f.ID, f.IP, addrs, parent.IP)
		}
		site.mu.Lock()
		n := len(site.seen)
		site.mu.Unlock()
		if _, err := c.Actions(bg, f.ID, client.PressKey("F5")); err != nil {
			t.Fatal(err)
		}
		ok := eventually(90*time.Second, func() bool {
			site.mu.Lock()
			defer site.mu.Unlock()
			return slices.Contains(site.seen[n:], "GET / in")
		})
		if !ok {
			site.mu.Lock()
			t.Errorf("fork %s (%s): a reload did not reach the site logged in: %v", f.ID, f.IP, site.seen[n:])
			site.mu.Unlock()
		}
	}
	if addrs := strings.Fields(local(parent.ID)); !slices.Contains(addrs, parent.IP) {
		t.Errorf("the parent holds %v, want its address %s still", addrs, parent.IP)
	}
	// The parent runs on.
	shows(parent.ID, inGreen, "the parent after the fork")
	if got := sh(parent.ID, "cat /etc/machine-id"); got != parentMachineID {
		t.Errorf("the parent's machine-id changed to %s", got)
	}

	// Tokens, checked on the agents themselves: the daemon is stopped
	// (its sandboxes run on), its store read, and every token tried on
	// every VM's agent channel.
	dataDir := filepath.Dir(d.Log)
	d.Kill9()
	tokens, states := storedAgents(t, filepath.Join(dataDir, "cubicle.db"))
	var dr driver.Driver = qemu.New(qemu.Config{StateDir: filepath.Join(dataDir, "qemu")})
	if backend == "gvisor" {
		dr = oci.New(oci.Config{Runtime: "runsc", StateDir: filepath.Join(dataDir, "oci", "gvisor")})
	}
	all := append([]string{parent.ID}, keys(forks)...)
	for _, id := range all {
		box, err := dr.Adopt(bg, states[id])
		if err != nil {
			t.Fatalf("adopt %s: %v", id, err)
		}
		for _, other := range all {
			ac := agentclient.New(box.DialAgent, tokens[other])
			ictx, cancel := context.WithTimeout(bg, 20*time.Second)
			_, err := ac.Desktop.Info(ictx, connect.NewRequest(&desktoppb.InfoRequest{}))
			cancel()
			ac.Close()
			switch {
			case other == id && err != nil:
				t.Errorf("%s refuses its own token: %v", id, err)
			case other != id && connect.CodeOf(err) != connect.CodeUnauthenticated:
				t.Errorf("%s with the token of %s: %v, want unauthenticated", id, other, err)
			}
		}
	}
	rctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	if err := d.Restart(rctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range all {
		if err := c.Destroy(bg, id); err != nil {
			t.Fatal(err)
		}
		assertNoTrace(t, d, backend, id)
	}
}

// vmShows waits until VM sandbox id's screen shows the login site's
// colour want (at 512,600), and fails the test when it does not.
func vmShows(t *testing.T, c *client.Client, id string, want color.RGBA, what string) {
	t.Helper()
	there := func() bool { return near(pixel(t, c, id, 512, 600), want) }
	ok := eventually(90*time.Second, there)
	if ws, _ := c.Windows(context.Background(), id); !ok && len(ws) > 0 && strings.HasPrefix(ws[0].Title, "Untitled") {
		// Chromium under TCG at times loses its start navigation
		// (README, "Known bug under TCG"): a reload, as a user would.
		t.Logf("%s: a blank Untitled tab after 90 s; reloading once", what)
		if _, err := c.Actions(context.Background(), id, client.PressKey("F5")); err != nil {
			t.Fatal(err)
		}
		ok = eventually(90*time.Second, there)
	}
	if !ok {
		t.Fatalf("%s: the screen shows %v, want %v", what, pixel(t, c, id, 512, 600), want)
	}
}

func keys(sbs []client.Sandbox) []string {
	out := make([]string, len(sbs))
	for i, s := range sbs {
		out[i] = s.ID
	}
	return out
}

// storedAgents reads each sandbox's agent token and driver state from a
// stopped daemon's store.
func storedAgents(t *testing.T, path string) (map[string]string, map[string]driver.State) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tokens, states := map[string]string{}, map[string]driver.State{}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("sandboxes")).ForEach(func(k, v []byte) error {
			var r struct {
				Token  string `json:"token"`
				Driver struct {
					V    int             `json:"v"`
					Name string          `json:"name"`
					Data json.RawMessage `json:"data"`
				} `json:"driver"`
			}
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			tokens[string(k)] = r.Token
			states[string(k)] = driver.State{Version: r.Driver.V, Driver: r.Driver.Name, Data: r.Driver.Data}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return tokens, states
}
