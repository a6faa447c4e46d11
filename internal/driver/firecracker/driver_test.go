package firecracker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/driver"
)

// testImage makes an image directory the way internal/image lays out a VM
// image: rootfs/, disk.ext4 (sparse, with some data), vmlinux, initramfs.
// It returns the rootfs path, which is what the daemon passes as
// Spec.Image.
func testImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	disk, err := os.Create(filepath.Join(dir, "disk.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	if err := disk.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := disk.WriteAt([]byte("superblock"), 1024); err != nil {
		t.Fatal(err)
	}
	if _, err := disk.WriteAt([]byte("data at 32M"), 32<<20); err != nil {
		t.Fatal(err)
	}
	disk.Close()
	for _, f := range []string{"vmlinux", "initramfs"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("\x7fELF fake "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "rootfs")
}

// newFakeDriver returns a driver whose launcher is fake instead of the
// jailer.
func newFakeDriver(t *testing.T, fake *fakeFirecracker, cfg Config) *Driver {
	t.Helper()
	cfg.FirecrackerBin = "/usr/local/bin/firecracker"
	cfg.JailerBin = "/usr/local/bin/jailer"
	if cfg.ChrootBase == "" {
		cfg.ChrootBase = t.TempDir()
	}
	cfg.UID, cfg.GID = os.Getuid(), os.Getgid()
	cfg.StopTimeout = 5 * time.Second
	cfg.Resolve = func(rootfs string) (BootFiles, error) {
		dir := filepath.Dir(rootfs)
		return BootFiles{Kernel: dir + "/vmlinux", Initrd: dir + "/initramfs", Disk: dir + "/disk.ext4"}, nil
	}
	d := New(cfg)
	d.launch = fake.launch
	// The specs' TAPs do not exist: record what the VMM's user is given.
	d.giveTAP = func(netnsPath, name string, uid, gid int) error {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		fake.tapsGiven = append(fake.tapsGiven, fmt.Sprintf("%s %s %d:%d", netnsPath, name, uid, gid))
		return nil
	}
	return d
}

var testLimits = Config{
	DriveLimit:    RateLimit{BytesPerSec: 100 << 20, BurstBytes: 200 << 20, OpsPerSec: 2000},
	NetRxLimit:    RateLimit{BytesPerSec: 12_500_000},
	NetTxLimit:    RateLimit{BytesPerSec: 6_250_000, OpsPerSec: 10_000, BurstOps: 500},
	CgroupVersion: 2,
}

func testSpec(image string) driver.Spec {
	return driver.Spec{
		ID: "fc1",
		Shape: driver.Shape{
			Image: image, VCPUs: 1, MemoryMB: 512,
			Net: &driver.Net{
				Netns: "/run/netns/cubicle-fc1", TAP: "tap-fc1", MAC: "06:00:0a:00:00:02",
				Addr:    netip.MustParsePrefix("10.0.0.2/24"),
				Gateway: netip.MustParseAddr("10.0.0.1"),
				DNS:     []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("9.9.9.9")},
			},
		},
		Session: driver.Session{
			Token: "0123abcd",
			Width: 1024, Height: 768, DPI: 96, StartURL: "https://example.test/a b",
			Env: map[string]string{"LANG": "C.UTF-8"},
		},
	}
}

// TestCreateAPIConversation runs Create and Stop against the recording
// fake and checks every request Firecracker would receive, in order.
func TestCreateAPIConversation(t *testing.T) {
	fake := newFake(t)
	d := newFakeDriver(t, fake, testLimits)
	spec := testSpec(testImage(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	wantArgs, err := KernelArgs(withDefaults(spec), "")
	if err != nil {
		t.Fatal(err)
	}
	// JSON numbers decode as float64.
	want := []request{
		{"GET", "/", nil},
		{"PUT", "/logger", map[string]any{"log_path": "/firecracker.log", "level": "Warning", "show_level": true, "show_log_origin": false}},
		{"PUT", "/metrics", map[string]any{"metrics_path": "/metrics.json"}},
		{"PUT", "/machine-config", map[string]any{"vcpu_count": 1.0, "mem_size_mib": 512.0, "smt": false}},
		{"PUT", "/boot-source", map[string]any{"kernel_image_path": "/vmlinux", "initrd_path": "/initrd", "boot_args": wantArgs}},
		{"PUT", "/drives/rootfs", map[string]any{
			"drive_id": "rootfs", "path_on_host": "/rootfs.ext4", "is_root_device": true, "is_read_only": false,
			"rate_limiter": map[string]any{
				"bandwidth": map[string]any{"size": float64(100 << 20), "refill_time": 1000.0, "one_time_burst": float64(200 << 20)},
				"ops":       map[string]any{"size": 2000.0, "refill_time": 1000.0},
			},
		}},
		{"PUT", "/drives/config", map[string]any{"drive_id": "config", "path_on_host": "/config.img", "is_root_device": false, "is_read_only": true}},
		{"PUT", "/network-interfaces/eth0", map[string]any{
			"iface_id": "eth0", "host_dev_name": "tap-fc1", "guest_mac": "06:00:0a:00:00:02",
			"rx_rate_limiter": map[string]any{"bandwidth": map[string]any{"size": 12_500_000.0, "refill_time": 1000.0}},
			"tx_rate_limiter": map[string]any{
				"bandwidth": map[string]any{"size": 6_250_000.0, "refill_time": 1000.0},
				"ops":       map[string]any{"size": 10_000.0, "refill_time": 1000.0, "one_time_burst": 500.0},
			},
		}},
		{"PUT", "/vsock", map[string]any{"guest_cid": 3.0, "uds_path": "/v.sock"}},
		{"PUT", "/actions", map[string]any{"action_type": "InstanceStart"}},
	}
	if diff := cmp.Diff(want, fake.requests()); diff != "" {
		t.Errorf("API conversation (-want +got):\n%s", diff)
	}

	// The jail holds what the requests name, as the jailed process sees it.
	p := d.paths(spec.ID)
	for _, f := range []string{"/vmlinux", "/initrd", "/rootfs.ext4", "/firecracker.log", "/metrics.json", "/v.sock"} {
		if _, err := os.Stat(p.host(f)); err != nil {
			t.Errorf("jail file %s: %v", f, err)
		}
	}
	blob, _ := os.ReadFile(p.host(configName))
	gc, err := vminit.DecodeConfig(blob)
	if err != nil || gc.Token != spec.Token || gc.Hostname != "cubicle-fc1" || gc.Env["LANG"] != "C.UTF-8" || gc.Env["CUBICLE_START_URL"] != spec.StartURL {
		t.Errorf("config drive: %+v, %v", gc, err)
	}
	if strings.Contains(wantArgs, spec.Token) {
		t.Errorf("token on the kernel command line: %s", wantArgs)
	}
	got, _ := os.ReadFile(p.host(diskName))
	if len(got) != 64<<20 || string(got[1024:1034]) != "superblock" || string(got[32<<20:32<<20+11]) != "data at 32M" {
		t.Errorf("disk copy differs from the image's disk")
	}
	if want := []string{fmt.Sprintf("/run/netns/cubicle-fc1 tap-fc1 %d:%d", os.Getuid(), os.Getgid())}; !cmp.Equal(want, fake.tapsGiven) {
		t.Errorf("TAPs given to the VMM's user: %q, want %q", fake.tapsGiven, want)
	}
	// The jailer's command line as launched.
	if !strings.Contains(strings.Join(fake.args, " "), "--id fc1 ") || !strings.Contains(strings.Join(fake.args, " "), "--netns /run/netns/cubicle-fc1") {
		t.Errorf("jailer args %q", fake.args)
	}

	// The agent channel: hybrid vsock through the fake.
	c, err := b.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("ping\n"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping\n" {
		t.Errorf("echo through vsock: %q, %v", buf, err)
	}
	c.Close()

	n := len(fake.requests())
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]request{{"PUT", "/actions", map[string]any{"action_type": "SendCtrlAltDel"}}}, fake.requests()[n:]); diff != "" {
		t.Errorf("stop conversation (-want +got):\n%s", diff)
	}
	select {
	case <-b.Wait():
	default:
		t.Error("Wait not closed after Stop")
	}
	if _, err := os.Stat(p.JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail %s: %v, want removed", p.JailDir, err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if len(d.liveBoxes()) != 0 {
		t.Errorf("boxes still registered for metrics")
	}
}

// TestCreateNoNetwork: no TAP, no network-interfaces request, no cubicle.ip.
func TestCreateNoNetwork(t *testing.T) {
	fake := newFake(t)
	d := newFakeDriver(t, fake, Config{CgroupVersion: 1})
	spec := testSpec(testImage(t))
	spec.Net = nil
	b, err := d.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	for _, r := range fake.requests() {
		if strings.HasPrefix(r.Path, "/network-interfaces") {
			t.Errorf("unexpected %s %s", r.Method, r.Path)
		}
		if r.Path == "/drives/rootfs" {
			if _, ok := r.Body.(map[string]any)["rate_limiter"]; ok {
				t.Errorf("rate limiter sent though none configured: %v", r.Body)
			}
		}
		if r.Path == "/boot-source" && strings.Contains(r.Body.(map[string]any)["boot_args"].(string), "ip=") {
			t.Errorf("boot args name an address without a network")
		}
	}
	if strings.Contains(strings.Join(fake.args, " "), "--netns") {
		t.Errorf("jailer joins a netns without a network: %q", fake.args)
	}
}

// TestCreateFailureRollsBack: a request Firecracker refuses fails Create
// with Firecracker's fault message, and nothing is left behind.
func TestCreateFailureRollsBack(t *testing.T) {
	fake := newFake(t)
	fake.fail["/drives/rootfs"] = "Unable to open the block device backing file"
	d := newFakeDriver(t, fake, Config{})
	spec := testSpec(testImage(t))
	_, err := d.Create(context.Background(), spec)
	if err == nil || !strings.Contains(err.Error(), "Unable to open the block device backing file") || !strings.Contains(err.Error(), "PUT /drives/rootfs") {
		t.Fatalf("Create: %v, want the fault message of PUT /drives/rootfs", err)
	}
	if _, err := os.Stat(d.paths(spec.ID).JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail left behind: %v", err)
	}
	waitGone(t, fake.proc.Process.Pid)
	if len(d.liveBoxes()) != 0 {
		t.Errorf("failed box registered")
	}
}

// TestAdopt re-attaches a second driver (a restarted daemon) to a running
// VM from its State alone, then stops it.
func TestAdopt(t *testing.T) {
	fake := newFake(t)
	d := newFakeDriver(t, fake, Config{})
	b, err := d.Create(context.Background(), testSpec(testImage(t)))
	if err != nil {
		t.Fatal(err)
	}
	st := b.State()
	if st.Version != stateVersion || st.Driver != "firecracker" {
		t.Fatalf("state %+v", st)
	}
	b.(*box).stopWatch() // the old daemon is gone

	d2 := New(d.cfg)
	d2.launch = fake.launch
	nb, err := d2.Adopt(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-nb.Wait():
		t.Fatal("adopted box reported dead")
	default:
	}
	c, err := nb.DialAgent(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := nb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.paths("fc1").JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail left behind: %v", err)
	}
}

// TestAdoptDead: a VM that died while the daemon was down is adopted as
// dead, and Stop frees its jail.
func TestAdoptDead(t *testing.T) {
	fake := newFake(t)
	d := newFakeDriver(t, fake, Config{})
	b, err := d.Create(context.Background(), testSpec(testImage(t)))
	if err != nil {
		t.Fatal(err)
	}
	st := b.State()
	b.(*box).stopWatch() // the old daemon is gone
	fake.proc.Process.Kill()
	waitGone(t, fake.proc.Process.Pid)
	nb, err := New(d.cfg).Adopt(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-nb.Wait():
	case <-time.After(5 * time.Second):
		t.Fatal("dead VM adopted as alive")
	}
	if err := nb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.paths("fc1").JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail left behind: %v", err)
	}
}

func TestAdoptRejectsForeignPaths(t *testing.T) {
	d := New(Config{ChrootBase: t.TempDir(), FirecrackerBin: "/x/firecracker"})
	for _, data := range []string{
		`{"id":"a1","jail_dir":"/etc","api_socket":"/x","vsock":"/y"}`,
		`{"id":"../a","jail_dir":"/etc"}`,
	} {
		if _, err := d.Adopt(context.Background(), driver.State{Version: 1, Driver: "firecracker", Data: []byte(data)}); err == nil {
			t.Errorf("Adopt(%s) succeeded", data)
		}
	}
	p := d.paths("a1")
	bad := `{"id":"a1","jail_dir":"` + p.JailDir + `","api_socket":"` + p.host(apiSockName) + `","vsock":"` + p.host(vsockName) + `","cgroups":["/etc"]}`
	if _, err := d.Adopt(context.Background(), driver.State{Version: 1, Driver: "firecracker", Data: []byte(bad)}); err == nil {
		t.Errorf("Adopt with a foreign cgroup succeeded")
	}
}

func TestCleanupRemovesOrphans(t *testing.T) {
	d := New(Config{ChrootBase: t.TempDir(), FirecrackerBin: "/x/firecracker"})
	for _, id := range []string{"keep1", "orphan1"} {
		if err := os.MkdirAll(filepath.Join(d.paths(id).Root), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Cleanup(context.Background(), map[string]bool{"keep1": true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.paths("keep1").JailDir); err != nil {
		t.Errorf("kept jail: %v", err)
	}
	if _, err := os.Stat(d.paths("orphan1").JailDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan jail: %v, want removed", err)
	}
}

func TestRateLimitModel(t *testing.T) {
	if (RateLimit{}).model() != nil {
		t.Error("zero RateLimit gives a limiter")
	}
	m := RateLimit{OpsPerSec: 5}.model()
	if m.Bandwidth != nil || m.Ops.Size != 5 || m.Ops.RefillTime != 1000 || m.Ops.OneTimeBurst != 0 {
		t.Errorf("ops-only limiter: %+v", m.Ops)
	}
}

// TestImageFilesNoVM: an image without a VM form is refused with
// image's reason.
func TestImageFilesNoVM(t *testing.T) {
	img := filepath.Join(t.TempDir(), "rootfs")
	os.Mkdir(img, 0o755)
	if _, err := New(Config{}).resolve(img); err == nil || !strings.Contains(err.Error(), "no VM form") {
		t.Errorf("resolve of an image without a disk: %v", err)
	}
	d := New(Config{Resolve: func(string) (BootFiles, error) {
		return BootFiles{Kernel: "/nonexistent/vmlinux", Disk: "/nonexistent/disk.ext4"}, nil
	}})
	if _, err := d.resolve(img); err == nil || !strings.Contains(err.Error(), "kernel") {
		t.Errorf("resolve with a missing kernel: %v", err)
	}
}

func TestMemoryLimit(t *testing.T) {
	d := New(Config{})
	if got, want := d.memoryLimit(512, 2), "memory.max="+strconv.Itoa((512+DefaultMemoryOverheadMB)<<20); got != want {
		t.Errorf("v2: %q, want %q", got, want)
	}
	if got := d.memoryLimit(512, 1); !strings.HasPrefix(got, "memory.limit_in_bytes=") {
		t.Errorf("v1: %q", got)
	}
	if got := New(Config{MemoryOverheadMB: -1}).memoryLimit(512, 2); got != "" {
		t.Errorf("disabled: %q", got)
	}
}

// waitGone waits until pid has exited.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := processStart(pid); !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stand-in VMM pid %d still alive", pid)
		}
	}
}

// TestStopLeavesNothing: Stop of a VM whose guest ignores Ctrl-Alt-Del
// kills the VMM — a real process pivot_root'ed into its jail, as the
// jailer leaves Firecracker — and leaves nothing of it on the host: no
// process in its jail or by its pid, no jail (strays, which the
// real-Firecracker test checks too).
func TestStopLeavesNothing(t *testing.T) {
	fake := newFake(t)
	fake.pivot, fake.ignoreCtrlAltDel = true, true
	d := newFakeDriver(t, fake, Config{})
	d.cfg.StopTimeout = 200 * time.Millisecond
	spec := testSpec(testImage(t))
	b, err := d.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	data := b.(*box).data
	if s := d.strays(data); len(s) == 0 {
		t.Fatal("strays of a running VM: none; the check sees nothing")
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := d.strays(data); len(s) > 0 {
		t.Errorf("left after Stop: %s", strings.Join(s, "; "))
	}
}

// TestSlowFirecracker: requests Firecracker takes its time over — drives
// opened on a loaded host, an InstanceStart that loads a large kernel and
// sets up guest memory — succeed within Create's context; the SDK client
// used before gave each request 500 ms (drives 250 ms) whatever the
// caller's deadline.
func TestSlowFirecracker(t *testing.T) {
	fake := newFake(t)
	fake.delay = map[string]time.Duration{"/drives/rootfs": 400 * time.Millisecond, "/actions": 1200 * time.Millisecond}
	d := newFakeDriver(t, fake, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := d.Create(ctx, testSpec(testImage(t)))
	if err != nil {
		t.Fatalf("Create against a slow Firecracker: %v", err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
