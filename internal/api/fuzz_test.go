package api

import (
	"net/netip"
	"net/url"
	"path"
	"reflect"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

func FuzzParseCreateRequest(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"template":"desktop","backend":"gvisor","resolution":{"width":1024,"height":768},"dpi":96}`,
		`{"network":{"egress":{"allow":["10.0.0.0/8","::1"]}}}`,
		`{"network":{"egress":"none"},"env":{"A":"b"},"metadata":{"k":"v"}}`,
		`{"start_url":"https://example.org","timeout_seconds":60}`,
		`{"network":{"egress":{"allow":[]}}}`,
		`{"volumes":[{"name":"profile","path":"/home/user"},{"name":"data","path":"/data"}]}`,
		`{"volumes":[{"name":"../v","path":"/proc"}]}`,
		`[1,2]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := parseCreateRequest(data)
		if err != nil {
			if he := classify(err); he.status != 400 || he.code != codeInvalid || he.msg == "" {
				t.Fatalf("error %v maps to %d %q %q", err, he.status, he.code, he.msg)
			}
			return
		}
		if req.VCPUs < 0 || req.VCPUs > sandbox.MaxVCPUs || req.TimeoutSeconds < 0 || req.IdleTimeoutSeconds < 0 {
			t.Fatalf("accepted out-of-range request %+v", req)
		}
		if r := req.Resolution; r != (sandbox.Resolution{}) &&
			(r.Width < sandbox.MinWidth || r.Width > sandbox.MaxWidth || r.Height < sandbox.MinHeight || r.Height > sandbox.MaxHeight) {
			t.Fatalf("accepted resolution %+v", r)
		}
		n := req.Network
		if n.Egress != "" && n.Egress != "none" && n.Egress != "all" || n.Egress != "" && len(n.Allow) > 0 {
			t.Fatalf("accepted network %+v", n)
		}
		for _, c := range n.Allow {
			if p, err := netip.ParsePrefix(c); err != nil || p.Masked() != p {
				t.Fatalf("accepted allow entry %q, not a masked CIDR", c)
			}
		}
		// What was accepted passes the shared rules unchanged.
		if again, err := sandbox.ValidateCreate(req); err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("accepted %+v, which the shared rules give as %+v, %v", req, again, err)
		}
	})
}

func FuzzParseScreenshotQuery(f *testing.F) {
	for _, s := range []string{
		"", "format=jpeg&quality=80", "scale=0.5", "width=640", "x=1&y=2&w=3&h=4", "cursor=true",
		"scale=NaN", "format=png&format=jpeg", "w=-1&h=2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		req, err := parseScreenshotQuery(q)
		if err != nil {
			if he := classify(err); he.status != 400 {
				t.Fatalf("error %v maps to %d", err, he.status)
			}
			return
		}
		if f := req.GetFormat(); f != "png" && f != "jpeg" {
			t.Fatalf("format %q", f)
		}
		if req.GetQuality() > 100 {
			t.Fatalf("quality %d", req.GetQuality())
		}
		if s := req.GetScale(); s != 0 && !(s >= 0.1 && s <= 1) {
			t.Fatalf("scale %v", s)
		}
		if r := req.GetRegion(); r != nil && (r.GetX() < 0 || r.GetY() < 0 || r.GetW() < 1 || r.GetH() < 1) {
			t.Fatalf("region %v", r)
		}
	})
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "/root/a", "../x", "/a/../b", "/a//b/./c/", "a", "/\x00", "/..."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := cleanPath(p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/") || path.Clean(got) != got || strings.ContainsRune(got, 0) {
			t.Fatalf("cleanPath(%q) = %q", p, got)
		}
		for _, seg := range strings.Split(got, "/") {
			if seg == ".." {
				t.Fatalf("cleanPath(%q) = %q has ..", p, got)
			}
		}
		if strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
			t.Fatalf("cleanPath(%q) accepted a .. component", p)
		}
	})
}

func FuzzExecRequest(f *testing.F) {
	for _, s := range []string{
		`{"command":"echo hi"}`, `{"argv":["ls","-la"]}`, `{"command":"x","argv":[]}`, `{"argv":[""]}`,
		`{"command":"x","env":{"A":"b"},"cwd":"/root","user":"root","timeout_seconds":5,"stdin":"x","background":true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var in execRequest
		if err := decodeStrict(data, &in); err != nil {
			return
		}
		if err := in.validate(); err != nil {
			if he := classify(err); he.status != 400 {
				t.Fatalf("error %v maps to %d", err, he.status)
			}
			return
		}
		if (in.Command == "") == (len(in.Argv) == 0) || len(in.Argv) > 0 && in.Argv[0] == "" {
			t.Fatalf("accepted %+v", in)
		}
	})
}
