// Package detect finds what a root filesystem has for a desktop session:
// an X server, a session or window manager, a browser, a VNC server and a
// D-Bus session launcher. An image made for cubicle says how to run its
// desktop in /etc/cubicle/session.json; an image that knows nothing of
// cubicle (a `docker export` of someone's own Dockerfile build) says
// nothing, and the agent runs what Detect finds (internal/agent/session
// makes the session of it).
//
// Detection only reads files, so the image tools run it on an unpacked
// rootfs on the host (to record in image.json what was found) and the agent
// runs it on its own root at start: both see the same thing. Every path is
// resolved inside the root, symlinks included, so detecting an image on the
// host never reads the host's own files. It imports only the standard
// library: the daemon, the CLI and the agent all use it.
package detect

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// SessionConfigPath is where an image made for cubicle keeps its session
// config.
const SessionConfigPath = "/etc/cubicle/session.json"

// Found is what a root filesystem has for a desktop session: absolute paths
// inside that filesystem, "" for what it lacks.
type Found struct {
	// Config is true when the image has its own session config; the
	// other fields then say only what detection would have used.
	Config bool `json:"session_config"`
	// XServer is Xvfb or Xvnc (TigerVNC's, which serves VNC itself).
	XServer string `json:"x_server,omitempty"`
	// Session is the desktop session or window manager: startxfce4,
	// openbox, or another plain window manager.
	Session string `json:"session,omitempty"`
	// Browser is Chromium, Google Chrome or Firefox.
	Browser string `json:"browser,omitempty"`
	// VNC is x11vnc, for the live view of an Xvfb display.
	VNC string `json:"vnc,omitempty"`
	// Bus starts a D-Bus session bus for the session (dbus-run-session or
	// dbus-launch): XFCE's session manager starts nothing without one, as
	// a display manager would have given it.
	Bus string `json:"session_bus,omitempty"`
	// User runs the session's programs: the image's first ordinary user,
	// or root.
	User string `json:"user,omitempty"`
	// Env is env(1) in the image, to set a variable for a program; "" if
	// it has none.
	Env string `json:"-"`
}

// Desktop reports whether a sandbox of this image has a desktop. Without
// an X server it is headless: commands and files work, screenshots and
// input cannot.
func (f Found) Desktop() bool { return f.Config || f.XServer != "" }

// binDirs are searched in order, as a login shell's PATH would be.
var binDirs = []string{"/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"}

// Candidates, most preferred first.
var (
	xServers = []string{"Xvfb", "Xvnc", "Xtigervnc"}
	sessions = []string{"startxfce4", "openbox", "fluxbox", "icewm", "jwm", "xfwm4", "matchbox-window-manager", "twm"}
	browsers = []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome", "firefox-esr", "firefox"}
)

// Detect reports what the root filesystem at root has for a desktop. Paths
// are resolved inside root, symlinks included (an absolute link target
// means root/target), so detecting an unpacked image on the host never
// looks at the host's own files.
func Detect(root string) (Found, error) {
	var f Found
	if _, err := resolve(root, SessionConfigPath); err == nil {
		f.Config = true
	}
	var err error
	pick := func(dst *string, names []string) {
		for _, n := range names {
			p, lerr := lookPath(root, n)
			if lerr == nil {
				*dst = p
				return
			}
			if !errors.Is(lerr, fs.ErrNotExist) && err == nil {
				err = lerr
			}
		}
	}
	pick(&f.XServer, xServers)
	pick(&f.Session, sessions)
	pick(&f.Browser, browsers)
	if f.XServer != "" && !IsXvnc(f.XServer) {
		pick(&f.VNC, []string{"x11vnc"})
	}
	if f.Session != "" {
		pick(&f.Bus, []string{"dbus-run-session", "dbus-launch"})
	}
	pick(&f.Env, []string{"env"})
	f.User = firstUser(root)
	if err != nil {
		return f, fmt.Errorf("detect desktop programs: %w", err)
	}
	return f, nil
}

// IsXvnc reports whether the X server at p is TigerVNC's, which serves VNC
// itself.
func IsXvnc(p string) bool {
	b := path.Base(p)
	return b == "Xvnc" || b == "Xtigervnc"
}

// lookPath finds the executable name in binDirs inside root and returns
// its path there. A directory that cannot be looked in (a link loop, a file where a
// directory should be) is skipped, as a shell's PATH search skips it, and
// its error is returned only when no other directory has the program.
func lookPath(root, name string) (string, error) {
	var firstErr error
	for _, d := range binDirs {
		p := path.Join(d, name)
		fi, err := resolve(root, p)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) && firstErr == nil {
				firstErr = err
			}
			continue
		}
		if fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	if firstErr != nil {
		return "", firstErr
	}
	return "", fmt.Errorf("%s: %w", name, fs.ErrNotExist)
}

// resolve stats the path p (absolute, inside root), following symlinks
// inside root.
func resolve(root, p string) (fs.FileInfo, error) {
	real, err := realPath(root, p)
	if err != nil {
		return nil, err
	}
	return os.Lstat(onHost(root, real))
}

// realPath resolves every symlink of the path p inside root: an absolute
// link target means root/target, and ".." never climbs above root.
func realPath(root, p string) (string, error) {
	out := "/"
	rest := strings.Split(p, "/")
	for hops := 0; len(rest) > 0; {
		el := rest[0]
		rest = rest[1:]
		switch el {
		case "", ".":
			continue
		case "..":
			out = path.Dir(out)
			continue
		}
		next := path.Join(out, el)
		fi, err := os.Lstat(onHost(root, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			out = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(onHost(root, next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			out = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return out, nil
}

// onHost is where the path p inside root is on this machine.
func onHost(root, p string) string {
	return filepath.Join(root, filepath.FromSlash(path.Clean("/"+p)))
}

// firstUser returns the first ordinary account (uid 1000-59999 with a home
// directory) in root's /etc/passwd, or root.
func firstUser(root string) string {
	real, err := realPath(root, "/etc/passwd")
	if err != nil {
		return "root"
	}
	f, err := os.Open(onHost(root, real)) // no symlink left on the way
	if err != nil {
		return "root"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 7 {
			continue
		}
		uid, err := strconv.Atoi(fields[2])
		if err != nil || uid < 1000 || uid >= 60000 {
			continue
		}
		if strings.HasSuffix(fields[6], "nologin") || strings.HasSuffix(fields[6], "false") {
			continue
		}
		if fi, err := resolve(root, fields[5]); err == nil && fi.IsDir() {
			return fields[0]
		}
	}
	return "root"
}
