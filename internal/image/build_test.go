package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/images"
	"github.com/cubicle-dev/cubicle/internal/mountinfo"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestBuildDesktop builds the desktop-lite image and the desktop image on
// top of it (a recipe with "from") into $CUBICLE_IMAGE_DIR. With up-to-date
// images there (CI builds them once first) it only checks the cache hits
// and the images' contents; otherwise it really builds, which takes minutes
// and ~2 GB.
func TestBuildDesktop(t *testing.T) {
	needs.Root(t)
	dir := needs.Env(t, "CUBICLE_IMAGE_DIR")
	cache := os.Getenv("CUBICLE_CACHE_DIR")
	lite, _ := images.Recipe("desktop-lite")
	liteImg, err := Build(context.Background(), "desktop-lite", lite, dir, cache, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	img, err := Build(context.Background(), "desktop", images.Desktop(), dir, cache, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if img.From != filepath.Base(liteImg.Dir) {
		t.Errorf("desktop was built from %q, want the current desktop-lite %q", img.From, filepath.Base(liteImg.Dir))
	}
	// The real XFCE session and its programs, not the lite image's
	// stand-ins: /usr/local/bin/startxfce4 only defers to the session the
	// agent runs, and the placeholder links are gone.
	for _, p := range []string{"usr/bin/startxfce4", "usr/bin/xfce4-session", "usr/bin/xfwm4", "usr/bin/xfce4-panel",
		"usr/bin/xfdesktop", "usr/bin/thunar", "usr/bin/xfce4-terminal", "usr/bin/mousepad",
		"usr/local/share/applications/chromium.desktop", "etc/xdg/mimeapps.list"} {
		if _, err := os.Stat(filepath.Join(img.RootFS, p)); err != nil {
			t.Errorf("desktop lacks %s: %v", p, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(img.RootFS, "usr/local/lib/cubicle/xfce")); err == nil {
		t.Errorf("desktop still has the lite image's XFCE placeholders")
	}
	if data, err := os.ReadFile(filepath.Join(img.RootFS, "usr/local/bin/startxfce4")); err != nil || !strings.Contains(string(data), "exec /usr/bin/startxfce4") {
		t.Errorf("desktop's startxfce4 is not the wrapper of the real one: %v\n%s", err, data)
	}
	if _, err := os.Stat(filepath.Join(liteImg.RootFS, "usr/bin/xfce4-session")); err == nil {
		t.Errorf("building desktop changed desktop-lite")
	}
	t.Logf("image %s: cached=%v size=%d MB rootfs=%s", img.Name, img.Cached, img.SizeBytes>>20, img.RootFS)
	for _, p := range []string{
		"usr/bin/Xvfb", "usr/bin/openbox", "usr/bin/chromium", "usr/bin/x11vnc", "usr/bin/xdotool",
		"etc/cubicle/session.json", "etc/chromium/policies/managed/cubicle.json", "opt/cubicle/bin",
		// What the E2B Desktop SDK runs; /opt/noVNC links to usr/share/novnc.
		"usr/bin/xdpyinfo", "usr/bin/xrandr", "usr/bin/xdg-open", "usr/bin/gtk-launch", "usr/bin/scrot",
		"usr/bin/pgrep", "usr/bin/pkill", "bin/netstat", "usr/bin/websockify",
		"usr/share/novnc/utils/novnc_proxy", "usr/share/novnc/vnc.html", "etc/hosts",
	} {
		if _, err := os.Stat(filepath.Join(img.RootFS, p)); err != nil {
			t.Errorf("image lacks %s: %v", p, err)
		}
	}
	for _, p := range []string{"usr/local/bin/cubicle-browser", "usr/local/bin/startxfce4", "usr/local/bin/x11vnc"} {
		fi, err := os.Stat(filepath.Join(img.RootFS, p))
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("/%s: %v, mode %v; want 0755", p, err, fi)
		}
	}
	// Links are read, not followed: their absolute targets would resolve
	// on the host.
	for p, want := range map[string]string{"opt/noVNC": "/usr/share/novnc", "usr/local/bin/cubicle-vnc": "/usr/bin/x11vnc"} {
		if got, err := os.Readlink(filepath.Join(img.RootFS, p)); err != nil || got != want {
			t.Errorf("/%s -> %q, %v; want -> %q", p, got, err, want)
		}
	}
	fi, err := os.Stat(filepath.Join(img.RootFS, "home/user/.config/chromium"))
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

func TestMakeLinks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		before  map[string]string // rootfs path → "dir", "file" or "-> target"
		links   map[string]string
		want    map[string]string // link path → target after makeLinks
		wantErr string
	}{
		{
			name:   "new link",
			before: map[string]string{"opt": "dir", "usr/share/novnc": "dir"},
			links:  map[string]string{"/opt/noVNC": "/usr/share/novnc"},
			want:   map[string]string{"opt/noVNC": "/usr/share/novnc"},
		},
		{
			name:  "missing parents",
			links: map[string]string{"/a/b/c": "../x"},
			want:  map[string]string{"a/b/c": "../x"},
		},
		{
			name:   "replaces a symlink",
			before: map[string]string{"usr/local/bin/vnc": "-> /old"},
			links:  map[string]string{"/usr/local/bin/vnc": "/usr/bin/x11vnc"},
			want:   map[string]string{"usr/local/bin/vnc": "/usr/bin/x11vnc"},
		},
		{
			name:   "keeps the same symlink",
			before: map[string]string{"opt/x": "-> /y"},
			links:  map[string]string{"/opt/x": "/y"},
			want:   map[string]string{"opt/x": "/y"},
		},
		{
			name:    "refuses a file",
			before:  map[string]string{"usr/local/bin/startxfce4": "file"},
			links:   map[string]string{"/usr/local/bin/startxfce4": "/bin/true"},
			wantErr: "regular file",
		},
		{
			name:    "refuses a directory",
			before:  map[string]string{"opt/noVNC": "dir"},
			links:   map[string]string{"/opt/noVNC": "/usr/share/novnc"},
			wantErr: "directory",
		},
		{
			name:    "parent link escapes",
			before:  map[string]string{"esc": "-> ../../../../../../../.."},
			links:   map[string]string{"/esc/tmp/x": "/y"},
			wantErr: "escapes",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rootfs := filepath.Join(dir, "rootfs")
			if err := os.Mkdir(rootfs, 0o755); err != nil {
				t.Fatal(err)
			}
			for p, kind := range tc.before {
				full := filepath.Join(rootfs, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				var err error
				switch {
				case kind == "dir":
					err = os.Mkdir(full, 0o755)
				case kind == "file":
					err = os.WriteFile(full, []byte("keep"), 0o755)
				case strings.HasPrefix(kind, "-> "):
					err = os.Symlink(strings.TrimPrefix(kind, "-> "), full)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			root, err := os.OpenRoot(rootfs)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			for run := 1; run <= 2; run++ { // a second run changes nothing
				err := makeLinks(root, tc.links)
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("makeLinks = %v, want an error containing %q", err, tc.wantErr)
					}
					break
				}
				if err != nil {
					t.Fatalf("run %d: makeLinks: %v", run, err)
				}
				for p, want := range tc.want {
					if got, err := os.Readlink(filepath.Join(rootfs, p)); err != nil || got != want {
						t.Errorf("run %d: /%s -> %q, %v; want -> %q", run, p, got, err, want)
					}
				}
			}
			for p, kind := range tc.before {
				if kind != "file" {
					continue
				}
				if data, err := os.ReadFile(filepath.Join(rootfs, p)); err != nil || string(data) != "keep" {
					t.Errorf("/%s = %q, %v; want it kept", p, data, err)
				}
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("makeLinks wrote outside the rootfs: %v", ents)
			}
		})
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
