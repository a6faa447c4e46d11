package session

import (
	"path"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/agent/detect"
)

// chromiumFlags are what Chromium needs in a sandbox (MACHINE.md): no
// sandbox of its own (it runs as root, or under gVisor), no GPU, and none of
// the first-run and background traffic that floods a closed network.
// DevTools is added only when the session asks for it (Options.DevTools).
var chromiumFlags = []string{
	"--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
	"--disable-dev-shm-usage", "--disable-breakpad", "--password-store=basic",
	"--start-maximized", "--window-position=0,0", "--window-size={width},{height}",
}

// FromFound returns the session that runs what detection found in an image
// without a session config of its own, and false for a headless image (no
// X server).
func FromFound(f detect.Found) (Config, bool) {
	if f.XServer == "" {
		return Config{}, false
	}
	user := f.User
	if user == "" {
		user = "root"
	}
	c := Config{Display: ":0", User: user}
	if detect.IsXvnc(f.XServer) {
		c.Xvfb = []string{f.XServer, ":0", "-geometry", "{width}x{height}", "-depth", "24", "-dpi", "{dpi}",
			"-rfbport", "5999", "-localhost", "-SecurityTypes", "None", "-nolisten", "tcp", "-ac"}
	} else {
		c.Xvfb = []string{f.XServer, ":0", "-screen", "0", "{width}x{height}x24", "-dpi", "{dpi}", "-nolisten", "tcp", "-ac"}
	}
	if f.Session != "" {
		argv := []string{f.Session}
		switch path.Base(f.Bus) {
		case "dbus-run-session":
			argv = append([]string{f.Bus, "--"}, argv...)
		case "dbus-launch":
			argv = append([]string{f.Bus, "--exit-with-session"}, argv...)
		}
		if path.Base(f.Session) == "startxfce4" && f.Env != "" {
			// XFCE's panel asks on its first start whether to use the
			// default layout, in a dialog in the middle of the screen;
			// an agent's screen must not start with that in the way.
			argv = append([]string{f.Env, "XFCE_PANEL_MIGRATE_DEFAULT=1"}, argv...)
		}
		c.Programs = append(c.Programs, Program{Name: "session", Argv: argv})
	}
	if f.Browser != "" {
		var argv []string
		if strings.Contains(path.Base(f.Browser), "firefox") {
			argv = []string{f.Browser, "--width", "{width}", "--height", "{height}", "{start_url}"}
		} else {
			argv = append(append([]string{f.Browser}, chromiumFlags...), "{start_url}")
		}
		c.Programs = append(c.Programs, Program{Name: "browser", Argv: argv})
	}
	if f.VNC != "" {
		c.Programs = append(c.Programs, Program{Name: "vnc", User: "root", Argv: []string{f.VNC,
			"-display", ":0", "-localhost", "-rfbport", "5999", "-forever", "-shared", "-nopw", "-quiet",
			"-nolookup", "-noipv6", "-rfbportv6", "-1"}, OnDemand: &OnDemand{Port: 5999}})
	}
	return c, true
}
