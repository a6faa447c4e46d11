package session

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/agent/reap"
)

func TestWithDevTools(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		want []string
	}{
		{"chromium", []string{"/usr/bin/chromium", "--no-sandbox", "{start_url}"},
			[]string{"/usr/bin/chromium", "--remote-debugging-port=9222", "--no-sandbox", "{start_url}"}},
		{"google chrome", []string{"google-chrome-stable"}, []string{"google-chrome-stable", "--remote-debugging-port=9222"}},
		{"a launcher script: the flags file's job", []string{"/usr/local/bin/cubicle-browser", "{start_url}"},
			[]string{"/usr/local/bin/cubicle-browser", "{start_url}"}},
		{"firefox", []string{"/usr/bin/firefox", "--width", "1280"}, []string{"/usr/bin/firefox", "--width", "1280"}},
		{"the image chose its own", []string{"/usr/bin/chromium", "--remote-debugging-pipe"}, []string{"/usr/bin/chromium", "--remote-debugging-pipe"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Program{Name: "browser", Argv: slices.Clone(tc.argv)}
			got := withDevTools(in)
			if diff := cmp.Diff(tc.want, got.Argv); diff != "" {
				t.Errorf("argv (-want +got):\n%s", diff)
			}
			if !slices.Equal(in.Argv, tc.argv) {
				t.Errorf("the input was changed: %q", in.Argv)
			}
		})
	}
	// A session from detection has the flag once.
	p := withDevTools(Program{Argv: append([]string{"/usr/bin/chromium"}, chromiumFlags...)})
	if n := strings.Count(strings.Join(p.Argv, " "), "--remote-debugging-port="); n != 1 {
		t.Errorf("detected Chromium has %d DevTools flags, want 1: %q", n, p.Argv)
	}
}

func TestWriteDevToolsFlags(t *testing.T) {
	dir := t.TempDir()
	if err := writeDevToolsFlags(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("no flags directory: %v, want nothing done", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("the flags directory was made: %v", err)
	}
	for range 2 { // the second time finds it written
		if err := writeDevToolsFlags(dir); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, devToolsFlagsFile))
	if err != nil {
		t.Fatal(err)
	}
	// cubicle-browser takes each line that is not empty or a comment.
	var flags []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			flags = append(flags, l)
		}
	}
	if !slices.Equal(flags, []string{"--remote-debugging-port=9222"}) {
		t.Errorf("flags file %q gives %q", b, flags)
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 {
		t.Errorf("%d files in the flags directory, want 1", len(es))
	}
	// New with DevTools writes it, and gives a Chromium it runs itself
	// the flag; without, neither (a listening socket keeps gVisor from
	// checkpointing the sandbox).
	for _, on := range []bool{false, true} {
		fresh := t.TempDir()
		sup, err := New(Config{Display: ":9", Xvfb: []string{"Xvfb"}, Programs: []Program{{Name: "browser", Argv: []string{"chromium"}}}},
			Options{Reaper: &reap.Reaper{}, ChromiumFlagsDir: fresh, DevTools: on}) // New starts nothing
		if err != nil {
			t.Fatal(err)
		}
		if got := sup.cfg.Programs[0].Argv; slices.Contains(got, "--remote-debugging-port=9222") != on {
			t.Errorf("DevTools %v: supervised Chromium argv %q", on, got)
		}
		if _, err := os.Stat(filepath.Join(fresh, devToolsFlagsFile)); (err == nil) != on {
			t.Errorf("DevTools %v: flags file: %v", on, err)
		}
		sup.cancel()
	}
}
