package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
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

// Signed file URLs: E2B's SDKs make downloadUrl and uploadUrl links that
// carry no header, only a signature of what they allow, computed from the
// envd access token (E2B's src/sandbox/signature.ts):
//
//	"v1_" + base64(sha256("PATH:OPERATION:USER:TOKEN[:EXPIRATION]")), unpadded
//
// with OPERATION "read" or "write", USER the username query parameter
// ("" when absent) and EXPIRATION Unix seconds, present when the link
// expires. The data plane checks such a link in place of X-Access-Token.

// FileSignature is the signature E2B's SDKs put on a signed file URL of
// sandbox id; expiration is "" for a link that does not expire.
func FileSignature(key []byte, id, path, operation, user, expiration string) string {
	raw := path + ":" + operation + ":" + user + ":" + AccessToken(key, id)
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// CheckFileSignature reports why a signed file URL of sandbox id does not
// allow operation on path as user at now, or nil when it does.
func CheckFileSignature(key []byte, id, path, operation, user, signature, expiration string, now time.Time) error {
	if expiration != "" {
		exp, err := strconv.ParseInt(expiration, 10, 64)
		if err != nil || exp <= 0 {
			return fmt.Errorf("signature_expiration %q is not a Unix time in seconds", expiration)
		}
		if now.Unix() > exp {
			return fmt.Errorf("the signed URL expired at %s", time.Unix(exp, 0).UTC().Format(time.RFC3339))
		}
	}
	want := FileSignature(key, id, path, operation, user, expiration)
	if !hmac.Equal([]byte(want), []byte(signature)) {
		return fmt.Errorf("the signature does not match this sandbox, path, user and %s operation", operation)
	}
	return nil
}
