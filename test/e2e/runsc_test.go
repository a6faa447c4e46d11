package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// pinnedRunsc is the gVisor version deploy/runsc/go.mod pins, read from
// the file (not from the daemon, whose word this checks).
func pinnedRunsc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/runsc/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*gvisor\.dev/gvisor (v0\.0\.0-\d{14}-[0-9a-f]{12})\b`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("deploy/runsc/go.mod pins no gvisor.dev/gvisor version")
	}
	return string(m[1])
}

// TestGVisorRuntime checks that the gvisor backend runs the pinned runsc:
// /v1/info and `cubicle info` name it, the processes of a running gVisor
// sandbox are that binary (their /proc/PID/exe, not the daemon's word),
// and a daemon pointed at Debian's runsc of 2022 refuses the backend with
// the reason, and its creates with 503.
func TestGVisorRuntime(t *testing.T) {
	needsBackend(t, "gvisor")
	pinned := pinnedRunsc(t)
	binary := filepath.Join(filepath.Dir(needs.RunscPath), "runsc-"+pinned)
	d, c := startDaemon(t, "gvisor")
	ctx := context.Background()
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gv client.Backend
	for _, b := range info.Backends {
		if b.Name == "gvisor" {
			gv = b
		}
	}
	if !gv.Available || gv.Runtime == nil || gv.Runtime.Name != "runsc" || gv.Runtime.Path != needs.RunscPath || gv.Runtime.Version != pinned {
		t.Errorf("/v1/info gvisor: %+v runtime %+v, want available, runsc %s at %s", gv, gv.Runtime, pinned, needs.RunscPath)
	}

	bin, err := harness.Build()
	if err != nil {
		t.Fatal(err)
	}
	cli := exec.Command(filepath.Join(bin, "cubicle"), "info", "--url", d.URL) //depcheck:built
	cli.Env = append(os.Environ(), "CUBICLE_API_KEY="+d.APIKey)
	out, err := cli.CombinedOutput()
	if err != nil {
		t.Fatalf("cubicle info: %v\n%s", err, out)
	}
	row := ""
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "gvisor" {
			row = line
		}
	}
	if !strings.Contains(row, "runsc "+pinned) {
		t.Errorf("cubicle info's gvisor row %q does not name runsc %s:\n%s", strings.TrimSpace(row), pinned, out)
	}

	sb, err := c.Create(ctx, client.CreateRequest{Backend: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	exes := map[string]int{}
	for _, pid := range harness.HostProcesses(sb.ID) {
		if exe, err := os.Readlink(filepathProc(pid, "exe")); err == nil {
			exes[exe]++
		}
	}
	if exes[binary] == 0 {
		t.Errorf("no host process of gVisor sandbox %s runs %s; they run %v", sb.ID, binary, exes)
	}
	for exe := range exes {
		if strings.HasSuffix(exe, "/runsc") || (strings.Contains(filepath.Base(exe), "runsc") && exe != binary) {
			t.Errorf("a host process of sandbox %s runs %s, not the pinned %s", sb.ID, exe, binary)
		}
	}
	t.Logf("sandbox %s: host processes by binary %v", sb.ID, exes)

	// Root in the sandbox reaches the agent's /proc/1, as under runc:
	// its console is where E2B's sandbox logs come from. The agent
	// started the desktop's programs as another user, which leaves a
	// process undumpable under this runsc unless it says otherwise
	// (account.KeepDumpable).
	if r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "echo cubicle-console-check > /proc/1/fd/1 && readlink /proc/1/exe"}); err != nil || r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "/opt/cubicle/bin/cubicle-agent" {
		t.Errorf("root writing the agent's console (/proc/1/fd/1): %+v %v", r, err)
	}

	// Debian's runsc (/usr/bin/runsc, 20221219): refused, with the reason.
	old := "/usr/bin/runsc"
	if _, err := os.Stat(old); err != nil {
		needs.Skip(t, "Debian's runsc is not at %s (scripts/deps.sh installs it): %v", old, err)
	}
	_, oc := startDaemonArgs(t, "gvisor", "--runsc", old)
	info, err = oc.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range info.Backends {
		if b.Name == "gvisor" && (b.Available || !strings.Contains(b.Reason, "older than") || b.Runtime == nil || !strings.Contains(b.Runtime.Version, "20221219")) {
			t.Errorf("gvisor with Debian's runsc: %+v runtime %+v, want unavailable, saying it is older than the oldest cubicle runs", b, b.Runtime)
		}
	}
	if _, err := oc.Create(ctx, client.CreateRequest{Backend: "gvisor"}); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "older than") {
		t.Errorf("create on gvisor with Debian's runsc: %v, want 503 saying the runsc is too old", err)
	}
	if sbs, err := oc.List(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Errorf("after the refused create: %+v %v, want no sandbox", sbs, err)
	}
}

func filepathProc(pid int, name string) string {
	return filepath.Join("/proc", strconv.Itoa(pid), name)
}
