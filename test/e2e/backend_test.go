package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	cimage "github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// backendEnv names the backends every end-to-end test runs on, comma
// separated (`make e2e BACKEND=qemu` sets it). Unset, each test runs on its
// own defaults: what `make test` affords on a 2-core machine without KVM.
const backendEnv = "CUBICLE_E2E_BACKEND"

// selectedBackends is what a test runs on: the backends backendEnv names,
// else the test's defaults.
func selectedBackends(defaults ...string) []string {
	if b := os.Getenv(backendEnv); b != "" {
		var out []string
		for _, n := range strings.Split(b, ",") {
			if n = strings.TrimSpace(n); n != "" && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		return out
	}
	return defaults
}

// isVM reports whether backend runs each sandbox in a virtual machine.
func isVM(backend string) bool { return backend == "qemu" || backend == "firecracker" }

// isolationOf is the isolation a sandbox of backend must report.
func isolationOf(backend string) string {
	switch backend {
	case "gvisor":
		return "gvisor"
	case "runc":
		return "namespace"
	}
	return "vm"
}

// needsBackend gates t on what backend needs on this host: the runtime or
// the VMM and the image's VM form. Under CUBICLE_REQUIRE_E2E=1 a missing
// piece fails the test.
func needsBackend(t *testing.T, backend string) {
	t.Helper()
	needs.Root(t)
	switch backend {
	case "gvisor":
		needs.Runtime(t, "runsc")
	case "runc":
		needs.Runtime(t, "runc")
	case "qemu", "firecracker":
		if backend == "qemu" {
			needs.Command(t, "qemu-system-x86_64", "qemu-img")
		} else {
			needs.Command(t, envOrDefault("CUBICLE_FIRECRACKER_BIN", "firecracker"), envOrDefault("CUBICLE_JAILER_BIN", "jailer")) //depcheck:runs firecracker jailer
			if _, err := os.Stat("/dev/kvm"); err != nil {
				needs.Skip(t, "firecracker needs /dev/kvm: %v", err)
			}
		}
		img, err := cimage.Lookup(imageDir(), "desktop-lite")
		if err == nil {
			_, err = cimage.LookupVM(img.RootFS)
		}
		if err != nil {
			needs.Skip(t, "needs the desktop image's VM form (rebuild it: cubicle image build desktop): %v", err)
		}
	default:
		t.Fatalf("unknown backend %q (in %s?)", backend, backendEnv)
	}
}

func envOrDefault(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// autoOrder is the order in which "auto" prefers backends (README,
// "Backends"): hardware isolation first.
var autoOrder = []string{"firecracker", "qemu", "gvisor", "runc"}

// TestBackendChoice checks on a real daemon that cubicle never silently
// downgrades. Its firecracker is pointed at a binary that does not exist,
// so it cannot run on any host: asking for it fails with 503 and the very
// reason /v1/info gives, and makes nothing on the host. A create under
// "auto" gets the first backend that /v1/info says is usable without
// caveat (an emulated QEMU has one) and reports that backend's isolation,
// which the sandbox's kernel confirms.
func TestBackendChoice(t *testing.T) {
	needs.Root(t)
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	dataDir, err := os.MkdirTemp("", "cubicle-e2e-choice-")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	d, err := harness.Start(sctx, harness.Options{DataDir: dataDir, ImageDir: imageDir(), DefaultBackend: "auto",
		Env: []string{"CUBICLE_FIRECRACKER_BIN=/nonexistent/firecracker"}})
	cancel()
	if err != nil {
		os.RemoveAll(dataDir)
		t.Fatal(err)
	}
	c := client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(5*time.Minute))
	t.Cleanup(func() {
		if sbs, err := c.List(ctx, client.ListOptions{}); err == nil {
			for _, sb := range sbs {
				c.Destroy(ctx, sb.ID)
			}
		}
		d.Stop()
		if t.Failed() {
			log, _ := os.ReadFile(d.Log)
			t.Logf("cubicled log (tail):\n%s", tail(string(log), 40))
		}
		os.RemoveAll(dataDir)
	})
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]client.Backend{}
	for _, b := range info.Backends {
		byName[b.Name] = b
	}
	fc := byName["firecracker"]
	if fc.Available || fc.Reason == "" {
		t.Fatalf("/v1/info: firecracker with a missing binary is %+v, want unavailable with a reason", fc)
	}

	// Asked for by name: 503 with the reason, no fallback, nothing made.
	before := snapshotHost(dataDir, d.Pid())
	req, _ := http.NewRequest("POST", d.URL+"/v1/sandboxes", strings.NewReader(`{"backend": "firecracker"}`))
	req.Header.Set("X-API-Key", d.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Code, Message string }
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || body.Error.Code != "unavailable" ||
		!strings.Contains(body.Error.Message, "firecracker") || !strings.Contains(body.Error.Message, fc.Reason) {
		t.Errorf("create on firecracker: %d %+v (%v), want 503 unavailable naming firecracker and saying %q", resp.StatusCode, body, err, fc.Reason)
	}
	if sbs, err := c.List(ctx, client.ListOptions{}); err != nil || len(sbs) > 0 {
		t.Errorf("after the refused create: sandboxes %+v %v, want none", sbs, err)
	}
	if added := snapshotHost(dataDir, d.Pid()).newSince(before); len(added) > 0 {
		t.Errorf("the refused create left on the host:\n%s", strings.Join(added, "\n"))
	}

	// auto: the first backend usable without caveat, and its isolation.
	want := ""
	for _, n := range autoOrder {
		if b := byName[n]; b.Available && b.Reason == "" {
			want = n
			break
		}
	}
	if want == "" {
		needs.Skip(t, "no backend is usable here: %+v", info.Backends)
	}
	needsBackend(t, want)
	sb, err := c.Create(ctx, client.CreateRequest{Resolution: &client.Resolution{Width: 800, Height: 600}})
	if err != nil {
		t.Fatalf("create under auto: %v", err)
	}
	t.Logf("auto chose %s (%s); /v1/info: %+v", sb.Backend, sb.Isolation, info.Backends)
	if sb.Backend != want || sb.Isolation != byName[want].Isolation || sb.Isolation != isolationOf(want) {
		t.Errorf("auto gave %s (%s), want %s (%s, as /v1/info says)", sb.Backend, sb.Isolation, want, byName[want].Isolation)
	}
	assertIsolation(t, c, sb.ID, sb.Isolation)
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, d, sb.Backend, sb.ID)
}
