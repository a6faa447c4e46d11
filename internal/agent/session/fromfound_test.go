package session

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/agent/detect"
)

func TestSessionConfig(t *testing.T) {
	if _, ok := FromFound(detect.Found{User: "root"}); ok {
		t.Error("a headless image got a session")
	}
	vars := Vars{Width: 1280, Height: 800, DPI: 120, StartURL: "http://example.test/"}
	for _, tc := range []struct {
		name  string
		found detect.Found
		want  Config
	}{
		{
			name:  "Xvfb with everything",
			found: detect.Found{XServer: "/usr/bin/Xvfb", Session: "/usr/bin/startxfce4", Browser: "/usr/bin/chromium", VNC: "/usr/bin/x11vnc", Bus: "/usr/bin/dbus-run-session", User: "alice", Env: "/usr/bin/env"},
			want: Config{Display: ":0", User: "alice",
				Xvfb: []string{"/usr/bin/Xvfb", ":0", "-screen", "0", "1280x800x24", "-dpi", "120", "-nolisten", "tcp", "-ac"},
				Programs: []Program{
					{Name: "session", Argv: []string{"/usr/bin/env", "XFCE_PANEL_MIGRATE_DEFAULT=1", "/usr/bin/dbus-run-session", "--", "/usr/bin/startxfce4"}, User: "alice"},
					{Name: "browser", Argv: append(append([]string{"/usr/bin/chromium"}, expandAll(chromiumFlags, vars)...), "http://example.test/"), User: "alice"},
					{Name: "vnc", User: "root", Argv: []string{"/usr/bin/x11vnc", "-display", ":0", "-localhost", "-rfbport", "5999",
						"-forever", "-shared", "-nopw", "-quiet", "-nolookup", "-noipv6", "-rfbportv6", "-1"}, OnDemand: &OnDemand{Port: 5999}},
				}},
		},
		{
			name:  "openbox with dbus-launch",
			found: detect.Found{XServer: "/usr/bin/Xvfb", Session: "/usr/bin/openbox", Bus: "/usr/bin/dbus-launch"},
			want: Config{Display: ":0", User: "root",
				Xvfb:     []string{"/usr/bin/Xvfb", ":0", "-screen", "0", "1280x800x24", "-dpi", "120", "-nolisten", "tcp", "-ac"},
				Programs: []Program{{Name: "session", Argv: []string{"/usr/bin/dbus-launch", "--exit-with-session", "/usr/bin/openbox"}, User: "root"}}},
		},
		{
			name:  "Xvnc and Firefox, no window manager",
			found: detect.Found{XServer: "/usr/bin/Xvnc", Browser: "/usr/bin/firefox-esr"},
			want: Config{Display: ":0", User: "root",
				Xvfb: []string{"/usr/bin/Xvnc", ":0", "-geometry", "1280x800", "-depth", "24", "-dpi", "120",
					"-rfbport", "5999", "-localhost", "-SecurityTypes", "None", "-nolisten", "tcp", "-ac"},
				Programs: []Program{{Name: "browser", Argv: []string{"/usr/bin/firefox-esr", "--width", "1280", "--height", "800", "http://example.test/"}, User: "root"}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := FromFound(tc.found)
			if !ok {
				t.Fatal("no session")
			}
			if err := c.validate(); err != nil {
				t.Fatalf("made an invalid config: %v", err)
			}
			if diff := cmp.Diff(tc.want, c.Expand(vars)); diff != "" {
				t.Errorf("expanded session (-want +got):\n%s", diff)
			}
		})
	}
}

func expandAll(args []string, v Vars) []string {
	c := Config{Display: ":0", Xvfb: args}
	return c.Expand(v).Xvfb
}
