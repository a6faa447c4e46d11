package oci

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// desktopScript starts the desktop session the way the agent will (Xvfb,
// openbox and cubicle-browser, the desktop user for the latter two), then
// polls a root-window screenshot until Chromium has painted the red test
// page, and prints the seconds that took.
const desktopScript = `set -u
export DISPLAY=:0
Xvfb :0 -screen 0 1280x800x24 -dpi 96 -nolisten tcp -ac >/tmp/xvfb.log 2>&1 &
i=0; until xdpyinfo >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 200 ] && { echo "no X"; cat /tmp/xvfb.log; exit 1; }; sleep 0.05; done
# Not a shell function: dash keeps a saved copy of stdout open in a
# backgrounded function's subshell, and the caller waits for that pipe.
asuser="setpriv --reuid=1000 --regid=1000 --init-groups env HOME=/home/user USER=user DISPLAY=:0 CUBICLE_WIDTH=1280 CUBICLE_HEIGHT=800"
$asuser openbox >/tmp/wm.log 2>&1 &
t0=$(date +%s.%N); deadline=$(( $(date +%s) + 90 ))
$asuser /usr/local/bin/cubicle-browser 'data:text/html,<body style="background:rgb(255,0,0)"><h1>cubicle</h1></body>' >/tmp/browser.log 2>&1 &
while :; do
	px=$(import -window root -crop 1x1+640+600 -depth 8 txt:- 2>/dev/null | tail -n 1)
	case "$px" in *"#FF0000"*) break ;; esac
	if [ "$(date +%s)" -gt "$deadline" ]; then echo "no paint after 90s: $px"; tail -n 20 /tmp/browser.log; exit 1; fi
	sleep 0.1
done
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" 'BEGIN{printf "paint %.2f\n", b-a}'
import -window root /run/cubicle/screenshot.png
pgrep -c chromium
`

// TestDesktopInBox proves the image's desktop runs in a box: Xvfb, openbox
// and Chromium start and Chromium paints a page, seen through ImageMagick's
// import (the slow baseline the agent replaces). It logs how long Chromium
// took to paint. With $CUBICLE_SCREENSHOT_DIR set, it keeps the screenshot.
func TestDesktopInBox(t *testing.T) {
	needs.Long(t, "starts Chromium")
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d, image := newTestDriver(t, rt)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			b, err := d.Create(ctx, driver.Spec{ID: "tdesk" + rt[3:], Image: image, Token: "x"})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := b.Stop(ctx); err != nil {
					t.Error(err)
				}
			}()
			c := &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return b.DialAgent(ctx) },
			}, Timeout: 2 * time.Minute}
			resp, err := c.Post("http://agent/exec", "text/plain", strings.NewReader(desktopScript))
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(out), "paint ") {
				t.Fatalf("desktop script: %s\n%s", resp.Status, out)
			}
			t.Logf("%s: %s", rt, out)
			shot := filepath.Join(d.boxDir(b.(*box).data.ID), "run", "screenshot.png")
			fi, err := os.Stat(shot)
			if err != nil || fi.Size() < 1000 {
				t.Fatalf("screenshot: %v, %v", fi, err)
			}
			if dir := os.Getenv("CUBICLE_SCREENSHOT_DIR"); dir != "" {
				data, _ := os.ReadFile(shot)
				os.WriteFile(filepath.Join(dir, "desktop-"+rt+".png"), data, 0o644)
			}
		})
	}
}
