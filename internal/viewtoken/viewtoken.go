// Package viewtoken issues and checks the short-lived tokens of live-view
// links. A token is stateless: a JSON claim set and its HMAC-SHA256 under a
// daemon key, both base64url, joined by a dot. Stateless because a view link
// must survive a daemon restart (the sandboxes do) without a token table to
// persist, and because checking one costs no lookup. Revocation needs no
// table either: a token names the sandbox and its creation time, and the API
// refuses it once that sandbox has stopped.
//
// The key lives in a file in the data directory (0600), created on first
// use; deleting it revokes every link at the next start.
package viewtoken

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// KeySize is the size of the HMAC key in bytes.
const KeySize = 32

// maxTokenLen bounds what Verify will even look at; real tokens are about
// 200 bytes.
const maxTokenLen = 1024

// prefix versions the format and separates view-token MACs from any other
// use of the key.
const prefix = "v1."

// Errors of Verify. ErrExpired is told apart so the viewer can say "this
// link has expired" rather than "invalid".
var (
	ErrMalformed = errors.New("malformed view token")
	ErrSignature = errors.New("view token signature does not match")
	ErrExpired   = errors.New("view token has expired")
)

// Claims are what a token grants.
type Claims struct {
	// Sandbox is the sandbox id the token is scoped to.
	Sandbox string `json:"sid"`
	// Created is the sandbox's creation time: it binds the token to this
	// sandbox and no other that might later reuse the id.
	Created time.Time `json:"sc"`
	// ViewOnly forbids input; the proxy enforces it.
	ViewOnly bool `json:"vo"`
	// Expires is when the token stops opening connections.
	Expires time.Time `json:"exp"`
	// Nonce makes every token distinct.
	Nonce string `json:"n"`
}

// Issuer signs and verifies tokens with one key.
type Issuer struct {
	key []byte
	now func() time.Time
}

// New returns an issuer for key (KeySize bytes or more). now may be nil
// (time.Now).
func New(key []byte, now func() time.Time) (*Issuer, error) {
	if len(key) < KeySize {
		return nil, fmt.Errorf("view token key: %d bytes, need %d", len(key), KeySize)
	}
	if now == nil {
		now = time.Now
	}
	return &Issuer{key: bytes.Clone(key), now: now}, nil
}

// Issue returns a signed token for c, filling in a nonce.
func (i *Issuer) Issue(c Claims) (string, error) {
	if c.Sandbox == "" || c.Expires.IsZero() {
		return "", errors.New("view token: sandbox and expiry are required")
	}
	var n [9]byte
	if _, err := rand.Read(n[:]); err != nil {
		return "", fmt.Errorf("view token nonce: %w", err)
	}
	c.Nonce = base64.RawURLEncoding.EncodeToString(n[:])
	c.Created = c.Created.UTC()
	c.Expires = c.Expires.UTC().Truncate(time.Second)
	payload, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("view token: %w", err)
	}
	p := base64.RawURLEncoding.EncodeToString(payload)
	return prefix + p + "." + base64.RawURLEncoding.EncodeToString(i.mac(p)), nil
}

func (i *Issuer) mac(payload string) []byte {
	h := hmac.New(sha256.New, i.key)
	h.Write([]byte(prefix))
	h.Write([]byte(payload))
	return h.Sum(nil)
}

// Verify checks a token's signature and expiry and returns its claims. The
// signature is checked before anything in the payload is believed.
func (i *Issuer) Verify(token string) (Claims, error) {
	if len(token) > maxTokenLen || !strings.HasPrefix(token, prefix) {
		return Claims{}, ErrMalformed
	}
	p, sig, ok := strings.Cut(token[len(prefix):], ".")
	if !ok {
		return Claims{}, ErrMalformed
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return Claims{}, ErrMalformed
	}
	if !hmac.Equal(got, i.mac(p)) {
		return Claims{}, ErrSignature
	}
	payload, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return Claims{}, ErrMalformed
	}
	var c Claims
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || c.Sandbox == "" || c.Expires.IsZero() {
		return Claims{}, ErrMalformed
	}
	if !i.now().Before(c.Expires) {
		return c, ErrExpired
	}
	return c, nil
}

// LoadOrCreateKey reads the key at path, creating it (0600, random) when it
// does not exist. A key file of the wrong size is an error, not replaced:
// replacing it would silently revoke every link.
func LoadOrCreateKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err == nil {
		if len(key) != KeySize {
			return nil, fmt.Errorf("view token key %s: %d bytes, want %d (delete it to make a new one)", path, len(key), KeySize)
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read view token key: %w", err)
	}
	key = make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("view token key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("view token key: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, key, 0o600); err != nil {
		return nil, fmt.Errorf("write view token key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("write view token key: %w", err)
	}
	return key, nil
}
