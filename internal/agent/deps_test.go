package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestDeps keeps the agent lean: cmd/cubicle-agent must not pull in the
// daemon's packages, the store or cgo, and must build with CGO_ENABLED=0.
func TestDeps(t *testing.T) {
	needs.Command(t, "go")
	needs.Long(t, "builds the agent")
	cmd := exec.Command("go", "list", "-deps", "github.com/cubicle-dev/cubicle/cmd/cubicle-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/cubicle-dev/cubicle/internal/sandbox",
		"github.com/cubicle-dev/cubicle/internal/driver",
		"github.com/cubicle-dev/cubicle/internal/api",
		"go.etcd.io/bbolt",
		"runtime/cgo",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("cubicle-agent depends on %s", dep)
			}
		}
	}

	build := exec.Command("go", "build", "-o", filepath.Join(t.TempDir(), "cubicle-agent"), "github.com/cubicle-dev/cubicle/cmd/cubicle-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
}
