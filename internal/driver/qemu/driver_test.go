package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

func TestQEMUArgs(t *testing.T) {
	d := New(Config{StateDir: "/var/lib/cubicle/qemu", Machine: "microvm"})
	s := withDefaults(driver.Spec{ID: "abc", Net: &driver.Net{
		TAP: "tap-abc", MAC: "02:00:00:00:00:01",
		Addr: netip.MustParsePrefix("10.88.0.5/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		DNS: []netip.Addr{netip.MustParseAddr("10.88.0.1")},
	}})
	args := strings.Join(d.qemuArgs(s, "/d/abc", "/k", "/i", false), " ")
	for _, want := range []string{
		"-M microvm,", "-accel tcg,thread=multi", "-m 1024", "-smp 2",
		"virtio-blk-device,drive=root,serial=" + vminit.RootSerial,
		"virtserialport,chardev=agent,name=" + vminit.AgentPort,
		"socket,id=agent,server=on,wait=off,path=/d/abc/agent.sock",
		"tap,id=net0,ifname=tap-abc,script=no,downscript=no",
		"virtio-net-device,netdev=net0,mac=02:00:00:00:00:01",
		"ip=10.88.0.5::10.88.0.1:255.255.255.0:cubicle-abc:eth0:off:10.88.0.1",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu args lack %q:\n%s", want, args)
		}
	}
	if strings.Contains(args, "token") {
		t.Errorf("the token must not be on the command line: %s", args)
	}
	d.cfg.Machine = "q35"
	if args := strings.Join(d.qemuArgs(withDefaults(driver.Spec{ID: "abc"}), "/d/abc", "/k", "/i", true), " "); !strings.Contains(args, "virtio-blk-pci") ||
		!strings.Contains(args, "-accel kvm -cpu host") || strings.Contains(args, "netdev") {
		t.Errorf("q35/kvm args: %s", args)
	}
}

func TestIPParamRoundTrip(t *testing.T) {
	n := vminit.Net{Addr: netip.MustParsePrefix("192.168.7.9/20"), Gateway: netip.MustParseAddr("192.168.0.1"),
		DNS: []netip.Addr{netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("8.8.8.8")}, Device: "eth0"}
	p := vminit.IPParam(n, "h")
	got, err := vminit.ParseIPParam(strings.TrimPrefix(p, "ip="))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(n) {
		t.Errorf("round trip of %s: got %+v, want %+v", p, got, n)
	}
}

// TestBoot boots a real VM (TCG here) from the installed desktop image and
// talks to its agent; the end-to-end suite covers the desktop.
func TestBoot(t *testing.T) {
	needs.Root(t)
	needs.Command(t, "qemu-system-x86_64", "qemu-img")
	imageDir := os.Getenv("CUBICLE_IMAGE_DIR")
	if imageDir == "" {
		imageDir = image.DefaultDir
	}
	img, err := image.Lookup(imageDir, "desktop")
	if err != nil {
		needs.Skip(t, "needs the desktop image: %v", err)
	}
	if _, err := image.LookupVM(img.RootFS); err != nil {
		needs.Skip(t, "needs the desktop image's VM form: %v", err)
	}
	agentBin := os.Getenv("CUBICLE_AGENT_BIN")
	if agentBin == "" {
		agentBin = filepath.Join(t.TempDir(), "cubicle-agent")
		build := exec.Command("go", "build", "-o", agentBin, "github.com/cubicle-dev/cubicle/cmd/cubicle-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build agent: %v\n%s", err, out)
		}
	}
	state, err := os.MkdirTemp("/tmp", "qemu-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	d := New(Config{StateDir: state, AgentBinary: agentBin})
	ctx := context.Background()
	if err := d.Available(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("accelerated: %v (%s)", d.Accelerated(ctx), d.AccelReason(ctx))
	t0 := time.Now()
	box, err := d.Create(ctx, driver.Spec{ID: "boot1", Image: img.RootFS, Token: "tok", Width: 800, Height: 600})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("create to agent ready: %s", time.Since(t0).Round(time.Millisecond))
	defer box.Stop(ctx)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return box.DialAgent(ctx)
	}}}
	for i := 0; i < 3; i++ {
		resp, err := hc.Get("http://agent/health")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("health: %s", resp.Status)
		}
	}
	// Adopt from the state, as a restarted daemon would, and talk again.
	st := box.State()
	raw, _ := json.Marshal(st)
	var st2 driver.State
	json.Unmarshal(raw, &st2)
	b2, err := d.Adopt(ctx, st2)
	if err != nil {
		t.Fatal(err)
	}
	c, err := b2.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := box.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, "boot1")); !os.IsNotExist(err) {
		t.Errorf("box directory left: %v", err)
	}
}
