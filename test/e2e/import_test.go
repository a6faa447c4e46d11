package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	cimage "github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// The images of these tests are made the way a user's own Dockerfile would
// make them — Debian, `apt-get install` of what they want, and nothing of
// cubicle — then tarred as `docker export` tars a container and piped into
// `cubicle image import NAME`, the README's line. (There is no Docker engine
// on these machines: debootstrap and chroot stand in for `FROM
// debian:bookworm` and `RUN apt-get install`.)

// userImages are the packages of each image the tests import.
var userImages = map[string][]string{
	// The seed system's desktop: XFCE, Chromium and an X server, and
	// gtk-launch, which E2B's desktop.launch runs.
	"byo-xfce": {"xfce4", "chromium", "xvfb", "libgtk-3-bin"},
	// A plain Debian: no X server at all.
	"byo-headless": nil,
}

var (
	userImageMu   sync.Mutex
	userImageDone = map[string]error{}
)

// importUserImage builds the rootfs of userImages[name], imports it under
// that name into the test image directory with the CLI (once per test
// process), and removes it when the test process's tests are done with it.
func importUserImage(t *testing.T, name string) {
	t.Helper()
	needs.Root(t)
	needs.Command(t, "debootstrap", "chroot", "tar")
	userImageMu.Lock()
	defer userImageMu.Unlock()
	err, done := userImageDone[name]
	if !done {
		err = buildAndImport(t, name, userImages[name])
		userImageDone[name] = err
	}
	if err != nil {
		t.Fatalf("image %s: %v", name, err)
	}
}

// rootfsCacheDir keeps each user image's tarred rootfs under the hash of
// what goes into it, as image builds keep theirs by recipe hash: the
// debootstrap and apt-get install of byo-xfce took about 2 minutes of every
// test run, while the import, which is what these tests are about, runs
// every time from the tar as a user's `docker export` pipes it.
var rootfsCacheDir = filepath.Join(cimage.DefaultCacheDir, "e2e-rootfs")

// rootfsKey is the hash of a user image's inputs: the suite and variant,
// the install script, the packages and the page it carries. A change to
// any of them builds a new rootfs.
func rootfsKey(packages []string, page []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", strings.Join(debootstrapArgs, " "), installScript(packages))
	h.Write(page)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// debootstrapArgs and installScript make a user image's rootfs: FROM
// debian:bookworm and RUN apt-get install -y --no-install-recommends
// PACKAGES, in a mount namespace of its own so that /proc goes away with
// it whatever happens. The .debs stay in the shared cache (not `apt-get
// clean`, which would empty it through the bind mount); the image keeps
// none of them.
var debootstrapArgs = []string{"--variant=minbase", "bookworm"}

func installScript(packages []string) string {
	return `set -e
mount -t proc proc "$1/proc"
mount --bind "$2" "$1/var/cache/apt/archives"
chroot "$1" sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin' sh ` + strings.Join(packages, " ") + `
umount "$1/var/cache/apt/archives" "$1/proc"
`
}

func buildAndImport(t *testing.T, name string, packages []string) error {
	t0 := time.Now()
	page, err := os.ReadFile("testdata/page.html")
	if err != nil {
		return err
	}
	tarPath := filepath.Join(rootfsCacheDir, name+"-"+rootfsKey(packages, page)+".tar")
	built := "cached"
	if _, err := os.Stat(tarPath); err != nil {
		if err := buildRootfs(name, packages, page, tarPath); err != nil {
			return err
		}
		built = "built in " + time.Since(t0).Round(time.Second).String()
	}
	t1 := time.Now()
	// docker export $(docker create IMAGE) | cubicle image import NAME
	bin, err := harness.Build()
	if err != nil {
		return err
	}
	tarFile, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer tarFile.Close()
	imp := exec.Command(filepath.Join(bin, "cubicle"), "image", "import", name, "--image-dir", imageDir()) //depcheck:built
	imp.Stdin = tarFile
	var out bytes.Buffer
	imp.Stdout, imp.Stderr = &out, &out
	if err := imp.Run(); err != nil {
		// A tar the import refuses is not kept for the next run.
		os.Remove(tarPath)
		return fmt.Errorf("cubicle image import < %s: %v\n%s", tarPath, err, out.String())
	}
	t.Logf("image %s: rootfs %s (%s), imported in %s: %s", name, built,
		strings.Join(packages, " "), time.Since(t1).Round(time.Second), strings.TrimSpace(out.String()))
	return nil
}

// buildRootfs makes the rootfs of a user image as a Dockerfile would and
// tars it, as `docker export` tars a container, to tarPath; older tars of
// the same image are removed.
func buildRootfs(name string, packages []string, page []byte, tarPath string) error {
	if err := os.MkdirAll(filepath.Dir(tarPath), 0o755); err != nil {
		return err
	}
	root, err := os.MkdirTemp("/var/tmp", "cubicle-"+name+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	cache := filepath.Join(cimage.DefaultCacheDir, "debs") // shared with image builds
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	run := func(timeout time.Duration, name string, args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...) //depcheck:runs debootstrap unshare sh mount chroot umount tar
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive", "HOME=/root"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(string(out), 30))
		}
		return nil
	}
	// FROM debian:bookworm
	if err := run(10*time.Minute, "debootstrap", append(append([]string{"--cache-dir=" + cache}, debootstrapArgs...), root, "http://deb.debian.org/debian")...); err != nil {
		return err
	}
	if len(packages) > 0 {
		resolv, _ := os.ReadFile("/etc/resolv.conf")
		if err := os.WriteFile(filepath.Join(root, "etc/resolv.conf"), resolv, 0o644); err != nil {
			return err
		}
		if err := run(20*time.Minute, "unshare", "--mount", "--propagation", "private", "sh", "-c", installScript(packages), "sh", root, cache); err != nil {
			return err
		}
	}
	// COPY page.html /srv/page.html: the page the tests click.
	if err := os.MkdirAll(filepath.Join(root, "srv"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "srv", "page.html"), page, 0o644); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(tarPath), name+"-*.tmp")
	if err != nil {
		return err
	}
	f.Close()
	tmp := f.Name()
	if err := run(10*time.Minute, "tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", tmp, "."); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, tarPath); err != nil {
		os.Remove(tmp)
		return err
	}
	old, _ := filepath.Glob(filepath.Join(filepath.Dir(tarPath), name+"-*.tar"))
	for _, o := range old {
		if o != tarPath {
			os.Remove(o)
		}
	}
	return nil
}

// removeUserImages removes the imported images; TestMain calls it.
func removeUserImages() {
	userImageMu.Lock()
	defer userImageMu.Unlock()
	for name, err := range userImageDone {
		if err == nil {
			_ = cimage.Remove(imageDir(), name)
		}
	}
}

// TestImportedDesktop runs a sandbox of an image that knows nothing of
// cubicle (XFCE, Chromium, Xvfb and gtk-launch from apt): the agent finds
// its desktop and starts it, and drives its browser — a page turns from red
// to green when clicked, in the screenshot — on gvisor, runc and qemu.
// XFCE's whole session (window manager, panel, desktop) runs on all three,
// and gtk-launch starts a program from its .desktop entry. Both spawn with
// GLib, which Debian 12's gVisor (runsc 20221219) broke: its close_range
// failed GLib's "close every descriptor", and with it every spawn. The
// pinned runsc does not, with no seccomp filter of cubicle's.
func TestImportedDesktop(t *testing.T) {
	importUserImage(t, "byo-xfce")
	img, err := cimage.Lookup(imageDir(), "byo-xfce")
	if err != nil {
		t.Fatal(err)
	}
	if d := img.Desktop; d == nil || d.Config || !strings.HasSuffix(d.XServer, "/Xvfb") ||
		!strings.HasSuffix(d.Session, "/startxfce4") || !strings.HasSuffix(d.Browser, "/chromium") ||
		!strings.HasSuffix(d.Bus, "/dbus-run-session") {
		t.Fatalf("image.json says the image has %+v, want Xvfb, startxfce4, chromium and dbus-run-session found", img.Desktop)
	}
	for _, backend := range []string{"gvisor", "runc", "qemu"} {
		t.Run(backend, func(t *testing.T) {
			wait := 90 * time.Second
			switch backend {
			case "gvisor", "runc":
				needs.Runtime(t, map[string]string{"gvisor": "runsc", "runc": "runc"}[backend]) //depcheck:runs runsc runc
			case "qemu":
				needs.Command(t, "qemu-system-x86_64", "qemu-img")
				if _, err := cimage.LookupVM(img.RootFS); err != nil {
					t.Fatalf("the import has no VM form (it should have the desktop image's kernel): %v", err)
				}
				wait = 5 * time.Minute // Chromium under TCG
			}
			d, c := startDaemon(t, backend)
			ctx := context.Background()
			req := client.CreateRequest{Template: "byo-xfce", Backend: backend, StartURL: "file:///srv/page.html",
				Resolution: &client.Resolution{Width: 1024, Height: 768}}
			if backend == "qemu" {
				req.MemoryMB = 2048
			}
			t0 := time.Now()
			sb, err := c.Create(ctx, req)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			t.Logf("sandbox %s ready in %s", sb.ID, time.Since(t0).Round(time.Millisecond))
			if sb.Desktop == nil || !*sb.Desktop {
				t.Fatalf("sandbox %+v does not say it has a desktop", sb)
			}
			const px, py = 512, 450
			if !eventually(wait, func() bool { return near(pixel(t, c, sb.ID, px, py), red) }) {
				t.Fatalf("the page did not paint within %s", wait)
			}
			t.Logf("page painted %s after create", time.Since(t0).Round(time.Second))
			if err := c.Click(ctx, sb.ID, px, py); err != nil {
				t.Fatal(err)
			}
			if !eventually(wait, func() bool { return near(pixel(t, c, sb.ID, px, py), green) }) {
				t.Fatal("the page did not turn green after the click")
			}
			// The session is XFCE's own, not a stand-in, under a D-Bus
			// session bus the agent gave it as a display manager would.
			want := []string{"xfce4-session", "xfwm4", "xfce4-panel", "xfdesktop", "dbus-daemon"}
			var running []string
			if !eventually(wait, func() bool {
				res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "for p in " + strings.Join(want, " ") + "; do pgrep -x $p >/dev/null && echo $p; done"})
				if err != nil {
					t.Fatal(err)
				}
				running = strings.Fields(res.Stdout)
				return len(running) == len(want)
			}) {
				t.Errorf("XFCE is not all there: running %q, want %q", running, want)
			}
			// desktop.launch's way: gtk-launch of a .desktop entry (XFCE's
			// About dialog, from libxfce4ui-utils, which the xfce4 package
			// pulls in and nothing else starts) runs its program.
			const app = "xfce4-about"
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "test -f /usr/share/applications/" + app + ".desktop && gtk-launch " + app, TimeoutSeconds: 60})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != 0 {
				t.Errorf("gtk-launch %s: exit %d: %s", app, res.ExitCode, strings.TrimSpace(res.Stderr))
			} else if !eventually(wait, func() bool {
				res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: "pgrep -x " + app})
				if err != nil {
					t.Fatal(err)
				}
				return res.ExitCode == 0
			}) {
				t.Errorf("gtk-launch %s succeeded, but no %s process appeared", app, app)
			}
			if err := c.Destroy(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			assertNoTrace(t, d, backend, sb.ID)
		})
	}
}

// TestImportedHeadless runs a sandbox of a plain Debian image with no X
// server: it is ready as soon as its agent answers, runs commands and moves
// files, and answers 409 no_desktop to a screenshot, an action and a live
// view.
func TestImportedHeadless(t *testing.T) {
	importUserImage(t, "byo-headless")
	img, err := cimage.Lookup(imageDir(), "byo-headless")
	if err != nil {
		t.Fatal(err)
	}
	if img.Desktop == nil || img.Desktop.Desktop() {
		t.Fatalf("image.json says the image has %+v, want no X server", img.Desktop)
	}
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) {
			if rt, ok := map[string]string{"gvisor": "runsc", "runc": "runc"}[backend]; ok {
				needs.Runtime(t, rt) //depcheck:runs runsc runc
			}
			d, c := startDaemon(t, backend)
			ctx := context.Background()
			t0 := time.Now()
			sb, err := c.Create(ctx, client.CreateRequest{Template: "byo-headless", Backend: backend})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			t.Logf("headless sandbox %s ready in %s", sb.ID, time.Since(t0).Round(time.Millisecond))
			if sb.Desktop == nil || *sb.Desktop || sb.State != "running" {
				t.Fatalf("sandbox = %+v, want running without a desktop", sb)
			}
			if got, err := c.Get(ctx, sb.ID); err != nil || got.Desktop == nil || *got.Desktop {
				t.Errorf("GET = %+v, %v; want desktop false", got, err)
			}
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: ". /etc/os-release; echo $ID $VERSION_CODENAME; id -un"})
			if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "debian bookworm\nroot" {
				t.Fatalf("exec = %+v, %v; want \"debian bookworm\\nroot\"", res, err)
			}
			if _, err := c.Upload(ctx, sb.ID, "/root/note.txt", strings.NewReader("headless works")); err != nil {
				t.Fatal(err)
			}
			rc, err := c.Download(ctx, sb.ID, "/root/note.txt")
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || string(b) != "headless works" {
				t.Errorf("download = %q, %v", b, err)
			}
			noDesktop := func(what string, err error) {
				t.Helper()
				var ae *client.APIError
				if !client.IsNoDesktop(err) || !errors.As(err, &ae) || ae.Status != 409 {
					t.Errorf("%s of a headless sandbox = %v, want 409 %s", what, err, client.CodeNoDesktop)
				}
			}
			_, err = c.Screenshot(ctx, sb.ID, client.ScreenshotOptions{})
			noDesktop("screenshot", err)
			noDesktop("click", c.Click(ctx, sb.ID, 10, 10))
			_, err = c.View(ctx, sb.ID, client.ViewRequest{})
			noDesktop("live view", err)
			if err := c.Destroy(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			assertNoTrace(t, d, backend, sb.ID)
		})
	}
}
