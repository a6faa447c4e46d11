package firecracker

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/drivertest"
	"github.com/cubicle-dev/cubicle/internal/driver/oci"
	"github.com/cubicle-dev/cubicle/internal/metrics"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// TestAutoSkipsFirecrackerThatCannotBoot is the acceptance check:
// with a firecracker binary that answers --version with a supported
// release but cannot boot a VM (a FAKE, see fakeBinaries; the host's KVM
// checks are pointed at a KVM host's facts so that the probe boot is what
// fails), the real manager's "auto" creates the sandbox on gVisor (real
// runsc, the desktop image), and GET /v1/info, answered by the real API
// handler, says why firecracker was passed over.
func TestAutoSkipsFirecrackerThatCannotBoot(t *testing.T) {
	needs.Root(t)
	needs.Runtime(t, "runsc")
	rootfs := drivertest.DesktopImage(t, true)
	agent := drivertest.AgentBinary(t)
	tmp := t.TempDir()
	fc, jailer := fakeBinaries(t, "v1.10.1", "v1.10.1", `echo "Error: FAKE firecracker: Kvm error: failed to set MSR 0x10a" >&2; exit 1`)
	// A short chroot base, as in production (/srv/cubicle): under
	// t.TempDir a VM's socket paths would be too long for a unix socket.
	base, err := os.MkdirTemp("", "fc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	fcd := New(Config{FirecrackerBin: fc, JailerBin: jailer, ChrootBase: base, UID: vmmUID, GID: vmmGID,
		AgentBinary: agent, ProbeImage: func() (string, error) { return rootfs, nil }})
	kvmHost(t, fcd)
	gvisor := oci.New(oci.Config{Runtime: "runsc", StateDir: filepath.Join(tmp, "gvisor"), AgentBinary: agent, DiskMB: 512})
	t.Cleanup(func() {
		if err := gvisor.Cleanup(context.Background(), nil); err != nil {
			t.Errorf("gvisor Cleanup: %v", err)
		}
		if err := fcd.Cleanup(context.Background(), nil); err != nil {
			t.Errorf("firecracker Cleanup: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, err := sandbox.New(ctx, sandbox.Config{
		DataDir: filepath.Join(tmp, "data"), DefaultBackend: "auto",
		Drivers:      map[string]driver.Driver{"firecracker": fcd, "gvisor": gvisor},
		Images:       func(string) (string, error) { return rootfs, nil },
		ReadyTimeout: 2 * time.Minute, Metrics: metrics.New(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })

	sb, err := m.Create(ctx, sandbox.CreateRequest{}, true)
	if err != nil {
		t.Fatalf("auto create: %v", err)
	}
	t.Cleanup(func() { m.Destroy(context.Background(), sb.ID) })
	if sb.Backend != "gvisor" || sb.Isolation != driver.IsolationGVisor {
		t.Errorf("auto chose %s (%s), want gvisor", sb.Backend, sb.Isolation)
	}

	srv := httptest.NewServer(api.New(api.Config{Version: "test"}, m, metrics.New(), nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		Backends []sandbox.BackendInfo `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/info: %d %v", resp.StatusCode, err)
	}
	var got *sandbox.BackendInfo
	for i := range info.Backends {
		if info.Backends[i].Name == "firecracker" {
			got = &info.Backends[i]
		}
	}
	if got == nil {
		t.Fatalf("/v1/info has no firecracker entry: %+v", info.Backends)
	}
	for _, w := range []string{"probe boot", "did not reach the guest's init", "failed to set MSR 0x10a"} {
		if got.Available || !strings.Contains(got.Reason, w) {
			t.Errorf("/v1/info firecracker = %+v, want unavailable with a reason saying %q", *got, w)
		}
	}
	t.Logf("/v1/info firecracker: %+v", *got)
}
