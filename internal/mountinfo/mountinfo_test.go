package mountinfo

import (
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

func TestUnescape(t *testing.T) {
	tests := []struct{ in, want string }{
		{`/plain`, "/plain"},
		{`/a\040b\011c`, "/a b\tc"},
	}
	for _, tt := range tests {
		if got := unescape(tt.in); got != tt.want {
			t.Errorf("unescape(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestUnder(t *testing.T) {
	needs.Path(t, "/proc/self/mountinfo")
	mps, err := Under("/")
	if err != nil {
		t.Fatal(err)
	}
	if len(mps) == 0 || mps[len(mps)-1] != "/" {
		t.Errorf("Under(/) = %v, want the root mount last (deepest first)", mps)
	}
	if mps, _ := Under(t.TempDir()); len(mps) != 0 {
		t.Errorf("Under(empty temp dir) = %v, want none", mps)
	}
}
