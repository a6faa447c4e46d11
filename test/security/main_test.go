package security

import (
	"os"
	"testing"

	"github.com/cubicle-dev/cubicle/test/harness"
)

// TestMain removes the binaries the harness built for this test process.
func TestMain(m *testing.M) {
	code := m.Run()
	harness.RemoveBuild()
	os.Exit(code)
}
