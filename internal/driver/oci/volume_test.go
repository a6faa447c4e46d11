package oci

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// newVolumeFile makes an empty ext4 volume file the way the manager does.
func newVolumeFile(t *testing.T, sizeMB int) string {
	t.Helper()
	needs.Command(t, "mkfs.ext4", "losetup")
	file := filepath.Join(t.TempDir(), "vol.ext4")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, int64(sizeMB)<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", file).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return file
}

func loopsOf(file string) string {
	out, _ := exec.Command("losetup", "-j", file).Output()
	return strings.TrimSpace(string(out))
}

// TestVolume checks a volume on the real runtimes: a new one starts as
// the image's directory (contents and owner), what a box writes there is
// on the volume after the box is gone and is found by the next box, the
// volume is not filled again over what a box changed, a second box
// cannot mount it while the first holds it, stopping a box asks its agent
// to shut down (SIGTERM) before killing it, and leaves no mount or loop
// device of it.
func TestVolume(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			file := newVolumeFile(t, 64)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			vol := []driver.Volume{{Name: "profile", File: file, Path: "/home/user"}}
			spec := func(id string) driver.Spec {
				return driver.Spec{ID: id, Shape: driver.Shape{Image: image, Volumes: vol},
					Session: driver.Session{Token: "x", Env: map[string]string{"TESTAGENT_ON_TERM": "/home/user/term.txt"}}}
			}
			want, err := os.Stat(filepath.Join(image, "home/user"))
			if err != nil {
				t.Fatal(err)
			}
			wantOwner := ownerOf(want)

			b1, err := d.Create(ctx, spec("tvol1"+rt[3:]))
			if err != nil {
				t.Fatal(err)
			}
			// find, not stat or ls: coreutils' statx fails with EINVAL
			// under Debian 12's gVisor, on every path.
			out := postExec(t, b1, `find /home/user -maxdepth 0 -printf '%U:%G %m\n'; find /home/user -mindepth 1 -maxdepth 1 -printf '%f\n' | sort;
				rm /home/user/.bashrc && echo 'kept across boxes' > /home/user/keep.txt && sync && echo wrote`)
			if !strings.HasPrefix(out, wantOwner+" 755\n") || !strings.Contains(out, ".bashrc\n") || !strings.Contains(out, ".config\n") || strings.Contains(out, "lost+found") {
				t.Errorf("a new volume at /home/user: %q; want the image's home (owner %s, .bashrc, .config) and no lost+found", out, wantOwner)
			}
			if !strings.HasSuffix(strings.TrimSpace(out), "wrote") {
				t.Fatalf("write to the volume: %q", out)
			}
			if loopsOf(file) == "" {
				t.Error("no loop device holds the volume while its box runs")
			}

			// Held by b1: a second box cannot have it, and leaves nothing.
			if _, err := d.Create(ctx, spec("tvol2"+rt[3:])); err == nil || !strings.Contains(err.Error(), "in use") {
				t.Errorf("a second box on a held volume: %v, want refused as in use", err)
			}
			assertGone(t, d, "tvol2"+rt[3:], 0)

			pid := b1.(*box).data.Pid
			if err := b1.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			assertGone(t, d, "tvol1"+rt[3:], pid)
			if l := loopsOf(file); l != "" {
				t.Errorf("after Stop a loop device still holds the volume: %s", l)
			}

			b3, err := d.Create(ctx, spec("tvol3"+rt[3:]))
			if err != nil {
				t.Fatal(err)
			}
			defer b3.Stop(context.Background())
			out = postExec(t, b3, `cat /home/user/keep.txt; test -e /home/user/.bashrc && echo refilled || echo not-refilled; cat /home/user/term.txt`)
			if out != "kept across boxes\nnot-refilled\nterminated" {
				t.Errorf("the next box sees %q; want the file the first wrote, .bashrc still removed, and the first box's agent told to stop before it was killed", out)
			}
		})
	}
}

func ownerOf(fi os.FileInfo) string {
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}
