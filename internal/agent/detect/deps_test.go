package detect

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestStandardLibraryOnly keeps detection a leaf: the image tools (the CLI,
// the daemon) import it, and must not get the agent's X11 and process
// code with it.
func TestStandardLibraryOnly(t *testing.T) {
	needs.Command(t, "go")
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/cubicle-dev/cubicle/internal/agent/detect" {
			t.Errorf("detect imports %s; it must import only the standard library", p)
		}
	}
}
