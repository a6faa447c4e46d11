package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// Every flag but those in noEnv can also be set by an environment variable,
// envName of the flag: --idle-timeout is CUBICLE_IDLE_TIMEOUT. A flag on the
// command line wins over its variable. A variable is parsed by its flag's
// own parser, so a value the flag would refuse (CUBICLE_IDLE_TIMEOUT=30,
// without a unit) stops the daemon at start, naming the variable and the
// value, instead of leaving the default in place without a word. An empty
// variable counts as unset.

// noEnv are the flags without an environment variable.
var noEnv = map[string]bool{"version": true}

// envName is the environment variable of the flag called name.
func envName(name string) string {
	return "CUBICLE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// config knows where each flag's value came from, for messages.
type config struct {
	fs      *flag.FlagSet
	fromEnv map[string]string // flag name → the variable's value
	onCmd   map[string]bool   // flags given on the command line
}

// parseConfig parses args (the command line, without the program name) into
// fs, then sets every flag not given there from its environment variable
// (read with getenv). All variables that do not parse are reported together.
func parseConfig(fs *flag.FlagSet, args []string, getenv func(string) string) (*config, error) {
	c := &config{fs: fs, fromEnv: map[string]string{}, onCmd: map[string]bool{}}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) { c.onCmd[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if noEnv[f.Name] || c.onCmd[f.Name] {
			return
		}
		v := getenv(envName(f.Name))
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("invalid %s=%q (for --%s, want %s): %w", envName(f.Name), v, f.Name, expects(f), err))
			return
		}
		c.fromEnv[f.Name] = v
	})
	return c, errors.Join(errs...)
}

// origin says where flag name's value came from, for an error about it:
// `CUBICLE_DISK_MB="-1"`, `--disk-mb=-1` or `--disk-mb (default 4096)`.
func (c *config) origin(name string) string {
	if v, ok := c.fromEnv[name]; ok {
		return fmt.Sprintf("%s=%q", envName(name), v)
	}
	f := c.fs.Lookup(name)
	if c.onCmd[name] {
		return fmt.Sprintf("--%s=%s", name, f.Value)
	}
	return fmt.Sprintf("--%s (default %s)", name, f.Value)
}

// expects describes the values flag f takes.
func expects(f *flag.Flag) string {
	if e, ok := f.Value.(interface{ expects() string }); ok {
		return e.expects()
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "a value its flag takes"
	}
	switch g.Get().(type) {
	case time.Duration:
		return "a duration with a unit, such as 90s, 30m or 1h30m"
	case bool:
		return "true or false (or 1 or 0)"
	case int:
		return "a whole number"
	case float64:
		return "a number"
	}
	return "a value its flag takes"
}

// levelValue is a log level flag: debug, info, warn or error.
type levelValue struct{ l *slog.Level }

func (v levelValue) String() string {
	if v.l == nil {
		return ""
	}
	return strings.ToLower(v.l.String())
}

func (v levelValue) Set(s string) error { return v.l.UnmarshalText([]byte(s)) }

func (levelValue) expects() string { return "debug, info, warn or error" }

// prefixValue is an IP network flag (--net-cidr).
type prefixValue struct{ p *netip.Prefix }

func (v prefixValue) String() string {
	if v.p == nil || !v.p.IsValid() {
		return ""
	}
	return v.p.String()
}

func (v prefixValue) Set(s string) error {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return err
	}
	*v.p = p
	return nil
}

func (prefixValue) expects() string { return "a network such as 10.99.0.0/16" }

// addrsValue is a flag of comma-separated IP addresses (--net-dns); each
// Set replaces the list.
type addrsValue struct{ addrs *[]netip.Addr }

func (v addrsValue) String() string {
	if v.addrs == nil {
		return ""
	}
	s := make([]string, len(*v.addrs))
	for i, a := range *v.addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

func (v addrsValue) Set(s string) error {
	var out []netip.Addr
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil {
			return err
		}
		out = append(out, a)
	}
	*v.addrs = out
	return nil
}

func (addrsValue) expects() string { return "comma-separated IP addresses such as 9.9.9.9,1.1.1.1" }

// poolsValue is --pool: warm pools, comma-separated or the flag repeated.
type poolsValue struct{ pools *[]sandbox.PoolSpec }

func (v poolsValue) String() string {
	if v.pools == nil {
		return ""
	}
	s := make([]string, len(*v.pools))
	for i, p := range *v.pools {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (v poolsValue) Set(s string) error {
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		p, err := sandbox.ParsePoolSpec(part)
		if err != nil {
			return errors.New(errdefs.UserMessage(err))
		}
		*v.pools = append(*v.pools, p)
	}
	return nil
}
