package e2e

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestQEMU runs one sandbox on the qemu backend (TCG on machines without a
// usable KVM, so slowly) through its whole life: the guest runs its own
// kernel, the desktop is screenshotted and changed by an action, the VM
// survives a kill -9 of the daemon and is re-adopted, and destroying it
// leaves nothing behind. One VM, on purpose: under TCG each costs a core.
//
// It is a test of the qemu backend itself: it runs by default and when
// CUBICLE_E2E_BACKEND names qemu, and not when it names only others.
func TestQEMU(t *testing.T) {
	if !slices.Contains(selectedBackends("qemu"), "qemu") {
		t.Logf("%s=%s does not name qemu: nothing to run", backendEnv, os.Getenv(backendEnv))
		return
	}
	needsBackend(t, "qemu")
	d, c := startDaemon(t, "qemu")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{Backend: "qemu", MemoryMB: 1024,
		Resolution: &client.Resolution{Width: 800, Height: 600}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sandbox %s (%s) ready in %s", sb.ID, sb.Isolation, time.Since(t0).Round(time.Millisecond))
	if sb.State != "running" || sb.Backend != "qemu" || sb.Isolation != "vm" {
		t.Fatalf("sandbox = %+v, want running qemu vm", sb)
	}

	// The guest runs its own kernel.
	host, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "uname -r"})
	if err != nil {
		t.Fatal(err)
	}
	guest := strings.TrimSpace(res.Stdout)
	if res.ExitCode != 0 || guest == "" || guest == strings.TrimSpace(string(host)) {
		t.Fatalf("guest uname -r = %q (exit %d), host %q: want the guest's own kernel", guest, res.ExitCode, bytes.TrimSpace(host))
	}
	t.Logf("guest kernel %s, host kernel %s", guest, bytes.TrimSpace(host))

	// The screen is the VM's X display, and an action changes it.
	shot := func() image.Image {
		t.Helper()
		b, err := c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{Format: "png", Cursor: true})
		if err != nil {
			t.Fatal(err)
		}
		im, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("screenshot is not a PNG: %v", err)
		}
		return im
	}
	if b := shot().Bounds(); b.Dx() != 800 || b.Dy() != 600 {
		t.Fatalf("screenshot is %v, want 800x600", b)
	}
	if err := c.Move(ctx, sb.ID, 100, 100); err != nil {
		t.Fatal(err)
	}
	before := shot()
	if err := c.Move(ctx, sb.ID, 400, 300); err != nil {
		t.Fatal(err)
	}
	after := shot()
	if !differsNear(before, after, 100, 100) || !differsNear(before, after, 400, 300) {
		t.Errorf("moving the pointer from 100,100 to 400,300 changed no pixel near either point")
	}

	// kill -9 the daemon: the VM keeps running and is re-adopted.
	d.Kill9()
	if len(hostQEMU(sb.ID)) == 0 {
		t.Fatalf("the VM of %s died with the daemon", sb.ID)
	}
	if err := d.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Command: "echo alive"})
	if err != nil || strings.TrimSpace(res.Stdout) != "alive" {
		t.Fatalf("exec after restart = %+v, %v", res, err)
	}

	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, d, "qemu", sb.ID)
	if p := hostQEMU(sb.ID); len(p) > 0 {
		t.Errorf("qemu of %s still running: %v", sb.ID, p)
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(d.Log), "qemu", sb.ID+"*")); len(m) > 0 {
		t.Errorf("VM files left: %v", m)
	}
}

// hostQEMU returns the pids of QEMU processes of sandbox id.
func hostQEMU(id string) []int {
	var out []int
	for _, pid := range harness.HostProcesses(id) {
		if comm, err := exec.Command("ps", "-o", "comm=", "-p", strconv.Itoa(pid)).Output(); err == nil &&
			strings.HasPrefix(strings.TrimSpace(string(comm)), "qemu") {
			out = append(out, pid)
		}
	}
	return out
}

// differsNear reports whether a and b differ in some pixel within 24 pixels
// of x,y (where a pointer was or went).
func differsNear(a, b image.Image, x, y int) bool {
	for dy := -24; dy <= 24; dy++ {
		for dx := -24; dx <= 24; dx++ {
			r1, g1, b1, _ := a.At(x+dx, y+dy).RGBA()
			r2, g2, b2, _ := b.At(x+dx, y+dy).RGBA()
			if r1 != r2 || g1 != g2 || b1 != b2 {
				return true
			}
		}
	}
	return false
}
