package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// TestBootTemplate checks what a user of the default backend sees of boot
// templates: a create answers with the desktop complete (XFCE's panel and
// desktop, Chromium focused), keys typed the moment it answers reach
// Chromium (the page typed into its address bar is shown), a start URL is
// the page shown, and each sandbox is its own: its environment (a
// secret of another create's is not there), hostname, machine-id and the
// host's clock. That the later sandboxes were restored from a template,
// not booted, is read from inside them: their XFCE panel process is older
// than their create.
func TestBootTemplate(t *testing.T) {
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testBootTemplate(t, backend)
		})
	}
}

func testBootTemplate(t *testing.T, backend string) {
	d, c := startDaemonArgs(t, backend, "--boot-templates=true")
	ctx := context.Background()
	t0 := time.Now()
	a, err := c.Create(ctx, client.CreateRequest{Template: "desktop", Backend: backend, Env: map[string]string{"TEMPLATE_SECRET": "alpha"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Logf("first create (builds the template) %s", time.Since(t0).Round(time.Millisecond))
	assertUsableNow(t, c, a.ID)

	// Keys typed the moment the create answers.
	t1 := time.Now()
	b, err := c.Create(ctx, client.CreateRequest{Template: "desktop", Backend: backend, Env: map[string]string{"TEMPLATE_SECRET": "beta"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	created := time.Since(t1)
	if err := c.Key(ctx, b.ID, "ctrl+l"); err != nil {
		t.Fatal(err)
	}
	if err := c.Type(ctx, b.ID, "data:text/html,<body style='background:%23c0392b'>typed</body>"); err != nil {
		t.Fatal(err)
	}
	if err := c.Key(ctx, b.ID, "Return"); err != nil {
		t.Fatal(err)
	}
	if !eventually(30*time.Second, func() bool { return near(pixel(t, c, b.ID, 512, 500), red) }) {
		saveScreenshot(t, c, b.ID, "template-typed")
		t.Fatalf("the page typed into the address bar at once is not shown: pixel %v", pixel(t, c, b.ID, 512, 500))
	}
	t.Logf("second create %s; the page typed at once shown %s after the create began", created.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	if age := panelAge(t, c, b.ID); age <= time.Since(t1) {
		t.Errorf("the second sandbox's XFCE panel started %v ago, within its create (%v ago): it was booted, not restored from the template", age, time.Since(t1))
	}

	// A start URL is the page shown: Chromium, already running in the
	// template, navigates to it (a file of the image, whose name it shows
	// as the window's title).
	s, err := c.Create(ctx, client.CreateRequest{Template: "desktop", Backend: backend, StartURL: "file:///etc/os-release"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if !eventually(30*time.Second, func() bool { return hasWindowTitle(t, c, s.ID, "os-release") }) {
		saveScreenshot(t, c, s.ID, "template-start-url")
		ws, _ := c.Windows(ctx, s.ID)
		t.Fatalf("the start URL's page is not shown: windows %+v", ws)
	}
	if ws, _ := c.Windows(ctx, s.ID); len(ws) != 3 {
		t.Errorf("windows %+v, want the panel, the desktop and one Chromium window", ws)
	}

	// Each is its own.
	seen := map[string]string{}
	for _, sb := range []struct {
		id, secret string
	}{{a.ID, "alpha"}, {b.ID, "beta"}, {s.ID, ""}} {
		out := execOut(t, c, sb.id, `echo "secret=$TEMPLATE_SECRET"; hostname; cat /etc/machine-id; date +%s`)
		lines := strings.Fields(out)
		if len(lines) != 4 {
			t.Fatalf("sandbox %s printed %q", sb.id, out)
		}
		if lines[0] != "secret="+sb.secret {
			t.Errorf("sandbox %s: %s, want its own create's (%q)", sb.id, lines[0], sb.secret)
		}
		for i, what := range []string{"hostname", "machine-id"} {
			if other, ok := seen[what+lines[1+i]]; ok {
				t.Errorf("sandboxes %s and %s share the %s %s", other, sb.id, what, lines[1+i])
			}
			seen[what+lines[1+i]] = sb.id
		}
		if sec, err := strconv.ParseInt(lines[3], 10, 64); err != nil || time.Since(time.Unix(sec, 0)).Abs() > 10*time.Second {
			t.Errorf("sandbox %s's clock says %s, the host's %d", sb.id, lines[3], time.Now().Unix())
		}
	}
	dataDir := filepath.Dir(d.Log)
	if dirs, _ := filepath.Glob(filepath.Join(dataDir, "templates", "*")); len(dirs) != 1 {
		t.Errorf("template directories %v, want one for one image and shape", dirs)
	}
	for _, id := range []string{a.ID, b.ID, s.ID} {
		if err := c.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		assertNoTrace(t, d, backend, id)
	}
}

// assertUsableNow checks, without waiting, that the desktop is complete:
// XFCE's panel and desktop up, Chromium's window focused.
func assertUsableNow(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ws, err := c.Windows(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	has := map[string]bool{}
	for _, w := range ws {
		has[w.Class] = true
		if w.Class == "Chromium" && w.Focused {
			has["focused Chromium"] = true
		}
	}
	for _, want := range []string{"Xfce4-panel", "Xfdesktop", "focused Chromium"} {
		if !has[want] {
			t.Errorf("the create answered before the desktop was usable: no %s among %+v", want, ws)
		}
	}
}

// panelAge is how long ago sandbox id's XFCE panel process started, by
// its own clock.
func panelAge(t *testing.T, c *client.Client, id string) time.Duration {
	t.Helper()
	out := strings.TrimSpace(execOut(t, c, id, `ps -o etimes= -C xfce4-panel | head -1`))
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("panel age %q: %v", out, err)
	}
	return time.Duration(n) * time.Second
}

func execOut(t *testing.T, c *client.Client, id, cmd string) string {
	t.Helper()
	res, err := c.Exec(context.Background(), id, client.ExecRequest{Command: cmd})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: %v %+v", cmd, err, res)
	}
	return res.Stdout
}

func saveScreenshot(t *testing.T, c *client.Client, id, name string) {
	t.Helper()
	b, err := c.Screenshot(context.Background(), id, client.ScreenshotOptions{Format: "png"})
	if err != nil {
		return
	}
	dir := os.Getenv("CUBICLE_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, name+".png")
	if os.WriteFile(p, b, 0o644) == nil {
		t.Logf("screenshot: %s", p)
	}
}
