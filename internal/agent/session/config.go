package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/agent/detect"
)

// DefaultPath is where the image puts the session config.
const DefaultPath = detect.SessionConfigPath

// Config is the desktop session of an image (/etc/cubicle/session.json).
// Argument strings may hold the placeholders {width}, {height}, {dpi},
// {start_url} and {display}; see Expand.
type Config struct {
	// Display is the X display, ":N".
	Display string `json:"display"`
	// User runs programs that name no user of their own ("" = root).
	User string `json:"user,omitempty"`
	// Xvfb is the X server's argv; it always runs as root.
	Xvfb []string `json:"xvfb"`
	// Programs start once the display is up, each restarted when it exits.
	Programs []Program `json:"programs"`
	// Usable lists the windows that make the desktop complete: until each
	// is up the agent does not call the desktop usable, and cubicled does
	// not answer a create (nor snapshot a boot template). A desktop whose
	// screen answers but whose window manager or browser is still starting
	// loses what an agent types into it. Empty: usable once the screen
	// answers.
	Usable []UsableWindow `json:"usable,omitempty"`
}

// UsableWindow is one window a complete desktop shows.
type UsableWindow struct {
	// Class is the window's WM_CLASS class (as `cubicle windows` shows
	// it), compared without regard to case.
	Class string `json:"class"`
	// Focused: the window must also hold the keyboard focus.
	Focused bool `json:"focused,omitempty"`
}

// Program is one supervised process of the session.
type Program struct {
	Name string   `json:"name"`
	Argv []string `json:"argv"`
	User string   `json:"user,omitempty"`
	// Env ("K=V") is added to the session's environment for this
	// program; it is never read from the config.
	Env []string `json:"-"`
	// OnDemand, when set, runs the program only while something uses the
	// loopback port it serves, instead of all the time.
	OnDemand *OnDemand `json:"on_demand,omitempty"`
}

// OnDemand says when an on-demand program runs: from the moment a
// connection to its port comes through the agent (GET /forward) until
// IdleSeconds after the last such connection has closed. x11vnc is the
// reason: with no viewer it still wakes every few milliseconds to poll the
// screen for changes, the largest share of an idle desktop's CPU, for a
// live view most sandboxes never open.
type OnDemand struct {
	// Port is the TCP port on the sandbox's loopback the program listens on.
	Port int `json:"port"`
	// IdleSeconds is how long the program keeps running after its last
	// connection closed (default DefaultIdleSeconds): a viewer that
	// reconnects, or a page reload, finds it still up.
	IdleSeconds int `json:"idle_seconds,omitempty"`
}

// DefaultIdleSeconds is OnDemand.IdleSeconds when the config gives none.
const DefaultIdleSeconds = 30

// Vars are the placeholder values.
type Vars struct {
	Width, Height, DPI int
	StartURL           string
}

// Environment variables that set Vars.
const (
	EnvWidth    = "CUBICLE_WIDTH"
	EnvHeight   = "CUBICLE_HEIGHT"
	EnvDPI      = "CUBICLE_DPI"
	EnvStartURL = "CUBICLE_START_URL"
)

// VarsFromEnv reads Vars from getenv (os.Getenv), with the defaults
// 1024x768 at 96 dpi and no start URL.
func VarsFromEnv(getenv func(string) string) (Vars, error) {
	v := Vars{Width: 1024, Height: 768, DPI: 96, StartURL: getenv(EnvStartURL)}
	for _, f := range []struct {
		name     string
		dst      *int
		min, max int
	}{
		{EnvWidth, &v.Width, 16, 16384},
		{EnvHeight, &v.Height, 16, 16384},
		{EnvDPI, &v.DPI, 10, 1000},
	} {
		s := getenv(f.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < f.min || n > f.max {
			return Vars{}, fmt.Errorf("%s=%q: want an integer in [%d, %d]", f.name, s, f.min, f.max)
		}
		*f.dst = n
	}
	if strings.ContainsRune(v.StartURL, 0) {
		return Vars{}, fmt.Errorf("%s holds a NUL byte", EnvStartURL)
	}
	return v, nil
}

// Split parts c into the programs that need the session's start URL
// (an argument holds {start_url}) and the rest, each with c's display,
// user and Xvfb: a warm-pool sandbox starts the rest at boot and the
// others once a create has said what its start URL is.
func (c Config) Split() (rest, held Config) {
	rest = Config{Display: c.Display, User: c.User, Xvfb: c.Xvfb, Usable: c.Usable}
	held = rest
	for _, p := range c.Programs {
		if slices.ContainsFunc(p.Argv, func(a string) bool { return strings.Contains(a, "{start_url}") }) {
			held.Programs = append(held.Programs, p)
		} else {
			rest.Programs = append(rest.Programs, p)
		}
	}
	return rest, held
}

// Load reads and validates the config at path.
func Load(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := Parse(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates a config. Unknown fields are errors, so a
// typo in an image does not silently drop a program.
func Parse(b []byte) (Config, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("session config: %w", err)
	}
	if dec.More() {
		return Config{}, errors.New("session config: trailing data")
	}
	if err := c.validate(); err != nil {
		return Config{}, fmt.Errorf("session config: %w", err)
	}
	return c, nil
}

// DisplayNumber returns N of a display ":N".
func DisplayNumber(display string) (int, error) {
	s, ok := strings.CutPrefix(display, ":")
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 0 || n > 65535 || s != strconv.Itoa(n) {
		return 0, fmt.Errorf("display %q: want :N", display)
	}
	return n, nil
}

func (c *Config) validate() error {
	if _, err := DisplayNumber(c.Display); err != nil {
		return err
	}
	if len(c.Xvfb) == 0 || c.Xvfb[0] == "" {
		return errors.New("xvfb: empty argv")
	}
	seen := map[string]bool{}
	ports := map[int]bool{}
	for i, p := range c.Programs {
		if p.Name == "" {
			return fmt.Errorf("programs[%d]: no name", i)
		}
		if seen[p.Name] || p.Name == xvfbName {
			return fmt.Errorf("programs[%d]: duplicate name %q", i, p.Name)
		}
		seen[p.Name] = true
		if len(p.Argv) == 0 || p.Argv[0] == "" {
			return fmt.Errorf("program %q: empty argv", p.Name)
		}
		if d := p.OnDemand; d != nil {
			if d.Port < 1 || d.Port > 65535 {
				return fmt.Errorf("program %q: on_demand.port %d: want 1..65535", p.Name, d.Port)
			}
			if d.IdleSeconds < 0 {
				return fmt.Errorf("program %q: on_demand.idle_seconds %d: want 0 or more", p.Name, d.IdleSeconds)
			}
			if ports[d.Port] {
				return fmt.Errorf("program %q: on_demand.port %d is another program's too", p.Name, d.Port)
			}
			ports[d.Port] = true
		}
	}
	for i, w := range c.Usable {
		if w.Class == "" {
			return fmt.Errorf("usable[%d]: no class", i)
		}
	}
	for _, s := range c.strings() {
		if strings.ContainsRune(s, 0) {
			return errors.New("NUL byte in a string")
		}
	}
	return nil
}

func (c *Config) strings() []string {
	out := append([]string{c.Display, c.User}, c.Xvfb...)
	for _, p := range c.Programs {
		out = append(out, p.Name, p.User)
		out = append(out, p.Argv...)
	}
	return out
}

// Expand returns c with the placeholders in every argv replaced. An
// argument that is exactly "{start_url}" is dropped when StartURL is empty,
// so the browser opens its default page rather than an empty URL. Program
// users default to c.User, then root.
func (c Config) Expand(v Vars) Config {
	r := strings.NewReplacer(
		"{width}", strconv.Itoa(v.Width),
		"{height}", strconv.Itoa(v.Height),
		"{dpi}", strconv.Itoa(v.DPI),
		"{start_url}", v.StartURL,
		"{display}", c.Display,
	)
	argv := func(in []string) []string {
		out := make([]string, 0, len(in))
		for _, a := range in {
			if a == "{start_url}" && v.StartURL == "" {
				continue
			}
			out = append(out, r.Replace(a))
		}
		return out
	}
	out := Config{Display: c.Display, User: c.User, Xvfb: argv(c.Xvfb), Usable: c.Usable}
	for _, p := range c.Programs {
		user := p.User
		if user == "" {
			user = c.User
		}
		if user == "" {
			user = "root"
		}
		out.Programs = append(out.Programs, Program{Name: p.Name, Argv: argv(p.Argv), User: user, Env: p.Env, OnDemand: p.OnDemand})
	}
	return out
}
