package e2e

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/rfb"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// viewerClosedAtExpiry opens a live view with a link of a few seconds and
// keeps reading from it like a page would: the daemon must close it at the
// link's expiry (WebSocket close 1008 "view link expired"), not before and
// not much after. It returns once the viewer is open; the check, which
// waits for the close, is the function it returns: the reader notes when
// the close came, so the caller may do other work in between (the expiry
// is a timer of the daemon's, which that work does not move).
func viewerClosedAtExpiry(t *testing.T, d *harness.Daemon, c *client.Client, id string) (check func()) {
	t.Helper()
	ctx := context.Background()
	v, err := c.View(ctx, id, client.ViewRequest{TTLSeconds: 3, ViewOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ws := dialVNC(t, d, id, "?token="+url.QueryEscape(tokenOf(t, v.URL)))
	t.Cleanup(func() { ws.CloseNow() })
	if _, err := rfb.NewClient(websocket.NetConn(ctx, ws, websocket.MessageBinary)).Handshake(true); err != nil {
		t.Fatal(err)
	}
	type end struct {
		at  time.Time
		err error
	}
	ended := make(chan end, 1)
	go func() {
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				ended <- end{time.Now(), err}
				return
			}
		}
	}()
	return func() {
		t.Helper()
		var e end
		select {
		case e = <-ended:
		case <-time.After(time.Until(v.ExpiresAt) + 10*time.Second):
			// Called late, the timer is due at once: a close that came
			// is in ended all the same (and judged late below if it was).
			select {
			case e = <-ended:
			default:
				t.Fatalf("viewer still open 10 s after its link expired at %v", v.ExpiresAt)
			}
		}
		var ce websocket.CloseError
		if !errors.As(e.err, &ce) || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "expired") {
			t.Errorf("viewer ended with %v, want close 1008 saying the link expired", e.err)
		}
		// The expiry is on the daemon's clock, which is this one; it has
		// a second's precision.
		if e.at.Before(v.ExpiresAt.Add(-100 * time.Millisecond)) {
			t.Errorf("viewer closed at %v, before its link's expiry %v", e.at.Format(time.StampMilli), v.ExpiresAt.Format(time.StampMilli))
		}
		if late := e.at.Sub(v.ExpiresAt); late > 5*time.Second { // a loaded machine may be slow to deliver the close
			t.Errorf("viewer closed %v after its link expired, want within 5 s", late)
		}
		t.Logf("viewer with a 3 s link closed %v after the expiry: %v", e.at.Sub(v.ExpiresAt).Round(time.Millisecond), e.err)
	}
}

// slowViewerCut opens a viewer with a tiny TCP receive buffer, asks for
// full, uncompressed frames five times a second and never reads them. Its
// connection fills, the daemon's write blocks, and after viewWriteTimeout
// (15 s) the daemon cuts it ("viewer too slow or gone"), well before the
// 30 s ping could; another viewer then still gets the desktop.
func slowViewerCut(t *testing.T, d *harness.Daemon, id, tok string) {
	t.Helper()
	ctx := context.Background()
	dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, wsURL(d, id, "?token="+url.QueryEscape(tok)), &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}},
		Subprotocols: []string{"binary"},
	})
	if err != nil {
		t.Fatalf("dial the slow viewer: %v", err)
	}
	defer ws.CloseNow()
	rc := rfb.NewClient(websocket.NetConn(ctx, ws, websocket.MessageBinary))
	si, err := rc.Handshake(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.SetEncodings(0); err != nil { // raw
		t.Fatal(err)
	}
	const cut = `"reason":"viewer too slow or gone"`
	before := viewerEnds(t, d, id, cut)
	stopped := time.Now() // nothing is read from here on
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if rc.RequestUpdate(false, 0, 0, si.Width, si.Height) != nil {
					return
				}
			}
		}
	}()
	// 15 s of blocked writing, after the buffers filled (a few frames of
	// 3 MB), well short of the ping at 30 s + 10 s.
	const writeTimeout, slack = 15 * time.Second, 20 * time.Second
	for viewerEnds(t, d, id, cut) == before {
		if time.Since(stopped) > writeTimeout+slack {
			log, _ := os.ReadFile(d.Log)
			t.Fatalf("a viewer that stopped reading %v ago is still connected (want it cut after ~15 s); log:\n%s",
				time.Since(stopped).Round(time.Second), grepLines(string(log), "viewer"))
		}
		time.Sleep(250 * time.Millisecond)
	}
	took := time.Since(stopped)
	t.Logf("viewer that stopped reading cut after %v", took.Round(100*time.Millisecond))
	if took < writeTimeout-500*time.Millisecond {
		t.Errorf("viewer cut %v after it stopped reading, before the 15 s write timeout", took)
	}
	// x11vnc was not left stuck by the cut viewer: a new one gets in.
	ws2 := dialVNC(t, d, id, "?token="+url.QueryEscape(tok))
	defer ws2.CloseNow()
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	if _, err := rfb.NewClient(websocket.NetConn(hctx, ws2, websocket.MessageBinary)).Handshake(true); err != nil {
		t.Errorf("a viewer after the cut one: %v", err)
	}
	ws2.Close(websocket.StatusNormalClosure, "")
}

// viewerEnds counts the daemon's "viewer disconnected" log lines of
// sandbox id that contain reason.
func viewerEnds(t *testing.T, d *harness.Daemon, id, reason string) int {
	t.Helper()
	b, err := os.ReadFile(d.Log)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"viewer disconnected"`) && strings.Contains(l, id) && strings.Contains(l, reason) {
			n++
		}
	}
	return n
}
