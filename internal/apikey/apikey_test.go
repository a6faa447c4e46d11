package apikey

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

func TestParseList(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"   ", nil},
		{",,, ,", nil},
		{"k1", []string{"k1"}},
		{"k1,k2", []string{"k1", "k2"}},
		{" k1 , k2 ,", []string{"k1", "k2"}},
		{"\tk1\n,\nk2", []string{"k1", "k2"}},
		{"e2b_0123abcd,a key with spaces inside", []string{"e2b_0123abcd", "a key with spaces inside"}},
	} {
		if got := ParseList(tt.in); !cmp.Equal(got, tt.want) {
			t.Errorf("ParseList(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// request returns a request carrying the header pairs.
func request(headers ...string) *http.Request {
	r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestFromRequest(t *testing.T) {
	for _, tt := range []struct {
		name    string
		headers []string
		want    string
	}{
		{"none", nil, ""},
		{"X-API-Key", []string{"X-API-Key", "k1"}, "k1"},
		{"E2B's spelling X-API-KEY", []string{"X-API-KEY", "e2b_00"}, "e2b_00"},
		{"lower-case header name", []string{"x-api-key", "k1"}, "k1"},
		{"X-API-Key kept as sent", []string{"X-API-Key", " k1 "}, " k1 "},
		{"first X-API-Key of two", []string{"X-API-Key", "k1", "X-API-Key", "k2"}, "k1"},
		{"bearer", []string{"Authorization", "Bearer k1"}, "k1"},
		{"bearer scheme in any case", []string{"Authorization", "bEaReR k1"}, "k1"},
		{"bearer token trimmed", []string{"Authorization", "Bearer   k1  "}, "k1"},
		{"bearer without a token", []string{"Authorization", "Bearer "}, ""},
		{"bearer of blanks", []string{"Authorization", "Bearer    "}, ""},
		{"bearer without a space", []string{"Authorization", "Bearerk1"}, ""},
		{"basic is not a key", []string{"Authorization", "Basic k1"}, ""},
		{"a bare key in Authorization", []string{"Authorization", "k1"}, ""},
		{"X-API-Key wins over bearer", []string{"X-API-Key", "k1", "Authorization", "Bearer k2"}, "k1"},
		{"empty X-API-Key falls back to bearer", []string{"X-API-Key", "", "Authorization", "Bearer k2"}, "k2"},
		{"other headers are not keys", []string{"X-Access-Token", "k1", "X-Api-Token", "k1"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := FromRequest(request(tt.headers...)); got != tt.want {
				t.Errorf("FromRequest = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	many := []string{"first", "second", "third", "e2b_deadbeef"}
	for _, tt := range []struct {
		name string
		keys []string
		key  string
		want bool
	}{
		{"no keys: auth off", nil, "", true},
		{"no keys: any key passes", nil, "whatever", true},
		{"only empty keys: auth off", []string{"", ""}, "", true},
		{"right key", []string{"k1"}, "k1", true},
		{"missing key", []string{"k1"}, "", false},
		{"wrong key", []string{"k1"}, "k2", false},
		{"prefix of the key", []string{"secret-key"}, "secret", false},
		{"key with more", []string{"secret"}, "secret-key", false},
		{"case matters", []string{"Secret"}, "secret", false},
		{"white space matters", []string{"k1"}, " k1", false},
		{"first of many", many, "first", true},
		{"middle of many", many, "third", true},
		{"last of many", many, "e2b_deadbeef", true},
		{"none of many", many, "fourth", false},
		{"empty never matches an empty key", []string{"", "k1"}, "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := New(tt.keys).Check(tt.key); got != tt.want {
				t.Errorf("New(%q).Check(%q) = %v, want %v", tt.keys, tt.key, got, tt.want)
			}
		})
	}
	var nilSet *Set
	if !nilSet.Check("x") || nilSet.Enabled() {
		t.Error("a nil Set must have no keys and accept every request")
	}
}

func TestAuthorizedAndOwner(t *testing.T) {
	s := New([]string{"k1", "k2"})
	for _, tt := range []struct {
		name      string
		headers   []string
		wantOK    bool
		wantOwner string
	}{
		{"X-API-Key", []string{"X-API-Key", "k1"}, true, sandbox.KeyOwner("k1")},
		{"bearer", []string{"Authorization", "Bearer k2"}, true, sandbox.KeyOwner("k2")},
		{"wrong X-API-Key beats a right bearer", []string{"X-API-Key", "nope", "Authorization", "Bearer k1"}, false, ""},
		{"nothing", nil, false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := request(tt.headers...)
			if got := s.Authorized(r); got != tt.wantOK {
				t.Fatalf("Authorized = %v, want %v", got, tt.wantOK)
			}
			if tt.wantOK {
				if got := s.Owner(r); got != tt.wantOwner || got == "" {
					t.Errorf("Owner = %q, want %q", got, tt.wantOwner)
				}
			}
		})
	}
	// Two keys are two owners, and no owner is the key itself.
	if a, b := s.Owner(request("X-API-Key", "k1")), s.Owner(request("X-API-Key", "k2")); a == b || strings.Contains(a, "k1") {
		t.Errorf("owners %q and %q", a, b)
	}
	if got := New(nil).Owner(request("X-API-Key", "k1")); got != "" {
		t.Errorf("without keys Owner = %q, want \"\"", got)
	}
}

func FuzzFromRequest(f *testing.F) {
	for _, s := range [][2]string{
		{"k1", ""}, {"", "Bearer k1"}, {"", "bearer \t k1 \t"}, {"", "Bearer "}, {"", "Basic dXNlcjo="},
		{"", "Bearerk1"}, {"k1", "Bearer k2"}, {"", "BEARER\u00a0k1"}, {"", "Bearer k1\r\n"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, xAPIKey, authorization string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["X-Api-Key"] = []string{xAPIKey}
		r.Header["Authorization"] = []string{authorization}
		got := FromRequest(r)
		switch {
		case xAPIKey != "":
			if got != xAPIKey {
				t.Fatalf("X-API-Key %q: got %q", xAPIKey, got)
			}
		case got != "":
			scheme, token, ok := strings.Cut(authorization, " ")
			if !ok || !strings.EqualFold(scheme, "bearer") {
				t.Fatalf("Authorization %q is not a bearer token, but gave key %q", authorization, got)
			}
			if got != strings.TrimSpace(token) || strings.TrimFunc(got, unicode.IsSpace) != got {
				t.Fatalf("Authorization %q: got %q, want the trimmed token", authorization, got)
			}
		}
		// The key found is accepted by a set holding it, and by no other.
		if got != "" {
			if !New([]string{"other", got}).Authorized(r) {
				t.Fatalf("key %q not accepted by a set holding it", got)
			}
			if New([]string{got + "x", "x" + got}).Authorized(r) {
				t.Fatalf("key %q accepted by a set without it", got)
			}
		} else if New([]string{"k"}).Authorized(r) {
			t.Fatalf("a request without a key was authorized (headers %q, %q)", xAPIKey, authorization)
		}
	})
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{"", "k1", "k1,k2", " k1 , ,k2,", ",,,", "\tk\n", "a b,c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keys := ParseList(s)
		if keys != nil && len(keys) == 0 {
			t.Fatal("empty non-nil list")
		}
		for _, k := range keys {
			if k == "" || strings.Contains(k, ",") || strings.TrimSpace(k) != k || !strings.Contains(s, k) {
				t.Fatalf("ParseList(%q) gave key %q", s, k)
			}
		}
		if again := ParseList(strings.Join(keys, ",")); !slices.Equal(again, keys) {
			t.Fatalf("ParseList(%q) = %q, but its join parses to %q", s, keys, again)
		}
		// Every key listed is accepted, and the set is on iff a key was listed.
		set := New(keys)
		if set.Enabled() != (len(keys) > 0) {
			t.Fatalf("ParseList(%q): %d keys, Enabled %v", s, len(keys), set.Enabled())
		}
		for _, k := range keys {
			if !set.Check(k) {
				t.Fatalf("key %q of %q not accepted", k, s)
			}
		}
	})
}
