package image

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/images"
	"github.com/cubicle-dev/cubicle/internal/mountinfo"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestBuildDesktop builds the desktop image into $CUBICLE_IMAGE_DIR. With an
// up-to-date image there (CI builds it once first) it only checks the cache
// hit and the image's contents; otherwise it really builds, which takes
// minutes and ~1.5 GB.
func TestBuildDesktop(t *testing.T) {
	needs.Root(t)
	dir := needs.Env(t, "CUBICLE_IMAGE_DIR")
	cache := os.Getenv("CUBICLE_CACHE_DIR")
	img, err := Build(context.Background(), "desktop", images.Desktop(), dir, cache, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s: cached=%v size=%d MB rootfs=%s", img.Name, img.Cached, img.SizeBytes>>20, img.RootFS)
	for _, p := range []string{
		"usr/bin/Xvfb", "usr/bin/openbox", "usr/bin/chromium", "usr/bin/x11vnc", "usr/bin/xdotool",
		"etc/cubicle/session.json", "etc/chromium/policies/managed/cubicle.json", "opt/cubicle/bin",
	} {
		if _, err := os.Stat(filepath.Join(img.RootFS, p)); err != nil {
			t.Errorf("image lacks %s: %v", p, err)
		}
	}
	fi, err := os.Stat(filepath.Join(img.RootFS, "usr/local/bin/cubicle-browser"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("cubicle-browser: %v, mode %v; want 0755", err, fi)
	}
	fi, err = os.Stat(filepath.Join(img.RootFS, "home/user/.config/chromium"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || fi.Mode().Perm() != 0o700 {
		t.Errorf("/home/user/.config/chromium: uid %d mode %v, want 1000 0700", st.Uid, fi.Mode())
	}
	if mps, _ := mountinfo.Under(dir); len(mps) != 0 {
		t.Errorf("mounts left under %s: %v", dir, mps)
	}
	got, err := Lookup(dir, "desktop")
	if err != nil || got.RecipeHash != img.RecipeHash {
		t.Errorf("Lookup = %+v, %v; want hash %s", got, err, img.RecipeHash)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
