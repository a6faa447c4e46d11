package e2b

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// jsEncodeURIComponent is JavaScript's encodeURIComponent.
func jsEncodeURIComponent(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// jsMetadataQuery builds the metadata parameter as the JS SDK sends it:
// each key and value encodeURIComponent'ed, the pairs serialised by
// URLSearchParams, and that string encoded once more as a query value.
func jsMetadataQuery(pairs ...string) string {
	var parts []string
	for i := 0; i < len(pairs); i += 2 {
		k, v := jsEncodeURIComponent(pairs[i]), jsEncodeURIComponent(pairs[i+1])
		parts = append(parts, url.QueryEscape(k)+"="+url.QueryEscape(v))
	}
	return "metadata=" + jsEncodeURIComponent(strings.Join(parts, "&"))
}

// listFixture is a set of sandboxes for the list tests: ten running ones a
// minute apart (sb00 oldest), two with the same creation time, and some
// that listings must leave out.
func listFixture(f *fakeManager) {
	for i := range 10 {
		sb := running(fmt.Sprintf("sb%02d", i))
		sb.CreatedAt = t0.Add(time.Duration(i-10) * time.Minute)
		sb.Metadata = map[string]string{"parity": []string{"even", "odd"}[i%2]}
		if i == 3 {
			sb.Metadata["user name"] = "a&b=c d"
		}
		if i == 4 {
			sb.Template = "base"
		}
		f.add(sb)
	}
	twin := running("sb10")
	twin.CreatedAt = t0.Add(-time.Minute) // as old as sb09
	twin.Metadata = map[string]string{"parity": "even", "empty": ""}
	f.add(twin)
	for _, st := range []sandbox.State{sandbox.StateStopping, sandbox.StateStopped, sandbox.StateFailed} {
		sb := running("gone-" + string(st))
		sb.State = st
		sb.Metadata = map[string]string{"parity": "even"}
		f.add(sb)
	}
}

func TestListV2(t *testing.T) {
	tests := []struct {
		name      string
		query     string
		want      []string // sandbox IDs of the answer, in order
		wantTotal string   // X-Total-Running
		wantNext  bool
		status    int
		wantMsg   string
	}{
		{name: "all, newest first, ties by ID", query: "", want: []string{"sb09", "sb10", "sb08", "sb07", "sb06", "sb05", "sb04", "sb03", "sb02", "sb01", "sb00"}, wantTotal: "11"},
		{name: "oldest first", query: "order=asc", want: []string{"sb00", "sb01", "sb02", "sb03", "sb04", "sb05", "sb06", "sb07", "sb08", "sb09", "sb10"}, wantTotal: "11"},
		{name: "state running,paused", query: "state=running,paused", want: []string{"sb09", "sb10", "sb08", "sb07", "sb06", "sb05", "sb04", "sb03", "sb02", "sb01", "sb00"}, wantTotal: "11"},
		{name: "state repeated", query: "state=paused&state=running&limit=1", want: []string{"sb09"}, wantTotal: "11", wantNext: true},
		{name: "only paused: none", query: "state=paused", want: []string{}, wantTotal: "0"},
		{name: "metadata as the JS SDK sends it", query: jsMetadataQuery("parity", "odd"), want: []string{"sb09", "sb07", "sb05", "sb03", "sb01"}, wantTotal: "5"},
		{name: "metadata with reserved characters", query: jsMetadataQuery("user name", "a&b=c d", "parity", "odd"), want: []string{"sb03"}, wantTotal: "1"},
		{name: "metadata encoded once", query: "metadata=" + url.QueryEscape("parity=even"), want: []string{"sb10", "sb08", "sb06", "sb04", "sb02", "sb00"}, wantTotal: "6"},
		{name: "metadata key must exist", query: jsMetadataQuery("empty", ""), want: []string{"sb10"}, wantTotal: "1"},
		{name: "metadata without a match", query: jsMetadataQuery("parity", "none"), want: []string{}, wantTotal: "0"},
		{name: "template by E2B name", query: "template=base", want: []string{"sb04"}, wantTotal: "1"},
		{name: "template nobody uses", query: "template=other", want: []string{}, wantTotal: "0"},
		{name: "started after", query: "startedAfter=" + url.QueryEscape(t0.Add(-2*time.Minute).Format(time.RFC3339)), want: []string{"sb09", "sb10", "sb08"}, wantTotal: "3"},
		{name: "started after, JS toISOString", query: "startedAfter=2026-08-01T11:58:00.000Z", want: []string{"sb09", "sb10", "sb08"}, wantTotal: "3"},
		{name: "limit", query: "limit=3", want: []string{"sb09", "sb10", "sb08"}, wantTotal: "11", wantNext: true},
		{name: "limit equal to the count has no next page", query: "limit=11", want: []string{"sb09", "sb10", "sb08", "sb07", "sb06", "sb05", "sb04", "sb03", "sb02", "sb01", "sb00"}, wantTotal: "11"},
		{name: "limit over 100 is capped, not refused", query: "limit=1000", want: []string{"sb09", "sb10", "sb08", "sb07", "sb06", "sb05", "sb04", "sb03", "sb02", "sb01", "sb00"}, wantTotal: "11"},
		{name: "limit 0", query: "limit=0", status: 400, wantMsg: "limit must be"},
		{name: "limit not a number", query: "limit=ten", status: 400, wantMsg: "limit must be"},
		{name: "bad state", query: "state=running,dead", status: 400, wantMsg: `not "dead"`},
		{name: "bad order", query: "order=up", status: 400, wantMsg: "order must be"},
		{name: "bad startedAfter", query: "startedAfter=yesterday", status: 400, wantMsg: "startedAfter"},
		{name: "bad nextToken", query: "nextToken=!!!", status: 400, wantMsg: "invalid nextToken"},
		{name: "forged nextToken", query: "nextToken=bm9wZQ", status: 400, wantMsg: "invalid nextToken"},
		{name: "bad metadata", query: "metadata=novalue", status: 400, wantMsg: "not a key=value pair"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			listFixture(f)
			rec := do(t, s, "GET", "/v2/sandboxes?"+tt.query, "", nil)
			if tt.status != 0 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, tt.wantMsg)
				return
			}
			if rec.Code != 200 {
				t.Fatalf("status %d (body %s)", rec.Code, rec.Body)
			}
			items := decodeArray(t, rec.Body.Bytes())
			got := []string{}
			for _, it := range items {
				if diff := cmp.Diff(listedKeys, keys(it)); diff != "" {
					t.Fatalf("ListedSandbox keys (-want +got):\n%s", diff)
				}
				got = append(got, it["sandboxID"].(string))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("sandboxes (-want +got):\n%s", diff)
			}
			if total := rec.Header().Get("X-Total-Running"); total != tt.wantTotal {
				t.Errorf("X-Total-Running %q, want %q", total, tt.wantTotal)
			}
			if next := rec.Header().Get("X-Next-Token"); (next != "") != tt.wantNext {
				t.Errorf("X-Next-Token %q, want one: %v", next, tt.wantNext)
			}
		})
	}
}

func TestListV2Pagination(t *testing.T) {
	for _, order := range []string{"desc", "asc"} {
		for _, limit := range []int{1, 2, 3, 5, 11} {
			t.Run(fmt.Sprintf("%s limit %d", order, limit), func(t *testing.T) {
				s, f := newTestServer(t, nil)
				listFixture(f)
				all := do(t, s, "GET", "/v2/sandboxes?order="+order, "", nil)
				var want []string
				for _, it := range decodeArray(t, all.Body.Bytes()) {
					want = append(want, it["sandboxID"].(string))
				}
				var got []string
				token := ""
				for page := 0; ; page++ {
					if page > 20 {
						t.Fatalf("no end after %d pages", page)
					}
					q := url.Values{"order": {order}, "limit": {fmt.Sprint(limit)}}
					if token != "" {
						q.Set("nextToken", token)
					}
					rec := do(t, s, "GET", "/v2/sandboxes?"+q.Encode(), "", nil)
					if rec.Code != 200 {
						t.Fatalf("page %d: status %d (body %s)", page, rec.Code, rec.Body)
					}
					items := decodeArray(t, rec.Body.Bytes())
					if len(items) > limit {
						t.Fatalf("page %d has %d items, limit %d", page, len(items), limit)
					}
					for _, it := range items {
						got = append(got, it["sandboxID"].(string))
					}
					token = rec.Header().Get("X-Next-Token")
					if token == "" {
						break
					}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("paged listing differs from the whole (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// A sandbox killed between two pages shifts nothing: the token names a
// position, not an offset.
func TestListV2PaginationWhileKilling(t *testing.T) {
	s, f := newTestServer(t, nil)
	listFixture(f)
	rec := do(t, s, "GET", "/v2/sandboxes?limit=3", "", nil)
	token := rec.Header().Get("X-Next-Token")
	if rec := do(t, s, "DELETE", "/sandboxes/sb09", "", nil); rec.Code != 204 {
		t.Fatalf("kill: %d", rec.Code)
	}
	rec = do(t, s, "GET", "/v2/sandboxes?limit=3&nextToken="+url.QueryEscape(token), "", nil)
	var got []string
	for _, it := range decodeArray(t, rec.Body.Bytes()) {
		got = append(got, it["sandboxID"].(string))
	}
	if diff := cmp.Diff([]string{"sb07", "sb06", "sb05"}, got); diff != "" {
		t.Errorf("second page (-want +got):\n%s", diff)
	}
}

func TestListV1(t *testing.T) {
	tests := []struct {
		name   string
		query  string
		want   []string
		status int
	}{
		{name: "all running, newest first", query: "", want: []string{"sb09", "sb10", "sb08", "sb07", "sb06", "sb05", "sb04", "sb03", "sb02", "sb01", "sb00"}},
		{name: "metadata", query: jsMetadataQuery("parity", "odd"), want: []string{"sb09", "sb07", "sb05", "sb03", "sb01"}},
		{name: "pagination parameters are not its", query: "limit=1", want: []string{"sb09", "sb10", "sb08", "sb07", "sb06", "sb05", "sb04", "sb03", "sb02", "sb01", "sb00"}},
		{name: "bad metadata", query: "metadata=%25zz", status: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := newTestServer(t, nil)
			listFixture(f)
			rec := do(t, s, "GET", "/sandboxes?"+tt.query, "", nil)
			if tt.status != 0 {
				checkError(t, rec.Code, rec.Body.Bytes(), tt.status, "metadata")
				return
			}
			got := []string{}
			for _, it := range decodeArray(t, rec.Body.Bytes()) {
				if diff := cmp.Diff(listedKeys, keys(it)); diff != "" {
					t.Fatalf("ListedSandbox keys (-want +got):\n%s", diff)
				}
				got = append(got, it["sandboxID"].(string))
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("sandboxes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestListEmptyIsArray(t *testing.T) {
	s, _ := newTestServer(t, nil)
	for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=paused"} {
		rec := do(t, s, "GET", path, "", nil)
		if got := strings.TrimSpace(rec.Body.String()); rec.Code != 200 || got != "[]" {
			t.Errorf("%s: %d %s, want 200 []", path, rec.Code, got)
		}
	}
}

func TestParseMetadataFilter(t *testing.T) {
	tests := []struct {
		raw     string
		want    map[string]string
		wantErr bool
	}{
		{raw: "", want: nil},
		{raw: "&&", want: nil},
		{raw: "user=abc&app=prod", want: map[string]string{"user": "abc", "app": "prod"}},
		{raw: "user%3Dabc%26app%3Dprod", want: map[string]string{"user": "abc", "app": "prod"}},
		{raw: "a%2520b=c%2526d", want: map[string]string{"a b": "c&d"}},
		{raw: "k=", want: map[string]string{"k": ""}},
		{raw: "k=a=b", want: map[string]string{"k": "a=b"}},
		{raw: "novalue", wantErr: true},
		{raw: "=v", wantErr: true},
		{raw: "%zz", wantErr: true},
		{raw: "k=%25zz", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got, err := parseMetadataFilter(tt.raw)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want error: %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("filter (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseTimeoutBody(t *testing.T) {
	tests := []struct {
		body     string
		required bool
		want     int
		wantErr  bool
	}{
		{body: `{"timeout":30}`, required: true, want: 30},
		{body: `{"timeout":0}`, required: true, want: 1},
		// Capped at the longest a sandbox may live through any API, as
		// E2B's server caps it.
		{body: `{"timeout":31622400}`, required: true, want: sandbox.MaxTimeoutSeconds},
		{body: `{"timeout":31622401}`, required: true, want: sandbox.MaxTimeoutSeconds},
		{body: `{"timeout":2147483647}`, required: true, want: sandbox.MaxTimeoutSeconds},
		{body: `{"timeout":2147483648}`, required: true, wantErr: true},
		{body: `{"timeout":-1}`, required: false, wantErr: true},
		{body: `{}`, required: true, wantErr: true},
		{body: `null`, required: true, wantErr: true},
		{body: ``, required: true, wantErr: true},
		{body: ``, required: false, want: 300},
		{body: `  `, required: false, want: 300},
		{body: `{}`, required: false, want: 300},
		{body: `{"memory":true}`, required: false, want: 300},
		{body: `{"timeout":1e3}`, required: true, wantErr: true},
		{body: `"x"`, required: false, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q required %v", tt.body, tt.required), func(t *testing.T) {
			got, err := parseTimeoutBody([]byte(tt.body), tt.required, v2DefaultTimeout)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want error: %v", err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

func TestCursorRoundTrip(t *testing.T) {
	for _, sb := range []sandbox.Sandbox{
		{ID: "abc", CreatedAt: t0},
		{ID: "x_y-z", CreatedAt: t0.Add(123456789 * time.Nanosecond)},
		{ID: "local", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("X", 3600))},
	} {
		c, err := decodeCursor(encodeCursor(sb))
		if err != nil {
			t.Fatalf("decode %v: %v", sb, err)
		}
		if c.id != sb.ID || !c.created.Equal(sb.CreatedAt) {
			t.Errorf("round trip of %s %v gave %s %v", sb.ID, sb.CreatedAt, c.id, c.created)
		}
	}
}

// TestListElsewhere checks that lists include what SetElsewhere adds (a
// cluster's other nodes), interleaved by creation time and paged like the
// node's own, and that only live ones are listed.
func TestListElsewhere(t *testing.T) {
	s, f := newTestServer(t, nil)
	for i := range 4 {
		sb := running(fmt.Sprintf("here%d", i))
		sb.CreatedAt = t0.Add(time.Duration(2*i) * time.Second)
		f.add(sb)
	}
	var remote []sandbox.Sandbox
	for i := range 4 {
		sb := running(fmt.Sprintf("there%d", i))
		sb.CreatedAt = t0.Add(time.Duration(2*i+1) * time.Second)
		remote = append(remote, sb)
	}
	lost := running("lostone")
	lost.State = sandbox.StateLost
	remote = append(remote, lost)
	s.SetElsewhere(func(*http.Request) []sandbox.Sandbox { return remote })

	want := []string{"there3", "here3", "there2", "here2", "there1", "here1", "there0", "here0"}
	var got []string
	token := ""
	for page := 0; page < 10; page++ {
		q := url.Values{"limit": {"3"}}
		if token != "" {
			q.Set("nextToken", token)
		}
		rec := do(t, s, "GET", "/v2/sandboxes?"+q.Encode(), "", nil)
		if rec.Code != 200 {
			t.Fatalf("page %d: %d %s", page, rec.Code, rec.Body)
		}
		for _, it := range decodeArray(t, rec.Body.Bytes()) {
			got = append(got, it["sandboxID"].(string))
		}
		if token = rec.Header().Get("X-Next-Token"); token == "" {
			break
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("v2 list with the other nodes' (-want +got):\n%s", diff)
	}
	rec := do(t, s, "GET", "/sandboxes", "", nil)
	if n := len(decodeArray(t, rec.Body.Bytes())); n != 8 {
		t.Errorf("v1 list: %d sandboxes, want 8", n)
	}
}
