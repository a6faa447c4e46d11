package e2e

import (
	"os"
	"testing"

	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestMain removes the binaries the harness built for this test process,
// and the images its tests imported.
func TestMain(m *testing.M) {
	code := m.Run()
	removeUserImages()
	harness.RemoveBuild()
	os.Exit(code)
}
