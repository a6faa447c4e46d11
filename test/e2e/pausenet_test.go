package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/netpool/netpooltest"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestPauseResumeNetwork pauses and resumes a networked sandbox with a
// server of the user's listening on all its addresses, and checks that
// after the resume the sandbox still has its address and default route
// and the same server answers, from inside the sandbox (its own address)
// and from the host. runsc takes the address off the namespace's
// interface when the box starts, and a restore reads the interfaces
// again: without the driver giving it back, a resumed gVisor sandbox had
// no network at all. It runs in a network namespace the test made.
func TestPauseResumeNetwork(t *testing.T) {
	if !netpooltest.InOwnNetns(t) {
		return
	}
	needs.Command(t, "nft")
	for i, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			if exp, _ := harness.Expected(backend); !exp.Pause {
				t.Skipf("%s does not pause", backend)
			}
			_, c := startDaemonArgs(t, backend, "--net", "--net-bridge", fmt.Sprintf("cbpn%d", i), "--net-cidr", fmt.Sprintf("10.89.%d.0/24", 90+i), "--net-dns", "192.0.2.53")
			ctx := context.Background()
			req := client.CreateRequest{Backend: backend}
			if isVM(backend) {
				req.MemoryMB = 768
			}
			sb, err := c.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			sh := func(s string) string {
				t.Helper()
				r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"bash", "-c", s}, TimeoutSeconds: 60})
				if err != nil {
					t.Fatal(err)
				}
				return strings.TrimSpace(r.Stdout)
			}
			sh("(setsid python3 -m http.server 9000 --bind 0.0.0.0 >/dev/null 2>&1 &); for i in $(seq 300); do (echo > /dev/tcp/127.0.0.1/9000) 2>/dev/null && break; sleep 0.1; done")
			self := "timeout 5 bash -c 'exec 3<>/dev/tcp/" + sb.IP + "/9000' 2>/dev/null && echo open || echo closed"
			route := `awk '$2 == "00000000" {print $1}' /proc/net/route`
			check := func(when string) {
				t.Helper()
				if got := sh(self); got != "open" {
					t.Errorf("%s: the sandbox reaching its own address %s:9000: %s", when, sb.IP, got)
				}
				if got := sh(route); got != "eth0" {
					t.Errorf("%s: the sandbox's default route is on %q, want eth0", when, got)
				}
				if err := netpooltest.Dial("", sb.IP+":9000"); err != nil {
					t.Errorf("%s: the host reaching the sandbox's server: %v", when, err)
				}
			}
			check("before the pause")
			if _, err := c.Pause(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
				t.Fatal(err)
			}
			check("after the resume")
		})
	}
}
