package viewtoken

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func issuer(t testing.TB, now *time.Time) *Issuer {
	t.Helper()
	i, err := New(bytes.Repeat([]byte{7}, KeySize), func() time.Time { return *now })
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func TestRoundTrip(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	i := issuer(t, &now)
	created := now.Add(-time.Minute)
	for _, vo := range []bool{true, false} {
		tok, err := i.Issue(Claims{Sandbox: "sb1", Created: created, ViewOnly: vo, Expires: now.Add(10 * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		c, err := i.Verify(tok)
		if err != nil {
			t.Fatal(err)
		}
		if c.Sandbox != "sb1" || !c.Created.Equal(created) || c.ViewOnly != vo || !c.Expires.Equal(now.Add(10*time.Minute)) {
			t.Fatalf("claims = %+v", c)
		}
	}
	a, _ := i.Issue(Claims{Sandbox: "sb1", Expires: now.Add(time.Minute)})
	b, _ := i.Issue(Claims{Sandbox: "sb1", Expires: now.Add(time.Minute)})
	if a == b {
		t.Fatal("two tokens with the same claims are equal")
	}
}

func TestVerifyRejects(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	i := issuer(t, &now)
	good, err := i.Issue(Claims{Sandbox: "sb1", ViewOnly: true, Expires: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := New(bytes.Repeat([]byte{8}, KeySize), func() time.Time { return now })
	foreign, _ := other.Issue(Claims{Sandbox: "sb1", Expires: now.Add(time.Minute)})

	// Flip view_only in the payload and keep the signature.
	p, sig, _ := strings.Cut(strings.TrimPrefix(good, prefix), ".")
	raw, _ := base64.RawURLEncoding.DecodeString(p)
	forged := prefix + base64.RawURLEncoding.EncodeToString(bytes.Replace(raw, []byte(`"vo":true`), []byte(`"vo":false`), 1)) + "." + sig

	tests := []struct {
		name  string
		token string
		want  error
	}{
		{"empty", "", ErrMalformed},
		{"no prefix", strings.TrimPrefix(good, prefix), ErrMalformed},
		{"no signature", prefix + p, ErrMalformed},
		{"bad base64 signature", prefix + p + ".!!", ErrMalformed},
		{"truncated signature", good[:len(good)-3], ErrSignature},
		{"other key", foreign, ErrSignature},
		{"forged claims", forged, ErrSignature},
		{"huge", prefix + strings.Repeat("a", 5000) + ".x", ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := i.Verify(tt.token); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}

	now = now.Add(time.Minute) // expiry is exclusive
	if _, err := i.Verify(good); !errors.Is(err, ErrExpired) {
		t.Fatalf("at expiry: err = %v, want ErrExpired", err)
	}
}

func TestIssueNeedsClaims(t *testing.T) {
	now := time.Now()
	i := issuer(t, &now)
	if _, err := i.Issue(Claims{Expires: now.Add(time.Minute)}); err == nil {
		t.Fatal("token without sandbox issued")
	}
	if _, err := i.Issue(Claims{Sandbox: "x"}); err == nil {
		t.Fatal("token without expiry issued")
	}
	if _, err := New(make([]byte, 16), nil); err == nil {
		t.Fatal("short key accepted")
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "view.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(k1, k2) {
		t.Fatal("key changed between loads")
	}
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("wrong-size key accepted")
	}
	if b, _ := os.ReadFile(path); string(b) != "short" {
		t.Fatal("wrong-size key was replaced")
	}
}

func FuzzVerify(f *testing.F) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	i := issuer(f, &now)
	// Built by hand, not by Issue: its random nonce would differ in each
	// fuzz worker process.
	gp := base64.RawURLEncoding.EncodeToString([]byte(`{"sid":"sb1","exp":"2026-11-29T12:01:00Z"}`))
	good := prefix + gp + "." + base64.RawURLEncoding.EncodeToString(i.mac(gp))
	if _, err := i.Verify(good); err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add("v1.e30.AAAA")
	f.Add("")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := i.Verify(tok)
		if err == nil && (c.Sandbox == "" || !now.Before(c.Expires)) {
			t.Fatalf("accepted claims %+v", c)
		}
		if err == nil && tok != good {
			// Only tokens signed with the key verify; the fuzzer cannot
			// forge HMAC, so anything else accepted is a bug.
			p, _, _ := strings.Cut(strings.TrimPrefix(tok, prefix), ".")
			if p != gp {
				t.Fatalf("accepted unsigned token %q", tok)
			}
		}
	})
}
