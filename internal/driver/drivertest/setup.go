package drivertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// ImageDir is the image directory the suite boots from: $CUBICLE_IMAGE_DIR,
// or image.DefaultDir.
func ImageDir() string {
	if dir := os.Getenv("CUBICLE_IMAGE_DIR"); dir != "" {
		return dir
	}
	return image.DefaultDir
}

// DesktopImage returns the rootfs of the installed desktop image, as the
// daemon passes it to drivers in driver.Spec.Image (image.Lookup's RootFS),
// or skips t through needs. With vm set the image must also have a VM form
// (image.LookupVM), as the qemu and firecracker drivers need.
func DesktopImage(t testing.TB, vm bool) string {
	t.Helper()
	img, err := image.Lookup(ImageDir(), "desktop-lite")
	if err != nil {
		needs.Skip(t, "needs the desktop image in %s (cubicle image build desktop): %v", ImageDir(), err)
		return ""
	}
	if vm {
		if _, err := image.LookupVM(img.RootFS); err != nil {
			needs.Skip(t, "needs the desktop image's VM form (rebuild it: cubicle image build desktop): %v", err)
			return ""
		}
	}
	return img.RootFS
}

// AgentBinary returns a static cubicle-agent for drivers to put into boxes:
// $CUBICLE_AGENT_BIN when set, else one built from this checkout
// (CGO_ENABLED=0: VM guests run it as init, before any dynamic loader).
func AgentBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CUBICLE_AGENT_BIN"); p != "" {
		return p
	}
	needs.Command(t, "go")
	bin := filepath.Join(t.TempDir(), "cubicle-agent")
	build := exec.Command("go", "build", "-o", bin, "github.com/cubicle-dev/cubicle/cmd/cubicle-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build cubicle-agent: %v\n%s", err, out)
	}
	return bin
}
