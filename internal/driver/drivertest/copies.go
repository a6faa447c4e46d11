package drivertest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
)

// copies forks the main box into two and snapshots it into a third, and
// checks what makes a copy a copy: each starts with what the parent had
// at the moment of the copy — a file it wrote on its root filesystem, a
// file in memory (/tmp), a process it started (same pid, still running)
// and its screen — and from then on each is its own: what one writes no
// other sees, the parent's writes after the copy reach none of them. The
// parent runs on. Each copy stopped leaves nothing, and a fork asked of
// a driver that says it cannot fork is refused and makes nothing.
func (s *suite) copies(t *testing.T, d driver.Driver, sb *sbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f, canFork := d.(driver.Forker)
	sn, canSnap := d.(driver.Snapshotter)
	if !canFork && !canSnap {
		t.Fatalf("Copies asked of %s, which implements neither driver.Forker nor driver.Snapshotter", d.Name())
	}
	if canFork {
		if err := f.CanFork(ctx); err != nil {
			// Refused, and nothing made.
			spec := s.newSpec("f", "")
			if _, ferr := f.Fork(ctx, sb.box, []driver.Spec{spec}); ferr == nil {
				t.Fatalf("Fork on a driver whose CanFork says %q succeeded", err)
			}
			s.assertNoTraces(t, spec.ID, "after a refused fork")
			t.Logf("%s cannot fork here: %v", d.Name(), err)
			return
		}
	}
	run := func(c *agentclient.Client, cmd string) string {
		t.Helper()
		res, err := c.Exec(ctx, agentclient.ExecRequest{Command: cmd}, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q: %+v, %v", cmd, res, err)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	pid, err := sb.client.Background(ctx, agentclient.ExecRequest{Command: "exec sleep 100000"})
	if err != nil {
		t.Fatalf("start a process: %v", err)
	}
	run(sb.client, "printf %s "+sb.nonce+" > /root/drivertest-copy && printf %s "+sb.nonce+" > /tmp/drivertest-copy")
	screen := s.pixel(t, sb)
	// have is what a copy must hold of the parent at the copy.
	have := func(t *testing.T, c *sbox) {
		t.Helper()
		if got := run(c.client, "cat /root/drivertest-copy /tmp/drivertest-copy"); got != sb.nonce+sb.nonce {
			t.Errorf("copy %s: the parent's files hold %q, want %q twice", c.id, got, sb.nonce)
		}
		if got := run(c.client, "tr '\\0' ' ' < /proc/"+strconv.Itoa(int(pid))+"/cmdline"); got != "sleep 100000" {
			t.Errorf("copy %s: the parent's process %d is %q, want sleep 100000", c.id, pid, got)
		}
		if got := s.pixel(t, c); got != screen {
			t.Errorf("copy %s: pixel %v on its screen, the parent showed %v", c.id, got, screen)
		}
	}
	var copies []*sbox
	stopAll := func() {
		for _, c := range copies {
			c.client.Close()
			s.stop(t, c.id, c.box)
		}
	}
	defer stopAll()
	if canFork {
		specs := []driver.Spec{s.newSpec("f", ""), s.newSpec("g", "")}
		t0 := time.Now()
		boxes, err := f.Fork(ctx, sb.box, specs)
		if err != nil {
			for _, sp := range specs {
				s.assertNoTraces(t, sp.ID, "after a fork that failed")
			}
			t.Fatalf("Fork: %v", err)
		}
		t.Logf("fork of 2: %s", time.Since(t0).Round(time.Millisecond))
		if len(boxes) != len(specs) {
			t.Fatalf("Fork of %d made %d boxes", len(specs), len(boxes))
		}
		for i, b := range boxes {
			// The copy's agent has the parent's token until re-keyed.
			copies = append(copies, &sbox{id: specs[i].ID, token: sb.token, nonce: sb.nonce, box: b, client: agentclient.New(b.DialAgent, sb.token)})
		}
	}
	if canSnap && sn.CanSnapshot(ctx) == nil {
		dir := filepath.Join(s.root.TempDir(), "snapshot")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		snap, err := sn.Snapshot(ctx, sb.box, dir)
		if err != nil {
			t.Fatalf("Snapshot: %v", err)
		}
		t.Logf("snapshot: %s, %d MiB", time.Since(t0).Round(time.Millisecond), snap.Bytes>>20)
		spec := s.newSpec("s", "")
		t0 = time.Now()
		b, err := sn.Restore(ctx, throughStore(t, snap.State), dir, spec)
		if err != nil {
			s.assertNoTraces(t, spec.ID, "after a restore that failed")
			t.Fatalf("Restore: %v", err)
		}
		t.Logf("restore: %s", time.Since(t0).Round(time.Millisecond))
		copies = append(copies, &sbox{id: spec.ID, token: sb.token, nonce: sb.nonce, box: b, client: agentclient.New(b.DialAgent, sb.token)})
	}
	if !alive(sb.box) {
		t.Fatal("the parent died of its copies")
	}
	run(sb.client, "printf after > /root/drivertest-after")
	for _, c := range copies {
		have(t, c)
		run(c.client, "printf %s "+c.id+" > /root/drivertest-mine")
	}
	for _, c := range copies {
		if got := run(c.client, "cat /root/drivertest-mine; test -e /root/drivertest-after && echo parent-leaked || true"); got != c.id {
			t.Errorf("copy %s: its own file and the parent's later one: %q, want only %q", c.id, got, c.id)
		}
	}
	if got := run(sb.client, "cat /root/drivertest-copy; test -e /root/drivertest-mine && echo copy-leaked || true"); got != sb.nonce {
		t.Errorf("parent after its copies wrote: %q, want %q", got, sb.nonce)
	}
	run(sb.client, "kill "+strconv.Itoa(int(pid))+"; rm -f /root/drivertest-copy /tmp/drivertest-copy /root/drivertest-after")
}
