package qemu

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestStopWithoutQMP checks that a VM whose QMP socket is not up (one
// stopped in its first moments, as a cancelled create does) is killed at
// once rather than after the grace a "quit" gets, and that Stop frees its
// directory. The VM is a stand-in process: QEMU is not needed to show it.
// The grace is made an hour, so a Stop that waited for a quit it never
// sent cannot be told apart from a slow machine only by a few hundred
// milliseconds: it would hang, and the test's bound (a minute) says so.
func TestStopWithoutQMP(t *testing.T) {
	grace := quitGrace
	quitGrace = time.Hour
	t.Cleanup(func() { quitGrace = grace })

	cmd := exec.Command("sleep", "3600")
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
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill() // ends the wait, and then Stop
		<-stopped
		t.Fatal("Stop without QMP is waiting out the quit grace: it waited for a quit that was never sent")
	}
	select {
	case <-exited:
	default:
		t.Fatal("the VM process is still running after Stop")
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("the VM process ended with %v, want killed by SIGKILL", cmd.ProcessState)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("VM directory left: %v", err)
	}
}
