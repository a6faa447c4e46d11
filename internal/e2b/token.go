package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// AccessToken is the envd access token of sandbox id: an HMAC of the id
// under the daemon's token key, so the data plane can check X-Access-Token
// without a table and the token survives a daemon restart. Every sandbox
// gets one (also when created with secure: false), because E2B's SDKs send
// it whenever they have it, and the data plane then never runs unauthenticated
// requests.
func AccessToken(key []byte, id string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("cubicle-envd-access-token.v1:"))
	h.Write([]byte(id))
	return hex.EncodeToString(h.Sum(nil))
}

// AccessTokenOK reports whether token is sandbox id's access token, in
// constant time.
func AccessTokenOK(key []byte, id, token string) bool {
	return hmac.Equal([]byte(AccessToken(key, id)), []byte(token))
}
