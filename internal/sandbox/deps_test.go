package sandbox

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestDeps keeps the manager backend-agnostic: it may know the driver seam
// (internal/driver) but never a backend package, so that a new backend is an
// adapter registered in main, not a change here.
func TestDeps(t *testing.T) {
	needs.Command(t, "go")
	out, err := exec.Command("go", "list", "-deps", "github.com/cubicle-dev/cubicle/internal/sandbox").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/cubicle-dev/cubicle/internal/driver/") ||
			strings.HasPrefix(dep, "github.com/cubicle-dev/cubicle/internal/api") {
			t.Errorf("internal/sandbox depends on %s", dep)
		}
	}
}
