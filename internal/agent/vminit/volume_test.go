package vminit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestSeed checks how a VM fills a new volume from the image's directory:
// files, directories and links are copied with their modes and owners,
// lost+found goes, and a volume in use before is left as it is.
func TestSeed(t *testing.T) {
	src, mp := t.TempDir(), t.TempDir()
	for _, d := range []string{".config/chromium", "Downloads"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, ".bashrc"), []byte("PS1=x"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(".bashrc", filepath.Join(src, "rc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(src, 0o750); err != nil {
		t.Fatal(err)
	}
	owner := os.Getuid() == 0
	if owner {
		filepath.Walk(src, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, 1000, 1000) })
	}
	if err := os.Mkdir(filepath.Join(mp, "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}

	filled, err := seed(mp, src)
	if err != nil || !filled {
		t.Fatalf("seed of a new volume = %v, %v; want filled", filled, err)
	}
	if _, err := os.Stat(filepath.Join(mp, "lost+found")); !os.IsNotExist(err) {
		t.Errorf("lost+found: %v, want gone", err)
	}
	for p, mode := range map[string]os.FileMode{".": 0o750 | os.ModeDir, ".bashrc": 0o640, ".config/chromium": 0o700 | os.ModeDir, "Downloads": 0o700 | os.ModeDir} {
		fi, err := os.Lstat(filepath.Join(mp, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), mode)
		}
		if st := fi.Sys().(*syscall.Stat_t); owner && (st.Uid != 1000 || st.Gid != 1000) {
			t.Errorf("%s: owner %d:%d, want 1000:1000", p, st.Uid, st.Gid)
		}
	}
	if b, err := os.ReadFile(filepath.Join(mp, ".bashrc")); err != nil || string(b) != "PS1=x" {
		t.Errorf(".bashrc = %q, %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(mp, "rc")); err != nil || l != ".bashrc" {
		t.Errorf("rc → %q, %v; want the link copied as a link", l, err)
	}

	// In use before: not filled again over what was changed.
	os.Remove(filepath.Join(mp, ".bashrc"))
	if filled, err := seed(mp, src); err != nil || filled {
		t.Errorf("seed of a used volume = %v, %v; want left alone", filled, err)
	}
	if _, err := os.Stat(filepath.Join(mp, ".bashrc")); !os.IsNotExist(err) {
		t.Error("a used volume was filled again")
	}
	// An image without the directory: the new volume stays empty.
	empty := t.TempDir()
	if filled, err := seed(empty, filepath.Join(src, "nope")); err != nil || filled {
		t.Errorf("seed from a missing directory = %v, %v", filled, err)
	}
}

func TestExt4UUID(t *testing.T) {
	head := make([]byte, 4096)
	if _, ok := Ext4UUID(head); ok {
		t.Error("zeros taken for an ext4")
	}
	head[ext4MagicOffset], head[ext4MagicOffset+1] = 0x53, 0xef
	for i := 0; i < 16; i++ {
		head[ext4UUIDOffset+i] = byte(i * 17)
	}
	if u, ok := Ext4UUID(head); !ok || u != "00112233445566778899aabbccddeeff" {
		t.Errorf("Ext4UUID = %q, %v", u, ok)
	}
	// A real one, against blkid's reading of it: a subtest, so that a host
	// without the tools skips (or, under CUBICLE_REQUIRE_E2E=1, fails) it
	// alone and says so.
	t.Run("mkfs.ext4", func(t *testing.T) {
		needs.Command(t, "blkid", "mkfs.ext4")
		file := filepath.Join(t.TempDir(), "fs")
		if err := os.WriteFile(file, make([]byte, 8<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", file).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v: %s", err, out)
		}
		want, err := exec.Command("blkid", "-p", "-s", "UUID", "-o", "value", file).Output()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(file)
		if u, ok := Ext4UUID(b[:4096]); !ok || u != strings.ReplaceAll(strings.TrimSpace(string(want)), "-", "") {
			t.Errorf("Ext4UUID of a real ext4 = %q, %v; blkid says %s", u, ok, want)
		}
	})
}
