package e2b

import (
	"strings"
	"testing"
	"time"
)

// TestFileSignature checks signatures against ones E2B's JS SDK (2.51.0,
// getSignature in src/sandbox/signature.ts) computed for the same token.
func TestFileSignature(t *testing.T) {
	key, id := []byte("k"), "sbx1"
	if tok := AccessToken(key, id); tok != "992ef9482a6394bedcf951aa14f56370e4dd64bf445ee16963cf34563760fea1" {
		t.Fatalf("token %s", tok)
	}
	for _, tc := range []struct {
		path, op, user, exp, want string
	}{
		{"/home/user/a b.txt", "read", "user", "", "v1_4zL4rGVdAnR5pZp1I5pBCL/Q/4OQNrLBeKan6ZyS+ag"},
		{"/tmp/x", "write", "", "1800000000", "v1_qECRKgFK3yY+uiy9KeSG+dyjNQBmGqr4kBZSDcBLoB8"},
	} {
		if got := FileSignature(key, id, tc.path, tc.op, tc.user, tc.exp); got != tc.want {
			t.Errorf("%+v: %s", tc, got)
		}
	}
}

func TestCheckFileSignature(t *testing.T) {
	key, id := []byte("k"), "sbx1"
	now := time.Unix(1_700_000_000, 0)
	good := FileSignature(key, id, "/tmp/x", "read", "user", "1700000060")
	for _, tc := range []struct {
		name                         string
		id, path, op, user, sig, exp string
		at                           time.Time
		wantErr                      string
	}{
		{"valid", id, "/tmp/x", "read", "user", good, "1700000060", now, ""},
		{"expired", id, "/tmp/x", "read", "user", good, "1700000060", now.Add(2 * time.Minute), "expired"},
		{"other path", id, "/tmp/y", "read", "user", good, "1700000060", now, "does not match"},
		{"other op", id, "/tmp/x", "write", "user", good, "1700000060", now, "does not match"},
		{"other user", id, "/tmp/x", "read", "root", good, "1700000060", now, "does not match"},
		{"other sandbox", "sbx2", "/tmp/x", "read", "user", good, "1700000060", now, "does not match"},
		{"expiration moved", id, "/tmp/x", "read", "user", good, "1900000000", now, "does not match"},
		{"expiration dropped", id, "/tmp/x", "read", "user", good, "", now, "does not match"},
		{"bad expiration", id, "/tmp/x", "read", "user", good, "soon", now, "not a Unix time"},
		{"empty", id, "/tmp/x", "read", "user", "", "", now, "does not match"},
	} {
		err := CheckFileSignature(key, tc.id, tc.path, tc.op, tc.user, tc.sig, tc.exp, tc.at)
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}
