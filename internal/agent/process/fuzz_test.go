package process

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// FuzzHeaders: the time-limit and keepalive headers come from clients (E2B
// SDKs through the data plane). No value may panic or give a negative,
// zero (keepalive) or overflowed duration; a value out of range is refused
// or clamped.
func FuzzHeaders(f *testing.F) {
	for _, v := range []string{"", "0", "1", "-1", "90", "5000", "9223372036854775807", "10000000000", "1e3", " 5", "+5"} {
		f.Add(v, v)
	}
	f.Fuzz(func(t *testing.T, timeout, keepalive string) {
		h := http.Header{}
		h.Set(TimeoutHeader, timeout)
		h.Set(KeepaliveHeader, keepalive)
		limit, err := timeLimit(context.Background(), h)
		if err == nil && (limit < 0 || limit > maxTimeLimit) {
			t.Fatalf("time limit %q → %v", timeout, limit)
		}
		if k := keepaliveOf(h); k <= 0 || k > maxKeepalive && k != defaultKeepalive {
			t.Fatalf("keepalive %q → %v", keepalive, k)
		}
	})
}

func TestHeaderBounds(t *testing.T) {
	for _, c := range []struct {
		keepalive string
		want      time.Duration
	}{
		{"", defaultKeepalive},
		{"0", defaultKeepalive},
		{"-3", defaultKeepalive},
		{"5", 5 * time.Second},
		{"10000000000", maxKeepalive}, // overflowed to a negative Duration before
	} {
		h := http.Header{}
		h.Set(KeepaliveHeader, c.keepalive)
		if got := keepaliveOf(h); got != c.want {
			t.Errorf("keepalive %q = %v, want %v", c.keepalive, got, c.want)
		}
	}
	h := http.Header{}
	h.Set(TimeoutHeader, "9223372036854775807")
	if d, err := timeLimit(context.Background(), h); err == nil {
		t.Errorf("time limit of 2^63-1 ms accepted as %v", d)
	}
}
