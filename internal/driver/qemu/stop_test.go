package qemu

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestStopWithoutQMP checks that a VM whose QMP socket is not up (one
// stopped in its first moments, as a cancelled create does) is killed at
// once rather than after the grace a "quit" gets, and that Stop frees its
// directory. The VM is a stand-in process: QEMU is not needed to show it.
func TestStopWithoutQMP(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	dir := t.TempDir() + "/vm"
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b := newBox(&Driver{}, boxData{ID: "tstop", Pid: cmd.Process.Pid, StartTime: procStartTime(cmd.Process.Pid), Dir: dir}, exited)
	t0 := time.Now()
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 4500*time.Millisecond { // the grace is 5 s
		t.Errorf("Stop without QMP took %v: it waited for a quit that was never sent", took)
	}
	select {
	case <-exited:
	default:
		t.Error("the VM process is still running after Stop")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("VM directory left: %v", err)
	}
}
