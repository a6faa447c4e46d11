package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// backendCaps returns what the daemon of c says sandboxes of backend can
// do, once it has checked that against what they must be able to
// (harness.Expected): a backend that should pause and says it cannot,
// or says it can and should not, fails t, so that no test skips its
// pauses on the daemon's word.
func backendCaps(t *testing.T, c *client.Client, backend string) client.Capabilities {
	t.Helper()
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range info.Backends {
		if b.Name == backend {
			if bad := harness.CheckCapabilities(backend, b.Capabilities); len(bad) > 0 {
				t.Fatalf("GET /v1/info: %s", strings.Join(bad, "; "))
			}
			return b.Capabilities
		}
	}
	t.Fatalf("GET /v1/info lists no backend %s", backend)
	return client.Capabilities{}
}

// TestExpectedCapabilities: the table, not the daemon, says what each
// backend can do; every difference is reported, either way.
func TestExpectedCapabilities(t *testing.T) {
	cannot := "the gvisor backend cannot pause sandboxes on this host: runsc too old"
	for _, tt := range []struct {
		name    string
		backend string
		got     client.Capabilities
		want    []string // substrings of each mismatch, in order; none when they agree
	}{
		{"gvisor as it should be", "gvisor", client.Capabilities{Pause: true, Snapshot: true, Volumes: true}, nil},
		{"gvisor says it cannot pause", "gvisor", client.Capabilities{Snapshot: true, Volumes: true, PauseReason: cannot}, []string{"gvisor should pause and says it cannot: \"" + cannot}},
		{"gvisor says it cannot snapshot", "gvisor", client.Capabilities{Pause: true, Volumes: true, SnapshotReason: "runsc too old"}, []string{"gvisor should snapshot and says it cannot: \"runsc too old"}},
		{"qemu says it cannot pause or snapshot", "qemu", client.Capabilities{Volumes: true}, []string{"qemu should pause", "qemu should snapshot"}},
		{"qemu as it should be", "qemu", client.Capabilities{Pause: true, Snapshot: true, Volumes: true}, nil},
		{"runc cannot pause", "runc", client.Capabilities{Volumes: true, PauseReason: "CRIU 3.17.1 cannot run on this kernel"}, nil},
		{"runc says it can pause", "runc", client.Capabilities{Pause: true, Volumes: true}, []string{"runc says it can pause, which it should not"}},
		{"firecracker says it can snapshot", "firecracker", client.Capabilities{Pause: true, Snapshot: true, Volumes: true}, []string{"firecracker says it can snapshot"}},
		{"firecracker without volumes", "firecracker", client.Capabilities{Pause: true}, []string{"firecracker should attach volumes"}},
		{"a backend the table does not know", "crun", client.Capabilities{}, []string{"backend crun has no expected capabilities"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := harness.CheckCapabilities(tt.backend, tt.got)
			if len(got) != len(tt.want) {
				t.Fatalf("mismatches %q, want %d like %q", got, len(tt.want), tt.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tt.want[i]) {
					t.Errorf("mismatch %d: %q, want it to say %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}
