package oci

import (
	"os/exec"
	"testing"
	"time"
)

// TestBoxWatch checks the box's view of its container process: Wait closes
// when the process dies, and stopping the watch while it runs returns at
// once and counts the box as gone.
func TestBoxWatch(t *testing.T) {
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	cmd := start()
	b := newBox(&Driver{}, boxData{ID: "w1", Pid: cmd.Process.Pid})
	select {
	case <-b.Wait():
		t.Fatal("Wait closed while the process runs")
	case <-time.After(300 * time.Millisecond):
	}
	cmd.Process.Kill()
	select {
	case <-b.Wait():
	case <-time.After(2 * time.Second):
		t.Fatal("Wait not closed after the process died")
	}
	b.stopWatch()

	cmd = start()
	b = newBox(&Driver{}, boxData{ID: "w2", Pid: cmd.Process.Pid})
	done := make(chan struct{})
	go func() { b.stopWatch(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("stopWatch of a running box hangs")
	}
	select {
	case <-b.Wait():
	default:
		t.Error("Wait not closed after stopWatch")
	}
}
