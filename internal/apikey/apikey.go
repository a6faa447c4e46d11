// Package apikey is the one home of API-key authentication in cubicled:
// reading the configured keys (CUBICLE_API_KEYS), finding the key a request
// carries, checking it in constant time and naming the owner it acts for.
// Both doors into the daemon use it — the native REST API (internal/api)
// and E2B's control plane (internal/e2b) — so that a key works, fails and
// is compared the same way at each; only their answers to a missing or
// wrong key (each API's own error shape) are their own. Only cmd/cubicled
// and those API packages import it.
package apikey

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// EnvVar is the environment variable the daemon reads its keys from.
const EnvVar = "CUBICLE_API_KEYS"

// Refused is the message of the answer to a request without an accepted
// key, in whichever API's error shape: it says where a key may be sent.
const Refused = "missing or invalid API key (send X-API-Key or Authorization: Bearer)"

// ParseList splits a CUBICLE_API_KEYS value: keys separated by commas,
// white space around each trimmed, empty ones dropped. It returns nil when
// there is no key.
func ParseList(s string) []string {
	var keys []string
	for k := range strings.SplitSeq(s, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// FromRequest returns the API key r carries: the X-API-Key header (E2B's
// SDKs spell it X-API-KEY; header names are case-insensitive), else the
// token of an "Authorization: Bearer" header (scheme case-insensitive),
// else "". An X-API-Key header wins even when a bearer token is sent too.
func FromRequest(r *http.Request) string {
	return fromHeaders(r.Header.Get("X-API-Key"), r.Header.Get("Authorization"))
}

// fromHeaders is FromRequest on the two header values.
func fromHeaders(xAPIKey, authorization string) string {
	if xAPIKey != "" {
		return xAPIKey
	}
	const scheme = "bearer "
	if len(authorization) > len(scheme) && strings.EqualFold(authorization[:len(scheme)], scheme) {
		return strings.TrimSpace(authorization[len(scheme):])
	}
	return ""
}

// Set is the set of accepted keys. A Set without keys turns authentication
// off: it accepts every request (the daemon refuses to listen beyond
// loopback without keys). The zero Set and a nil *Set have no keys. A Set
// is safe for concurrent use; it never changes after New.
type Set struct {
	// sums are the keys' SHA-256 digests: comparing digests takes the same
	// time whatever the lengths of the key sent and the keys held.
	sums [][sha256.Size]byte
}

// New returns the Set of keys; empty keys are dropped, so that an empty
// header can never match one.
func New(keys []string) *Set {
	s := &Set{}
	for _, k := range keys {
		if k != "" {
			s.sums = append(s.sums, sha256.Sum256([]byte(k)))
		}
	}
	return s
}

// Enabled reports whether s holds a key, that is whether requests must
// carry one.
func (s *Set) Enabled() bool { return s != nil && len(s.sums) > 0 }

// Check reports whether key is one of s's keys; with no keys, every key
// (even "") passes. The time it takes depends only on how many keys s
// holds: every key is compared, in constant time, without an early exit.
func (s *Set) Check(key string) bool {
	if !s.Enabled() {
		return true
	}
	if key == "" {
		return false
	}
	got := sha256.Sum256([]byte(key))
	match := 0
	for _, k := range s.sums {
		match |= subtle.ConstantTimeCompare(got[:], k[:])
	}
	return match == 1
}

// Authorized reports whether r may pass: s has no keys, or r carries one of
// them (see FromRequest).
func (s *Set) Authorized(r *http.Request) bool {
	return s.Check(FromRequest(r))
}

// Owner is who r acts for, for the per-key quotas of the sandbox manager:
// sandbox.KeyOwner of the key it carries, or "" when s has no keys (then
// every request is the same anonymous owner). Call it only for an
// authorized request.
func (s *Set) Owner(r *http.Request) string {
	if !s.Enabled() {
		return ""
	}
	return sandbox.KeyOwner(FromRequest(r))
}
