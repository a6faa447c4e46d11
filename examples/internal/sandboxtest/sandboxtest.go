// Package sandboxtest gives the examples' tests what they share: a real
// cubicled on gVisor with a 1024×768 sandbox showing a form in Chromium,
// the page's state read from its window title, and checks of the
// screenshots an agent loop sends to a vendor's stand-in. Only the
// examples' tests import it.
package sandboxtest

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// formPage is a text field and a submit button. A click anywhere focuses
// the field; submitting sets the title to "submitted: <value>".
//
//go:embed form.html
var formPage []byte

// Width and Height are the sandbox's screen, and the display size the
// examples give the models: a screenshot is sent back at this size.
const Width, Height = 1024, 768

// Main runs the tests of a package that uses FormSandbox and then removes
// the programs the harness built. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	harness.RemoveBuild()
	os.Exit(code)
}

// FormSandbox starts a cubicled for t with a 1024×768 gVisor sandbox whose
// Chromium shows the form page. The daemon and the sandbox go when t ends.
func FormSandbox(t *testing.T) (*client.Client, string) {
	t.Helper()
	needs.Root(t)
	needs.Runtime(t, "runsc")
	imageDir := os.Getenv("CUBICLE_IMAGE_DIR")
	if imageDir == "" {
		imageDir = "/var/lib/cubicle/images"
	}
	needs.Image(t, filepath.Join(imageDir, "desktop"))
	needs.Long(t, "starts a sandbox with Chromium")

	start := time.Now()
	dataDir := t.TempDir()
	// The daemon, an XFCE desktop, Chromium and the form: about 20 s
	// here, but over a minute once on a loaded CI machine.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, err := harness.Start(ctx, harness.Options{DataDir: dataDir, ImageDir: imageDir, DefaultBackend: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(2*time.Minute))
	t.Cleanup(func() {
		if sbs, err := c.List(context.Background(), client.ListOptions{}); err == nil {
			for _, sb := range sbs {
				c.Destroy(context.Background(), sb.ID)
			}
		}
		d.Stop()
		if t.Failed() {
			log, _ := os.ReadFile(d.Log)
			lines := strings.Split(string(log), "\n")
			t.Logf("cubicled log (tail):\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})

	sb, err := c.Create(ctx, client.CreateRequest{Backend: "gvisor", Resolution: &client.Resolution{Width: Width, Height: Height}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctx, sb.ID, "/tmp/form.html", bytes.NewReader(formPage)); err != nil {
		t.Fatal(err)
	}
	WaitTitle(t, c, sb.ID, "Chromium")
	if _, err := c.Actions(ctx, sb.ID, client.PressKey("ctrl+l"), client.TypeText("file:///tmp/form.html"), client.PressKey("Return")); err != nil {
		t.Fatal(err)
	}
	WaitTitle(t, c, sb.ID, "form ready")
	t.Logf("sandbox %s showing the form after %.1f s", sb.ID, time.Since(start).Seconds())
	return c, sb.ID
}

// WaitTitle waits up to 30 s for a window of sandbox id whose title or
// class contains want, ignoring case, and fails t with the titles it saw
// otherwise.
func WaitTitle(t *testing.T, c *client.Client, id, want string) {
	t.Helper()
	var seen []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ws, err := c.Windows(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		seen = seen[:0]
		for _, w := range ws {
			if strings.Contains(strings.ToLower(w.Title+"\n"+w.Class), strings.ToLower(want)) {
				return
			}
			seen = append(seen, w.Title)
		}
	}
	t.Fatalf("no window title contains %q; titles: %q", want, seen)
}

// LoadRecording decodes the recorded conversation at path into v.
func LoadRecording(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// CheckPNG checks that b64 is a base64 PNG of the sandbox's display size.
func CheckPNG(b64 string) error {
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return fmt.Errorf("image data: %w", err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("image data: %w", err)
	}
	if got := image.Pt(cfg.Width, cfg.Height); got != image.Pt(Width, Height) {
		return fmt.Errorf("screenshot is %d×%d, want %d×%d", got.X, got.Y, Width, Height)
	}
	return nil
}

// JSONEqual reports whether a and b hold the same JSON value.
func JSONEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ax, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return bytes.Equal(ax, by)
}
