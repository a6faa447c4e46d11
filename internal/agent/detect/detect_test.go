package detect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// rootfs makes a fake root filesystem: "path" → "" (an executable file),
// "->target" (a symlink), "dir/" (a directory) or any other content (a
// plain 0644 file).
func rootfs(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, what := range files {
		host := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(p, "/"):
			err = os.MkdirAll(host, 0o755)
		case what == "":
			err = os.WriteFile(host, []byte("#!/bin/sh\n"), 0o755)
		case strings.HasPrefix(what, "->"):
			err = os.Symlink(strings.TrimPrefix(what, "->"), host)
		default:
			err = os.WriteFile(host, []byte(what), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const passwd = "root:x:0:0:root:/root:/bin/bash\n" +
	"daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n" +
	"ghost:x:1001:1001::/home/ghost:/bin/bash\n" + // no home directory: skipped
	"alice:x:1000:1000::/home/alice:/bin/bash\n" +
	"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  Found
	}{
		{
			name:  "empty: headless, run as root",
			files: map[string]string{"etc/": ""},
			want:  Found{User: "root"},
		},
		{
			name: "Xvfb, openbox, Chromium, x11vnc and a user (the seed system's image)",
			files: map[string]string{
				"usr/bin/Xvfb": "", "usr/bin/openbox": "", "usr/bin/chromium": "", "usr/bin/x11vnc": "",
				"etc/passwd": passwd, "home/alice/": "",
			},
			want: Found{XServer: "/usr/bin/Xvfb", Session: "/usr/bin/openbox", Browser: "/usr/bin/chromium", VNC: "/usr/bin/x11vnc", User: "alice"},
		},
		{
			name: "XFCE preferred over a plain window manager; merged /usr",
			files: map[string]string{
				"bin": "->usr/bin", "usr/bin/Xvfb": "", "usr/bin/startxfce4": "", "usr/bin/xfwm4": "", "usr/bin/dbus-run-session": "", "usr/bin/dbus-launch": "",
				"usr/bin/openbox": "", "usr/bin/firefox-esr": "->../lib/firefox-esr/firefox-esr", "usr/lib/firefox-esr/firefox-esr": "",
			},
			want: Found{XServer: "/usr/bin/Xvfb", Session: "/usr/bin/startxfce4", Browser: "/usr/bin/firefox-esr", Bus: "/usr/bin/dbus-run-session", User: "root"},
		},
		{
			name: "TigerVNC through the alternatives system serves VNC itself",
			files: map[string]string{
				"usr/bin/Xvnc": "->/etc/alternatives/Xvnc", "etc/alternatives/Xvnc": "->/usr/bin/Xtigervnc",
				"usr/bin/Xtigervnc": "", "usr/bin/x11vnc": "", "usr/bin/google-chrome": "->/opt/google/chrome/google-chrome",
				"opt/google/chrome/google-chrome": "",
			},
			want: Found{XServer: "/usr/bin/Xvnc", Browser: "/usr/bin/google-chrome", User: "root"},
		},
		{
			name: "links resolve inside the image, never on the host",
			files: map[string]string{
				"usr/bin/Xvfb":     "->/bin/sh",            // the host has /bin/sh; the image does not
				"usr/bin/chromium": "->../../../../bin/sh", // .. stops at the image's root
				"usr/bin/openbox":  "not executable",
			},
			want: Found{User: "root"},
		},
		{
			name:  "an image made for cubicle has its own session config",
			files: map[string]string{"etc/cubicle/session.json": "{}", "usr/bin/Xvfb": ""},
			want:  Found{Config: true, XServer: "/usr/bin/Xvfb", User: "root"},
		},
		{
			name:  "a symlink loop is not an executable",
			files: map[string]string{"usr/bin/Xvfb": "->/usr/bin/Xvnc", "usr/bin/Xvnc": "->/usr/bin/Xvfb"},
			want:  Found{User: "root"},
		},
		{
			name: "a directory that cannot be looked in does not hide the others",
			files: map[string]string{
				"usr/local/bin": "->/usr/local/bin", // a loop
				"usr/bin/Xvfb":  "", "usr/bin/env": "",
			},
			want: Found{XServer: "/usr/bin/Xvfb", User: "root", Env: "/usr/bin/env"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Detect(rootfs(t, tc.files))
			if err != nil && !strings.Contains(err.Error(), "too many levels") {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Detect (-want +got):\n%s", diff)
			}
			if got.Desktop() != (tc.want.XServer != "" || tc.want.Config) {
				t.Errorf("Desktop() = %v", got.Desktop())
			}
		})
	}
}

// TestDetectNeverReadsTheHost runs detection on an image whose /etc/passwd
// and /usr/bin/Xvfb are absolute links to files that exist only outside it,
// on the host: what they name must not be found.
func TestDetectNeverReadsTheHost(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "passwd"), []byte("hostonly:x:1000:1000::/home/hostonly:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "Xvfb"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, files := range map[string]map[string]string{
		"absolute links": {
			"etc/passwd": "->" + filepath.Join(outside, "passwd"), "usr/bin/Xvfb": "->" + filepath.Join(outside, "Xvfb"),
			"home/hostonly/": "",
		},
		"a linked directory": {
			"etc": "->" + outside, "usr/bin": "->" + outside, "home/hostonly/": "",
		},
		"dot-dot above the root": {
			"etc/passwd": "->../../../../../../.." + filepath.Join(outside, "passwd"), "home/hostonly/": "",
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, _ := Detect(rootfs(t, files))
			if got.User != "root" || got.XServer != "" {
				t.Errorf("Detect = %+v: read the host's files", got)
			}
		})
	}
}
