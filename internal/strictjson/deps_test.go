package strictjson

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestDependencies keeps the package on the standard library alone: the
// in-guest agent imports it (through internal/action), and the agent's
// desktop may import nothing else of the project or beyond.
func TestDependencies(t *testing.T) {
	needs.Command(t, "go")
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput() //depcheck:runs go
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg != "github.com/cubicle-dev/cubicle/internal/strictjson" {
			t.Errorf("imports %s, which is not in the standard library", pkg)
		}
	}
}
