package session

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const imageConfig = `{
  "display": ":0",
  "user": "user",
  "xvfb": ["Xvfb", ":0", "-screen", "0", "{width}x{height}x24", "-dpi", "{dpi}", "-nolisten", "tcp", "-ac"],
  "programs": [
    {"name": "wm", "argv": ["openbox"], "user": "user"},
    {"name": "browser", "argv": ["/usr/local/bin/cubicle-browser", "{start_url}"], "user": "user"},
    {"name": "vnc", "argv": ["x11vnc", "-display", "{display}", "-localhost", "-rfbport", "5900", "-forever", "-shared", "-nopw", "-quiet"], "user": "root", "on_demand": {"port": 5900, "idle_seconds": 5}},
    {"name": "term", "argv": ["sh", "-c", "open {start_url}"]}
  ]
}`

func TestParseExpand(t *testing.T) {
	c, err := Parse([]byte(imageConfig))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		want Config
	}{
		{
			name: "defaults drop an empty start_url",
			want: Config{Display: ":0", User: "user",
				Xvfb: []string{"Xvfb", ":0", "-screen", "0", "1024x768x24", "-dpi", "96", "-nolisten", "tcp", "-ac"},
				Programs: []Program{
					{Name: "wm", Argv: []string{"openbox"}, User: "user"},
					{Name: "browser", Argv: []string{"/usr/local/bin/cubicle-browser"}, User: "user"},
					{Name: "vnc", Argv: []string{"x11vnc", "-display", ":0", "-localhost", "-rfbport", "5900", "-forever", "-shared", "-nopw", "-quiet"}, User: "root", OnDemand: &OnDemand{Port: 5900, IdleSeconds: 5}},
					{Name: "term", Argv: []string{"sh", "-c", "open "}, User: "user"},
				}},
		},
		{
			name: "env values",
			env:  map[string]string{EnvWidth: "1280", EnvHeight: "800", EnvDPI: "144", EnvStartURL: "https://example.com/?a=1&b={x}"},
			want: Config{Display: ":0", User: "user",
				Xvfb: []string{"Xvfb", ":0", "-screen", "0", "1280x800x24", "-dpi", "144", "-nolisten", "tcp", "-ac"},
				Programs: []Program{
					{Name: "wm", Argv: []string{"openbox"}, User: "user"},
					{Name: "browser", Argv: []string{"/usr/local/bin/cubicle-browser", "https://example.com/?a=1&b={x}"}, User: "user"},
					{Name: "vnc", Argv: []string{"x11vnc", "-display", ":0", "-localhost", "-rfbport", "5900", "-forever", "-shared", "-nopw", "-quiet"}, User: "root", OnDemand: &OnDemand{Port: 5900, IdleSeconds: 5}},
					{Name: "term", Argv: []string{"sh", "-c", "open https://example.com/?a=1&b={x}"}, User: "user"},
				}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := VarsFromEnv(func(k string) string { return tt.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, c.Expand(v)); diff != "" {
				t.Errorf("Expand (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := map[string]string{
		"bad display":              `{"display": "0", "xvfb": ["Xvfb"]}`,
		"display garbage":          `{"display": ":01", "xvfb": ["Xvfb"]}`,
		"no xvfb":                  `{"display": ":0", "xvfb": []}`,
		"unknown field":            `{"display": ":0", "xvfb": ["Xvfb"], "extra": 1}`,
		"no name":                  `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"argv": ["a"]}]}`,
		"duplicate":                `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"name": "a", "argv": ["a"]}, {"name": "a", "argv": ["b"]}]}`,
		"named as X":               `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"name": "xvfb", "argv": ["a"]}]}`,
		"empty argv":               `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"name": "a", "argv": []}]}`,
		"NUL":                      `{"display": ":0", "xvfb": ["Xvfb", "a\u0000"]}`,
		"trailing":                 `{"display": ":0", "xvfb": ["Xvfb"]} {}`,
		"not json":                 `display=:0`,
		"usable, no class":         `{"display": ":0", "xvfb": ["Xvfb"], "usable": [{"focused": true}]}`,
		"usable, unknown":          `{"display": ":0", "xvfb": ["Xvfb"], "usable": [{"class": "a", "title": "b"}]}`,
		"on_demand, no port":       `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"name": "a", "argv": ["a"], "on_demand": {}}]}`,
		"on_demand, port 70000":    `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"name": "a", "argv": ["a"], "on_demand": {"port": 70000}}]}`,
		"on_demand, negative idle": `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"name": "a", "argv": ["a"], "on_demand": {"port": 1, "idle_seconds": -1}}]}`,
		"on_demand, same port":     `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"name": "a", "argv": ["a"], "on_demand": {"port": 1}}, {"name": "b", "argv": ["b"], "on_demand": {"port": 1}}]}`,
		"on_demand, unknown":       `{"display": ":0", "xvfb": ["Xvfb"], "programs": [{"name": "a", "argv": ["a"], "on_demand": {"port": 1, "when": "now"}}]}`,
	}
	for name, in := range tests {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: Parse succeeded", name)
		}
	}
}

func TestVarsFromEnvErrors(t *testing.T) {
	for _, env := range []map[string]string{
		{EnvWidth: "wide"}, {EnvHeight: "-1"}, {EnvDPI: "100000"}, {EnvStartURL: "a\x00"},
	} {
		if _, err := VarsFromEnv(func(k string) string { return env[k] }); err == nil {
			t.Errorf("VarsFromEnv(%v) succeeded", env)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(imageConfig), "https://x", 800)
	f.Add([]byte(`{"display": ":1", "xvfb": ["{display}{start_url}"], "programs": [{"name": "p", "argv": ["{start_url}"]}]}`), "", 0)
	f.Fuzz(func(t *testing.T, data []byte, url string, w int) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		e := c.Expand(Vars{Width: w, Height: 1, DPI: 1, StartURL: url})
		if len(e.Programs) != len(c.Programs) {
			t.Fatal("Expand lost a program")
		}
		for _, p := range e.Programs {
			if p.User == "" {
				t.Fatal("program without user")
			}
		}
	})
}

func TestSplit(t *testing.T) {
	c := Config{Display: ":0", User: "user", Xvfb: []string{"Xvfb", ":0"}, Programs: []Program{
		{Name: "wm", Argv: []string{"openbox"}},
		{Name: "browser", Argv: []string{"cubicle-browser", "{start_url}"}},
		{Name: "other", Argv: []string{"sh", "-c", "open --url={start_url}"}},
		{Name: "vnc", Argv: []string{"x11vnc", "-display", "{display}"}},
	}}
	rest, held := c.Split()
	names := func(c Config) (out []string) {
		for _, p := range c.Programs {
			out = append(out, p.Name)
		}
		return out
	}
	if got := names(rest); !slices.Equal(got, []string{"wm", "vnc"}) {
		t.Errorf("rest = %v", got)
	}
	if got := names(held); !slices.Equal(got, []string{"browser", "other"}) {
		t.Errorf("held = %v", got)
	}
	for _, part := range []Config{rest, held} {
		if part.Display != c.Display || part.User != c.User || !slices.Equal(part.Xvfb, c.Xvfb) {
			t.Errorf("part %+v lost the session's display, user or Xvfb", part)
		}
	}
}

// TestImageSessions: the images' own session configs parse, and each
// names the windows of a usable desktop, its browser focused, so that a
// create answers only when keys typed at once reach the browser.
func TestImageSessions(t *testing.T) {
	paths, err := filepath.Glob("../../../images/*/files/etc/cubicle/session.json")
	if err != nil || len(paths) < 2 {
		t.Fatalf("image session configs: %v %v", paths, err)
	}
	for _, p := range paths {
		c, err := Load(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if !slices.ContainsFunc(c.Usable, func(w UsableWindow) bool { return w.Class == "Chromium" && w.Focused }) {
			t.Errorf("%s: usable %+v does not wait for a focused Chromium", p, c.Usable)
		}
		if strings.Contains(p, "/desktop/") && len(c.Usable) < 3 {
			t.Errorf("%s: usable %+v, want XFCE's panel and desktop too", p, c.Usable)
		}
		// The live view's VNC server runs only while someone watches
		// (cubicled forwards to port 5999, api.DefaultVNCPort).
		if !slices.ContainsFunc(c.Programs, func(p Program) bool { return p.Name == "vnc" && p.OnDemand != nil && p.OnDemand.Port == 5999 }) {
			t.Errorf("%s: no vnc program on demand at port 5999", p)
		}
	}
}
