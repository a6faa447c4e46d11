package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/client"
	cimage "github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/rfb"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// assertIsolation checks that sandbox id runs under the isolation it
// reports, from what its kernel shows: a namespace sandbox shares the
// host's kernel (same boot ID), gVisor's Sentry announces itself in its
// kernel log, and a VM boots a kernel of its own (another boot ID, and not
// gVisor's).
func assertIsolation(t *testing.T, c *client.Client, id, isolation string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// gVisor has no boot_id: the line is empty there.
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: "echo $(cat /proc/sys/kernel/random/boot_id 2>/dev/null); dmesg 2>/dev/null | head -n 20; true"})
	if err != nil {
		t.Fatalf("%s: read its kernel: %v", id, err)
	}
	host, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	guestBoot, klog, _ := strings.Cut(res.Stdout, "\n")
	sameKernel := strings.TrimSpace(guestBoot) == strings.TrimSpace(string(host))
	gvisor := strings.Contains(klog, "gVisor")
	var ok bool
	switch isolation {
	case "namespace":
		ok = sameKernel && !gvisor
	case "gvisor":
		ok = gvisor && !sameKernel
	case "vm":
		ok = !sameKernel && !gvisor && strings.TrimSpace(guestBoot) != ""
	}
	if !ok {
		t.Errorf("%s reports isolation %q, but inside: boot id %q (host %q), kernel log:\n%s",
			id, isolation, strings.TrimSpace(guestBoot), strings.TrimSpace(string(host)), klog)
	}
}

// imageFile reads path from the desktop image as backend boots it: the
// rootfs directory for the OCI backends, the ext4 disk (read with debugfs,
// which opens it read-only) for VMs. ok is false when the file is not there.
func imageFile(t *testing.T, backend, path string) (data string, ok bool) {
	t.Helper()
	img, err := cimage.Lookup(imageDir(), "desktop-lite")
	if err != nil {
		t.Fatal(err)
	}
	if !isVM(backend) {
		b, err := os.ReadFile(filepath.Join(img.RootFS, path))
		if os.IsNotExist(err) {
			return "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(b), true
	}
	vm, err := cimage.LookupVM(img.RootFS)
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("debugfs", "-R", "cat "+path, vm.Disk)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("debugfs cat %s %s: %v: %s", path, vm.Disk, err, stderr.Bytes())
	}
	if strings.Contains(stderr.String(), "not found") {
		return "", false
	}
	return string(out), true
}

// assertIndependent checks that what sandbox id writes to its root
// filesystem (a new file, and a change to a file of the image) stays its
// own: the image on the host is unchanged, and a second sandbox of the same
// image and backend sees the image, not the first one's writes.
func assertIndependent(t *testing.T, d *harness.Daemon, c *client.Client, backend, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	issue, ok := imageFile(t, backend, "/etc/issue")
	if !ok {
		t.Fatal("the desktop image has no /etc/issue")
	}
	if _, ok := imageFile(t, backend, "/root/e2e-mark"); ok {
		t.Fatal("the desktop image has /root/e2e-mark before the test wrote it")
	}
	mark := "written by " + id
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: fmt.Sprintf("echo '%s' > /root/e2e-mark && echo '%s' >> /etc/issue && sync && cat /root/e2e-mark /etc/issue", mark, mark)})
	if err != nil || res.ExitCode != 0 || res.Stdout != mark+"\n"+issue+mark+"\n" {
		t.Fatalf("write to the sandbox's root filesystem: %+v %v", res, err)
	}
	if got, _ := imageFile(t, backend, "/etc/issue"); got != issue {
		t.Errorf("the image's /etc/issue changed on the host: %q, was %q", got, issue)
	}
	if _, ok := imageFile(t, backend, "/root/e2e-mark"); ok {
		t.Errorf("a file written in sandbox %s is in the image on the host", id)
	}
	other, err := c.Create(ctx, client.CreateRequest{Backend: backend, Resolution: &client.Resolution{Width: 800, Height: 600}})
	if err != nil {
		t.Fatalf("create a second sandbox: %v", err)
	}
	res, err = c.Exec(ctx, other.ID, client.ExecRequest{Command: "cat /etc/issue; if test -e /root/e2e-mark; then echo MARKED; cat /root/e2e-mark; fi"})
	if err != nil || res.Stdout != issue {
		t.Errorf("second sandbox %s: /etc/issue and /root/e2e-mark = %+v %v, want the image's /etc/issue %q and no mark", other.ID, res, err, issue)
	}
	if err := c.Destroy(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, d, backend, other.ID)
}

// isRFBPort reports whether p is where VNC servers listen by convention:
// 5900+display, and cubicle's own x11vnc at 5999.
func isRFBPort(p int) bool { return p >= 5900 && p <= 5999 }

// assertNoHostVNC checks, while sandbox id's x11vnc runs and a viewer is
// connected to it through the daemon, that no listening TCP socket of the
// host's network namespace serves it: no host process of the sandbox
// listens at all, the daemon listens only on its API address (and that
// does not greet with RFB), and nothing listens on a VNC port.
func assertNoHostVNC(t *testing.T, d *harness.Daemon, c *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// x11vnc serves RFB through the daemon's WebSocket (the viewer
	// starts it: it runs only while someone watches)...
	ws := dialVNC(t, d, id, "", "Authorization", "Bearer "+d.APIKey)
	defer ws.CloseNow()
	if _, err := rfb.NewClient(websocket.NetConn(ctx, ws, websocket.MessageBinary)).Handshake(true); err != nil {
		t.Fatalf("live view handshake: %v", err)
	}
	// ...and on the sandbox's own loopback.
	res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/5999 && timeout 5 head -c 12 <&3"}})
	if err != nil || !strings.HasPrefix(res.Stdout, "RFB 00") {
		t.Fatalf("x11vnc inside the sandbox: %+v %v, want an RFB greeting on 127.0.0.1:5999", res, err)
	}
	ls, err := tcpListeners()
	if err != nil {
		t.Fatal(err)
	}
	owners := socketOwners()
	sandboxPids := harness.HostProcesses(id)
	for _, l := range ls {
		pids := owners[l.Inode]
		switch {
		case isRFBPort(l.Port):
			t.Errorf("a host socket listens on VNC port %s (pids %v)", l.Addr, pids)
		case slices.ContainsFunc(pids, func(p int) bool { return slices.Contains(sandboxPids, p) }):
			t.Errorf("a host process of sandbox %s listens on %s (pids %v)", id, l.Addr, pids)
		case slices.Contains(pids, d.Pid()):
			if _, port, _ := net.SplitHostPort(d.Addr); strconv.Itoa(l.Port) != port {
				t.Errorf("cubicled listens on %s besides its API address %s", l.Addr, d.Addr)
			}
			if greetsRFB(l) {
				t.Errorf("cubicled's listener %s greets with RFB", l.Addr)
			}
		}
	}
}

// greetsRFB reports whether a connection to l gets an RFB ProtocolVersion
// within a second (an RFB server speaks first; HTTP does not).
func greetsRFB(l tcpListener) bool {
	host, port, _ := net.SplitHostPort(l.Addr)
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(time.Second))
	b := make([]byte, 4)
	n, _ := conn.Read(b)
	return string(b[:n]) == "RFB "
}
