package qemu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestCleanupKillsUnrecordedVM checks the window between starting QEMU and
// writing box.json: a daemon killed there leaves a VM no record names, and
// Cleanup must find it by its arguments (a stand-in process with QEMU's
// kind of arguments; the real QEMU is exercised by the e2e crash test).
func TestCleanupKillsUnrecordedVM(t *testing.T) {
	state := t.TempDir()
	// The stand-in VMs are sh processes: sh is the QEMU binary here.
	d := New(Config{StateDir: state, QEMU: "sh"})
	mk := func(id string) string {
		dir := filepath.Join(state, id)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	startAs := func(prog string, uid uint32, dir string) *exec.Cmd {
		cmd := exec.Command(prog, "-c", "sleep 30", "qemu-system-x86_64", //depcheck:runs sh bash
			"-initrd", filepath.Join(state, initramfsDir, "abc.cpio"),
			"-drive", "id=root,if=none,format=qcow2,file="+filepath.Join(dir, "overlay.qcow2"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if uid != 0 {
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	// The initramfs cache, in use by both VMs: neither a box directory
	// nor a reason to kill a VM.
	cache := filepath.Join(mk(initramfsDir), "abc.cpio")
	if err := os.WriteFile(cache, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(dir string) *exec.Cmd { return startAs("sh", 0, dir) }
	strayDir := mk("tstray")
	stray := start(strayDir)
	kept := start(mk("tkept"))
	// Processes that name the stray's directory but are not our QEMU:
	// another program, and (as root only) our QEMU binary run by another
	// user. Cleanup must leave both alone.
	bystanders := []*exec.Cmd{startAs("bash", 0, strayDir)}
	if os.Geteuid() == 0 {
		bystanders = append(bystanders, startAs("sh", 65534, strayDir))
	}
	if err := d.Cleanup(context.Background(), map[string]bool{"tkept": true}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); running(stray.Process.Pid, 0); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the unrecorded VM is still running")
		}
	}
	if _, err := os.Stat(filepath.Join(state, "tstray")); !os.IsNotExist(err) {
		t.Errorf("its directory: %v, want removed", err)
	}
	if _, err := os.Stat(cache); err != nil {
		t.Errorf("the initramfs cache in use: %v", err)
	}
	if !running(kept.Process.Pid, 0) {
		t.Error("the VM of a kept box was killed")
	}
	for _, b := range bystanders {
		if !running(b.Process.Pid, 0) {
			t.Errorf("killed %v (uid %v), which is not our VM", b.Args[0], b.SysProcAttr.Credential)
		}
	}
}
