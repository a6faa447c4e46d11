package main

import (
	"flag"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testFlags is a flag set with one flag of each kind cubicled has.
type testFlags struct {
	fs      *flag.FlagSet
	dur     *time.Duration
	n       *int
	rate    *float64
	on      *bool
	off     *bool
	name    *string
	level   slog.Level
	cidr    netip.Prefix
	dns     []netip.Addr
	version *bool
}

func newTestFlags() *testFlags {
	f := &testFlags{fs: flag.NewFlagSet("cubicled", flag.ContinueOnError), level: slog.LevelInfo,
		cidr: netip.MustParsePrefix("10.99.0.0/16")}
	f.fs.SetOutput(io.Discard)
	f.dur = f.fs.Duration("idle-timeout", 30*time.Minute, "")
	f.n = f.fs.Int("max-sandboxes", 16, "")
	f.rate = f.fs.Float64("key-create-rate", 0, "")
	f.on = f.fs.Bool("e2b", true, "")
	f.off = f.fs.Bool("net", false, "")
	f.name = f.fs.String("data-dir", "/var/lib/cubicle", "")
	f.fs.Var(levelValue{&f.level}, "log-level", "")
	f.fs.Var(prefixValue{&f.cidr}, "net-cidr", "")
	f.fs.Var(addrsValue{&f.dns}, "net-dns", "")
	f.version = f.fs.Bool("version", false, "")
	return f
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfigBadValues(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want string // the message, or its start where the rest is the parser's own words
	}{
		{map[string]string{"CUBICLE_IDLE_TIMEOUT": "30"},
			`invalid CUBICLE_IDLE_TIMEOUT="30" (for --idle-timeout, want a duration with a unit, such as 90s, 30m or 1h30m): parse error`},
		{map[string]string{"CUBICLE_IDLE_TIMEOUT": "half an hour"},
			`invalid CUBICLE_IDLE_TIMEOUT="half an hour" (for --idle-timeout, want a duration with a unit, such as 90s, 30m or 1h30m): parse error`},
		{map[string]string{"CUBICLE_MAX_SANDBOXES": "abc"},
			`invalid CUBICLE_MAX_SANDBOXES="abc" (for --max-sandboxes, want a whole number): parse error`},
		{map[string]string{"CUBICLE_MAX_SANDBOXES": "1.5"},
			`invalid CUBICLE_MAX_SANDBOXES="1.5" (for --max-sandboxes, want a whole number): parse error`},
		{map[string]string{"CUBICLE_MAX_SANDBOXES": "99999999999999999999"},
			`invalid CUBICLE_MAX_SANDBOXES="99999999999999999999" (for --max-sandboxes, want a whole number): value out of range`},
		{map[string]string{"CUBICLE_KEY_CREATE_RATE": "fast"},
			`invalid CUBICLE_KEY_CREATE_RATE="fast" (for --key-create-rate, want a number): parse error`},
		{map[string]string{"CUBICLE_NET": "maybe"},
			`invalid CUBICLE_NET="maybe" (for --net, want true or false (or 1 or 0)): parse error`},
		{map[string]string{"CUBICLE_E2B": "yes"},
			`invalid CUBICLE_E2B="yes" (for --e2b, want true or false (or 1 or 0)): parse error`},
		{map[string]string{"CUBICLE_LOG_LEVEL": "loud"},
			`invalid CUBICLE_LOG_LEVEL="loud" (for --log-level, want debug, info, warn or error): `},
		{map[string]string{"CUBICLE_NET_CIDR": "10.99.0.0"},
			`invalid CUBICLE_NET_CIDR="10.99.0.0" (for --net-cidr, want a network such as 10.99.0.0/16): `},
		{map[string]string{"CUBICLE_NET_DNS": "9.9.9.9,dns.google"},
			`invalid CUBICLE_NET_DNS="9.9.9.9,dns.google" (for --net-dns, want comma-separated IP addresses such as 9.9.9.9,1.1.1.1): ParseAddr("dns.google")`},
		// Every bad variable is reported, not only the first.
		{map[string]string{"CUBICLE_NET": "2", "CUBICLE_MAX_SANDBOXES": "x"},
			`invalid CUBICLE_MAX_SANDBOXES="x" (for --max-sandboxes, want a whole number): parse error` + "\n" +
				`invalid CUBICLE_NET="2" (for --net, want true or false (or 1 or 0)): parse error`},
	} {
		t.Run(strings.Join(keysOf(tt.env), "+"), func(t *testing.T) {
			f := newTestFlags()
			_, err := parseConfig(f.fs, nil, envOf(tt.env))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error\n %s\nwant\n %s", err, tt.want)
			}
		})
	}
}

func keysOf(m map[string]string) []string {
	var ks []string
	for k, v := range m {
		ks = append(ks, k+"="+v)
	}
	return ks
}

func TestParseConfigGoodValues(t *testing.T) {
	f := newTestFlags()
	c, err := parseConfig(f.fs, []string{"--max-sandboxes=5"}, envOf(map[string]string{
		"CUBICLE_IDLE_TIMEOUT":    "90s",
		"CUBICLE_MAX_SANDBOXES":   "3", // the command line wins
		"CUBICLE_KEY_CREATE_RATE": "0.5",
		"CUBICLE_E2B":             "0",
		"CUBICLE_NET":             "1",
		"CUBICLE_DATA_DIR":        "/tmp/cubicle data",
		"CUBICLE_LOG_LEVEL":       "debug",
		"CUBICLE_NET_CIDR":        "10.7.0.0/24",
		"CUBICLE_NET_DNS":         " 9.9.9.9, 2620:fe::fe ",
		"CUBICLE_VERSION":         "1", // --version has no variable
	}))
	if err != nil {
		t.Fatal(err)
	}
	if *f.dur != 90*time.Second || *f.n != 5 || *f.rate != 0.5 || *f.on || !*f.off || *f.name != "/tmp/cubicle data" ||
		f.level != slog.LevelDebug || f.cidr != netip.MustParsePrefix("10.7.0.0/24") || *f.version {
		t.Errorf("parsed idle %v, max %d, rate %v, e2b %v, net %v, dir %q, level %v, cidr %v, version %v",
			*f.dur, *f.n, *f.rate, *f.on, *f.off, *f.name, f.level, f.cidr, *f.version)
	}
	if d := cmp.Diff([]netip.Addr{netip.MustParseAddr("9.9.9.9"), netip.MustParseAddr("2620:fe::fe")}, f.dns, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("dns (-want +got):\n%s", d)
	}
	for name, want := range map[string]string{
		"idle-timeout":    `CUBICLE_IDLE_TIMEOUT="90s"`,
		"max-sandboxes":   "--max-sandboxes=5",
		"data-dir":        `CUBICLE_DATA_DIR="/tmp/cubicle data"`,
		"key-create-rate": `CUBICLE_KEY_CREATE_RATE="0.5"`,
		"version":         "--version (default false)",
	} {
		if got := c.origin(name); got != want {
			t.Errorf("origin(%s) = %q, want %q", name, got, want)
		}
	}
}

func TestParseConfigEmptyIsUnset(t *testing.T) {
	f := newTestFlags()
	c, err := parseConfig(f.fs, nil, envOf(map[string]string{"CUBICLE_IDLE_TIMEOUT": "", "CUBICLE_NET": ""}))
	if err != nil {
		t.Fatal(err)
	}
	if *f.dur != 30*time.Minute || *f.off {
		t.Errorf("empty variables changed the defaults: idle %v, net %v", *f.dur, *f.off)
	}
	if got, want := c.origin("idle-timeout"), "--idle-timeout (default 30m0s)"; got != want {
		t.Errorf("origin = %q, want %q", got, want)
	}
}

func TestParseConfigCommandLineWinsOverABadVariable(t *testing.T) {
	f := newTestFlags()
	// The variable is never read: the flag says what to use.
	if _, err := parseConfig(f.fs, []string{"--idle-timeout=5m"}, envOf(map[string]string{"CUBICLE_IDLE_TIMEOUT": "30"})); err != nil {
		t.Fatal(err)
	}
	if *f.dur != 5*time.Minute {
		t.Errorf("idle %v, want 5m", *f.dur)
	}
}

func TestEnvName(t *testing.T) {
	for flagName, want := range map[string]string{
		"listen": "CUBICLE_LISTEN", "idle-timeout": "CUBICLE_IDLE_TIMEOUT", "sandbox-max-requests": "CUBICLE_SANDBOX_MAX_REQUESTS",
		"e2b-domain": "CUBICLE_E2B_DOMAIN",
	} {
		if got := envName(flagName); got != want {
			t.Errorf("envName(%q) = %q, want %q", flagName, got, want)
		}
	}
}
