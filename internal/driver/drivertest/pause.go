package drivertest

import (
	"bytes"
	"context"
	"image/png"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// pauseResume pauses the main box and resumes it, twice (the second
// resume must be as good as the first), and checks that what ran came
// back: a process that counts in a shell variable (same pid, the count
// goes on from where it was, not from 1), a file in memory only
// (/dev/shm), a server listening on the box's loopback (it answers), and
// the screen. While paused, no process of the box may
// run. It returns the resumed box, which the rest of the suite uses.
func (s *suite) pauseResume(t *testing.T, d driver.Driver, sb *sbox) {
	p, ok := d.(driver.Pauser)
	if !ok {
		t.Logf("%s does not implement driver.Pauser", d.Name())
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := p.CanPause(ctx); err != nil {
		t.Logf("%s cannot pause here: %v", d.Name(), err)
		return
	}
	exec := func(cmd string) string {
		t.Helper()
		res, err := sb.client.Exec(ctx, agentclient.ExecRequest{Command: cmd}, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q: %+v, %v", cmd, res, err)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	pid, err := sb.client.Background(ctx, agentclient.ExecRequest{Command: `i=0; while :; do i=$((i+1)); echo $i > /tmp/drivertest-count.part; mv /tmp/drivertest-count.part /tmp/drivertest-count; sleep 0.2; done`})
	if err != nil {
		t.Fatalf("start counter: %v", err)
	}
	shm := "/dev/shm/drivertest-" + sb.nonce
	exec("mkdir -p /dev/shm && printf %s " + sb.token + " > " + shm)
	// A server a user started, listening on the box's loopback: it must
	// answer after each resume (DevTools is one such listener).
	server, err := sb.client.Background(ctx, agentclient.ExecRequest{Command: `exec python3 -m http.server 8765 --bind 127.0.0.1 --directory /dev/shm`})
	if err != nil {
		t.Fatalf("start a server: %v", err)
	}
	fetch := `python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8765/drivertest-` + sb.nonce + `', timeout=10).read().decode())"`
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		res, err := sb.client.Exec(ctx, agentclient.ExecRequest{Command: fetch}, nil)
		if err == nil && res.ExitCode == 0 && strings.TrimSpace(string(res.Stdout)) == sb.token {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server in the box does not answer: %+v %v", res, err)
		}
	}
	count := func() int {
		t.Helper()
		// 0 until the counter has written its first value.
		n, err := strconv.Atoi(exec("cat /tmp/drivertest-count 2>/dev/null || echo 0"))
		if err != nil {
			t.Fatalf("count: %v", err)
		}
		return n
	}
	for count() < 3 {
		time.Sleep(200 * time.Millisecond)
	}
	for round := 1; round <= 2; round++ {
		before := count()
		pixel := s.pixel(t, sb)
		procs := len(ProcessIDs(sb.id))
		t0 := time.Now()
		paused, err := p.Pause(ctx, sb.box)
		if err != nil {
			t.Fatalf("round %d: Pause: %v", round, err)
		}
		t.Logf("round %d: Pause %s, paused size %d MiB", round, time.Since(t0).Round(time.Millisecond), paused.Bytes>>20)
		if alive(sb.box) {
			t.Errorf("round %d: the paused box's Wait is open", round)
		}
		if left := ProcessIDs(sb.id); len(left) > 0 || procs == 0 {
			t.Errorf("round %d: processes of the box: %d running, %v while paused", round, procs, left)
		}
		if paused.Bytes <= 0 {
			t.Errorf("round %d: paused size %d", round, paused.Bytes)
		}
		if err := sb.box.Stop(ctx); err != nil {
			t.Errorf("round %d: Stop of the paused box's old handle: %v", round, err)
		}
		t0 = time.Now()
		nb, err := p.Resume(ctx, driver.Paused{State: throughStore(t, paused.State), Bytes: paused.Bytes})
		if err != nil {
			t.Fatalf("round %d: Resume: %v", round, err)
		}
		t.Logf("round %d: Resume %s", round, time.Since(t0).Round(time.Millisecond))
		sb.client.Close()
		sb.box, sb.client = nb, agentclient.New(nb.DialAgent, sb.token)
		s.root.Cleanup(func() {
			if err := nb.Stop(context.Background()); err != nil {
				s.root.Errorf("final Stop of resumed %s: %v", sb.id, err)
			}
		})
		if got := exec("kill -0 " + strconv.Itoa(int(pid)) + " && echo alive"); got != "alive" {
			t.Errorf("round %d: the counter process is gone", round)
		}
		if got := exec("cat " + shm); got != sb.token {
			t.Errorf("round %d: %s holds %q after resume, want %q", round, shm, got, sb.token)
		}
		if res, err := sb.client.Exec(ctx, agentclient.ExecRequest{Command: fetch}, nil); err != nil || res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != sb.token {
			t.Errorf("round %d: the server the box listened with does not answer after resume: %+v %v", round, res, err)
		}
		after := count()
		if after < before {
			t.Errorf("round %d: the counter was %d before the pause and is %d after: it started over", round, before, after)
		}
		deadline := time.Now().Add(30 * time.Second)
		for count() <= after && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if n := count(); n <= after {
			t.Errorf("round %d: the counter stands at %d after resume: its process does not run", round, n)
		}
		if g, err := strconv.ParseInt(exec("date +%s"), 10, 64); err != nil || abs(g-time.Now().Unix()) > 5 {
			t.Logf("round %d: the guest's clock is %d, the host's %d", round, g, time.Now().Unix())
		}
		if got := s.pixel(t, sb); got != pixel {
			t.Errorf("round %d: screen pixel %v after resume, %v before", round, got, pixel)
		}
	}
	exec("kill " + strconv.Itoa(int(pid)) + " " + strconv.Itoa(int(server)) + "; rm -f " + shm)
}

// pixel is the colour of the screen at the probe point.
func (s *suite) pixel(t *testing.T, sb *sbox) [4]uint8 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := sb.client.Desktop.Screenshot(ctx, connect.NewRequest(&desktoppb.ScreenshotRequest{
		Format: "png", Region: &desktoppb.Region{X: probeX, Y: probeY, W: 1, H: 1}}))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(resp.Msg.Data))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	c := rgba(img.At(img.Bounds().Min.X, img.Bounds().Min.Y))
	return [4]uint8{c.R, c.G, c.B, c.A}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
