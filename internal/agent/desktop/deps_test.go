package desktop

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestDependencies keeps the desktop lean: it builds without cgo and
// imports nothing of the project but internal/action (with the strict JSON
// decoding it uses, internal/strictjson) and proto/desktop.
func TestDependencies(t *testing.T) {
	needs.Command(t, "go")
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}} {{.CgoFiles}}", ".") //depcheck:runs go
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const self = "github.com/cubicle-dev/cubicle/"
	allowed := map[string]bool{
		self + "internal/action":              true,
		self + "internal/strictjson":          true,
		self + "internal/agent/desktop":       true,
		self + "proto/desktop":                true,
		self + "proto/desktop/desktopconnect": true,
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, cgo, _ := strings.Cut(line, " ")
		if strings.HasPrefix(pkg, self) && !allowed[pkg] {
			t.Errorf("imports %s", pkg)
		}
		if cgo != "[]" {
			t.Errorf("%s has cgo files %s", pkg, cgo)
		}
	}
}
