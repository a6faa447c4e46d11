package e2e

import (
	"os"
	"testing"

	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestMain destroys the shared desktops (shared_test.go), and removes the
// binaries the harness built for this test process and the images its
// tests imported.
func TestMain(m *testing.M) {
	code := m.Run()
	code = stopSharedDesktops(code)
	removeUserImages()
	harness.RemoveBuild()
	os.Exit(code)
}
