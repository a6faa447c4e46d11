package main

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// parseKV parses repeated K=V arguments into a map. The value may contain
// '=' and be empty; the key may not.
func parseKV(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want KEY=VALUE", p)
		}
		m[k] = v
	}
	return m, nil
}

// parseRegion parses "x,y,w,h" into a region with x, y ≥ 0 and w, h > 0.
func parseRegion(s string) (*client.Region, error) {
	parts := strings.Split(s, ",")
	if len(parts) != 4 {
		return nil, fmt.Errorf("region %q: want x,y,w,h", s)
	}
	var v [4]int
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("region %q: %q is not a number", s, p)
		}
		v[i] = n
	}
	if v[0] < 0 || v[1] < 0 || v[2] <= 0 || v[3] <= 0 {
		return nil, fmt.Errorf("region %q: want x,y ≥ 0 and w,h > 0", s)
	}
	return &client.Region{X: v[0], Y: v[1], W: v[2], H: v[3]}, nil
}

// parseInts parses each argument as an integer coordinate.
func parseInts(args []string) ([]int, error) {
	out := make([]int, len(args))
	for i, a := range args {
		n, err := strconv.Atoi(a)
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", a)
		}
		out[i] = n
	}
	return out, nil
}

// parsePoints parses X1 Y1 X2 Y2 ... into at least two points.
func parsePoints(args []string) ([]client.Point, error) {
	if len(args) < 4 || len(args)%2 != 0 {
		return nil, fmt.Errorf("want at least two points as X1 Y1 X2 Y2 [...], got %d numbers", len(args))
	}
	n, err := parseInts(args)
	if err != nil {
		return nil, err
	}
	pts := make([]client.Point, 0, len(n)/2)
	for i := 0; i < len(n); i += 2 {
		pts = append(pts, client.Point{X: n[i], Y: n[i+1]})
	}
	return pts, nil
}

// parseEgress parses --egress: "none", "all", or a comma-separated list of
// CIDRs (a bare address means just that host).
func parseEgress(s string) (*client.Network, error) {
	switch s {
	case "":
		return nil, nil
	case client.EgressNone, client.EgressAll:
		return &client.Network{Egress: s}, nil
	}
	var allow []string
	for _, c := range strings.Split(s, ",") {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if p, err := netip.ParsePrefix(c); err == nil {
			allow = append(allow, p.String())
			continue
		}
		a, err := netip.ParseAddr(c)
		if err != nil {
			return nil, fmt.Errorf("egress %q: want none, all or CIDR[,CIDR...]", c)
		}
		allow = append(allow, netip.PrefixFrom(a, a.BitLen()).String())
	}
	if len(allow) == 0 {
		return nil, fmt.Errorf("egress %q: want none, all or CIDR[,CIDR...]", s)
	}
	return &client.Network{Allow: allow}, nil
}

// remoteRE matches the "ID:" prefix of a sandbox path in cp; IDs are
// [a-z0-9]+ (API.md), so local paths like ./a:b or C:\x never match.
var remoteRE = regexp.MustCompile(`^([a-z0-9]+):(.*)$`)

// copyDir is the direction of a cp.
type copyDir int

const (
	upload copyDir = iota
	download
)

// copySpec is a parsed cp command line.
type copySpec struct {
	dir    copyDir
	id     string
	remote string // absolute path inside the sandbox
	local  string // local path, or "-" for stdin/stdout
}

// parseCopy works out which of src and dst names a sandbox (ID:/path);
// exactly one must.
func parseCopy(src, dst string) (copySpec, error) {
	sm, dm := remoteRE.FindStringSubmatch(src), remoteRE.FindStringSubmatch(dst)
	switch {
	case sm != nil && dm != nil:
		return copySpec{}, fmt.Errorf("cp: both %q and %q are sandbox paths; one side must be local", src, dst)
	case sm == nil && dm == nil:
		return copySpec{}, fmt.Errorf("cp: neither %q nor %q is a sandbox path (ID:/path)", src, dst)
	case sm != nil:
		if !strings.HasPrefix(sm[2], "/") {
			return copySpec{}, fmt.Errorf("cp: sandbox path %q must be absolute", sm[2])
		}
		if dst == "" {
			return copySpec{}, fmt.Errorf("cp: empty destination")
		}
		return copySpec{dir: download, id: sm[1], remote: sm[2], local: dst}, nil
	default:
		if !strings.HasPrefix(dm[2], "/") {
			return copySpec{}, fmt.Errorf("cp: sandbox path %q must be absolute", dm[2])
		}
		if src == "" {
			return copySpec{}, fmt.Errorf("cp: empty source")
		}
		return copySpec{dir: upload, id: dm[1], remote: dm[2], local: src}, nil
	}
}

// secondsValue is a flag holding a number of seconds, given as a plain
// integer ("3600") or a Go duration ("1h", "90s").
type secondsValue int

func (s *secondsValue) String() string { return strconv.Itoa(int(*s)) }

// Type names the flag's value in help.
func (s *secondsValue) Type() string { return "seconds|duration" }

func (s *secondsValue) Set(v string) error {
	n, err := parseSeconds(v)
	if err != nil {
		return err
	}
	*s = secondsValue(n)
	return nil
}

// parseSeconds parses "3600" or "1h" into whole seconds (rounded up).
func parseSeconds(v string) (int, error) {
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("%q: must not be negative", v)
		}
		return n, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q: want seconds or a duration like 90s, 10m, 1h", v)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q: must not be negative", v)
	}
	return int(math.Ceil(d.Seconds())), nil
}
