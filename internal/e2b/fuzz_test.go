package e2b

import (
	"errors"
	"net/netip"
	"net/url"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// checkUserError fails unless err is a 400 with a user message, the only
// kind of error a decoder may return.
func checkUserError(t *testing.T, err error) {
	t.Helper()
	var se *statusError
	if !errors.As(err, &se) || se.status != 400 || se.msg == "" || !utf8.ValidString(se.msg) {
		t.Fatalf("decoder error %#v is not a 400 with a message", err)
	}
}

func FuzzParseNewSandbox(f *testing.F) {
	for _, s := range []string{
		`{"templateID":"desktop"}`,
		`{"templateID":"desktop","timeout":300,"envVars":{"DISPLAY":":0"},"metadata":{"k":"v"},"secure":true,"allow_internet_access":true}`,
		`{"templateID":"base","allow_internet_access":false,"network":{"allowOut":["1.1.1.1","10.0.0.0/8"],"denyOut":["0.0.0.0/0"]}}`,
		`{"templateID":"desktop","network":{"egressProxy":null,"rules":{},"allowPublicTraffic":false},"mcp":null,"autoPause":false}`,
		`{"templateID":"desktop","autoPause":true}`,
		`{"templateID":"desktop","volumeMounts":[{"name":"v","path":"/p"}]}`,
		`{"templateID":"desktop","timeout":-1}`,
		`{"templateID":"x"}`, `{}`, `null`, `[]`, ``, `{"templateID":"desktop"} {}`,
	} {
		f.Add([]byte(s))
	}
	s := New(Config{}, newFakeManager(), nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := s.parseNewSandbox(data, v2DefaultTimeout)
		if err != nil {
			checkUserError(t, err)
			return
		}
		req := p.req
		switch {
		case p.fromSnapshot():
			// Not a template: the key's snapshot of that ID or name, if
			// it has one, with the snapshot's template and backend.
			if req.FromSnapshot != p.template || req.Template != "" || req.Backend != "" || s.templates[p.template] != "" {
				t.Fatalf("templateID %q taken as snapshot %q, template %q, backend %q", p.template, req.FromSnapshot, req.Template, req.Backend)
			}
		case s.templates[p.template] != req.Template || req.Template == "":
			t.Fatalf("template %q mapped to %q", p.template, req.Template)
		}
		if req.TimeoutSeconds < 1 || req.IdleTimeoutSeconds != idleNever {
			t.Fatalf("timeouts %d / %d", req.TimeoutSeconds, req.IdleTimeoutSeconds)
		}
		if req.TimeoutSeconds > sandbox.MaxTimeoutSeconds {
			t.Fatalf("timeout %d beyond the shared maximum", req.TimeoutSeconds)
		}
		// What was accepted passes the rules every API shares, unchanged.
		if again, err := sandbox.ValidateCreate(req); err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("accepted %+v, which the shared rules give as %+v, %v", req, again, err)
		}
		n := req.Network
		switch {
		case n.Egress == "" && n.Allow == nil, n.Egress == "none" && n.Allow == nil, n.Egress == "all" && n.Allow == nil:
		case n.Egress == "" && len(n.Allow) > 0:
			for _, a := range n.Allow {
				if p, err := netip.ParsePrefix(a); err != nil || p.Masked() != p {
					t.Fatalf("accepted allow entry %q, not a masked CIDR", a)
				}
			}
		default:
			t.Fatalf("network %+v is not one the manager accepts", n)
		}
	})
}

func FuzzParseTimeoutBody(f *testing.F) {
	for _, s := range []string{`{"timeout":60}`, `{"timeout":0}`, `{}`, ``, `{"timeout":-1}`,
		`{"timeout":99999999999}`, `{"timeout":1.5}`, `{"memory":false}`, `null`} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, required bool) {
		n, err := parseTimeoutBody(data, required, v2DefaultTimeout)
		if err != nil {
			checkUserError(t, err)
			return
		}
		if n < 1 {
			t.Fatalf("timeout %d would mean the maximum to the manager", n)
		}
	})
}

func FuzzParseListQuery(f *testing.F) {
	for _, s := range []string{
		"", "state=running,paused&limit=10&order=asc", "metadata=user%253Dabc%2526app%253Dprod",
		"metadata=a%2520b%3Dc%2526d", "nextToken=MjAyNi0wOC0wMVQxMjowMDowMFp8c2Iw", "limit=0",
		"startedAfter=2026-08-01T11:58:00.000Z&template=desktop", "state=dead", "metadata=%zz",
		"nextToken=!!!", "metadata=k&metadata=v",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		vals, _ := url.ParseQuery(raw)
		q, err := parseListQuery(vals)
		if err != nil {
			checkUserError(t, err)
			return
		}
		if q.limit < 1 || q.limit > maxListLimit {
			t.Fatalf("limit %d", q.limit)
		}
		if q.metadata != nil && len(q.metadata) == 0 {
			t.Fatalf("empty non-nil metadata filter")
		}
		for k := range q.metadata {
			if k == "" {
				t.Fatalf("empty metadata key accepted")
			}
		}
		if q.after != nil {
			// A token that decodes names a position a listing can compare.
			c, err := decodeCursor(encodeCursor(sandbox.Sandbox{ID: q.after.id, CreatedAt: q.after.created}))
			if err != nil || c.id != q.after.id || !c.created.Equal(q.after.created) {
				t.Fatalf("cursor %+v does not round-trip: %+v, %v", *q.after, c, err)
			}
		}
	})
}
