package session

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// DevToolsPort is where the sandbox's Chromium serves DevTools (CDP). The
// flag names no address: headful Chromium binds its DevTools server to
// 127.0.0.1 only (and ignores --remote-debugging-address), the loopback of
// the sandbox's own network namespace or VM. Nothing publishes the port:
// cubicled reaches it through the agent channel (GET /forward), as it
// reaches x11vnc for the live view (internal/api/cdp.go).
const DevToolsPort = 9222

// ChromiumFlagsDir is where the desktop image's Chromium launcher
// (/usr/local/bin/cubicle-browser) reads extra flags, one a line.
const ChromiumFlagsDir = "/etc/cubicle/chromium-flags.d"

// devToolsFlagsFile is the agent's file in ChromiumFlagsDir; it sorts
// after an operator's files, so the port cubicled dials is the one used.
const devToolsFlagsFile = "zz-cubicle-devtools"

var devToolsFlag = "--remote-debugging-port=" + strconv.Itoa(DevToolsPort)

// chromiumNames are the executables that are Chromium itself (not a
// launcher script that takes no flags, like cubicle-browser).
var chromiumNames = []string{"chromium", "chromium-browser", "chrome", "google-chrome",
	"google-chrome-stable", "google-chrome-beta", "google-chrome-unstable"}

// withDevTools returns p with DevToolsPort added when p runs Chromium
// itself and sets no remote debugging of its own.
func withDevTools(p Program) Program {
	if len(p.Argv) == 0 || !slices.Contains(chromiumNames, path.Base(p.Argv[0])) {
		return p
	}
	if slices.ContainsFunc(p.Argv, func(a string) bool { return strings.HasPrefix(a, "--remote-debugging-") }) {
		return p
	}
	argv := append([]string{p.Argv[0], devToolsFlag}, p.Argv[1:]...)
	p.Argv = argv
	return p
}

// writeDevToolsFlags turns DevTools on for a Chromium started by the
// image's launcher: it writes the flag into dir when dir exists (an image
// without it has no such launcher), and leaves a file that already says so
// alone. The image's own files stay as they are; the flag is the agent's,
// so an image built before DevTools existed gets it too.
func writeDevToolsFlags(dir string) error {
	if st, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) || err == nil && !st.IsDir() {
		return nil
	} else if err != nil {
		return err
	}
	want := "# Written by cubicle-agent: Chromium's DevTools on the sandbox's loopback, for cubicled's CDP endpoint.\n" + devToolsFlag + "\n"
	p := filepath.Join(dir, devToolsFlagsFile)
	if b, err := os.ReadFile(p); err == nil && string(b) == want {
		return nil
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(want), 0o644); err != nil {
		return fmt.Errorf("devtools flags: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("devtools flags: %w", err)
	}
	return nil
}

// devToolsPrograms returns a copy of progs with withDevTools applied.
func devToolsPrograms(progs []Program) []Program {
	out := make([]Program, len(progs))
	for i, p := range progs {
		out[i] = withDevTools(p)
	}
	return out
}
