package desktop

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/proto/desktop"
	"github.com/cubicle-dev/cubicle/proto/desktop/desktopconnect"
)

func serve(t *testing.T, s *Service) desktopconnect.DesktopClient {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(desktopconnect.NewDesktopHandler(s))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return desktopconnect.NewDesktopClient(srv.Client(), srv.URL)
}

func TestServiceWithoutDesktop(t *testing.T) {
	client := serve(t, NewService("v1.2.3", ":9"))
	ctx := context.Background()
	info, err := client.Info(ctx, connect.NewRequest(&desktop.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if info.Msg.Version != "v1.2.3" || info.Msg.Ready || info.Msg.Display != ":9" {
		t.Errorf("Info = %v, want version v1.2.3, not ready", info.Msg)
	}
	_, err = client.Screenshot(ctx, connect.NewRequest(&desktop.ScreenshotRequest{}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("Screenshot error = %v, want unavailable", err)
	}
	_, err = client.Act(ctx, connect.NewRequest(&desktop.ActRequest{}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("Act error = %v, want unavailable", err)
	}
}

// TestServiceRestartingDesktop: once a desktop was up, the calls that need
// it while the supervisor starts its X server again say it is restarting
// (a retry helps), not that it is not up yet.
func TestServiceRestartingDesktop(t *testing.T) {
	s := NewService("v1", ":9")
	client := serve(t, s)
	ctx := context.Background()
	_, err := client.Screenshot(ctx, connect.NewRequest(&desktop.ScreenshotRequest{}))
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "not up yet") {
		t.Errorf("before the first desktop: %v, want unavailable, not up yet", err)
	}
	s.SetDesktop(&Desktop{})
	s.SetDesktop(nil) // Xvfb died; the supervisor restarts it
	_, err = client.Screenshot(ctx, connect.NewRequest(&desktop.ScreenshotRequest{}))
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "the desktop is restarting; retry") {
		t.Errorf("while the desktop restarts: %v, want unavailable, restarting", err)
	}
}

func TestService(t *testing.T) {
	d, display := openDesktop(t)
	newClient(t, display, winX, winY, winW, winH, "service")
	s := NewService("v1", display)
	client := serve(t, s)
	ctx := context.Background()
	s.SetDesktop(d)

	info, err := client.Info(ctx, connect.NewRequest(&desktop.InfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !info.Msg.Ready || info.Msg.Width != 1024 || info.Msg.Height != 768 || !slices.Contains(info.Msg.Capabilities, CapXTEST) {
		t.Errorf("Info = %v", info.Msg)
	}

	shot, err := client.Screenshot(ctx, connect.NewRequest(&desktop.ScreenshotRequest{Format: "jpeg", Width: 256}))
	if err != nil {
		t.Fatal(err)
	}
	if shot.Msg.Format != "jpeg" || shot.Msg.Width != 256 || shot.Msg.Height != 192 || len(shot.Msg.Data) == 0 {
		t.Errorf("Screenshot = %s %dx%d, %d bytes", shot.Msg.Format, shot.Msg.Width, shot.Msg.Height, len(shot.Msg.Data))
	}
	_, err = client.Screenshot(ctx, connect.NewRequest(&desktop.ScreenshotRequest{Format: "gif"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("gif screenshot error = %v, want invalid_argument", err)
	}

	acts := []action.Action{
		{Type: "move", X: ip(10), Y: ip(20)},
		{Type: "cursor_position"},
		{Type: "screen_size"},
		{Type: "screenshot", Scale: 0.25},
	}
	req := &desktop.ActRequest{}
	for _, a := range acts {
		req.Actions = append(req.Actions, action.ToProto(a))
	}
	resp, err := client.Act(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	m := resp.Msg
	if m.FailedIndex != -1 || m.Error != "" || len(m.Results) != 4 {
		t.Fatalf("Act = %v", m)
	}
	if r := m.Results[1]; r.Type != "cursor_position" || r.X != 10 || r.Y != 20 {
		t.Errorf("cursor_position result = %v", r)
	}
	if r := m.Results[3]; r.Screenshot == nil || r.Screenshot.Width != 256 {
		t.Errorf("screenshot result = %v", r)
	}

	for _, tt := range []struct {
		bad  *desktop.Action
		code string
	}{
		{action.ToProto(action.Action{Type: "click", X: ip(5000), Y: ip(1)}), CodeInvalidArgument},
		{&desktop.Action{Type: "teleport"}, CodeInvalidArgument},
		{&desktop.Action{Type: "key", Keys: []string{"nosuchkey"}}, CodeInvalidArgument},
	} {
		req := &desktop.ActRequest{Actions: []*desktop.Action{action.ToProto(acts[0]), tt.bad, action.ToProto(acts[1])}}
		resp, err := client.Act(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		if m := resp.Msg; m.FailedIndex != 1 || m.ErrorCode != tt.code || m.Error == "" || len(m.Results) != 1 {
			t.Errorf("Act with %v = %v, want failed_index 1, %s", tt.bad, m, tt.code)
		}
	}

	// A canceled request fails as internal, not as the user's mistake.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	r2, err := s.Act(cctx, connect.NewRequest(&desktop.ActRequest{Actions: []*desktop.Action{{Type: "wait", DurationMs: 1000}}}))
	if err != nil || r2.Msg.FailedIndex != 0 || r2.Msg.ErrorCode != CodeInternal {
		t.Errorf("canceled Act = %v, %v", r2, err)
	}
}

// TestServiceDisplayGone: when the X server dies under the agent (the
// session supervisor restarts it), a screenshot answers Unavailable and an
// action fails with error_code "unavailable", both worth a retry, not
// Internal.
func TestServiceDisplayGone(t *testing.T) {
	d, display := openDesktop(t)
	s := NewService("v1", display)
	client := serve(t, s)
	ctx := context.Background()
	s.SetDesktop(d)
	// The test's Xvfb is the only Xvfb child of this process now (others
	// are stopped when their test ends).
	killed := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil || !strings.Contains(string(stat), "(Xvfb)") {
			continue
		}
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) {
			syscall.Kill(pid, syscall.SIGKILL)
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("killed %d Xvfb children, want 1", killed)
	}
	time.Sleep(200 * time.Millisecond)
	_, err := client.Screenshot(ctx, connect.NewRequest(&desktop.ScreenshotRequest{}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("screenshot with the X server gone: %v, want unavailable", err)
	}
	resp, err := client.Act(ctx, connect.NewRequest(&desktop.ActRequest{Actions: []*desktop.Action{action.ToProto(action.Action{Type: "click", X: ip(5), Y: ip(5)})}}))
	if err != nil || resp.Msg.ErrorCode != CodeUnavailable {
		t.Errorf("click with the X server gone: %v %v, want error_code unavailable", resp, err)
	}
}

// TestShutdown checks that Shutdown runs the agent's shutdown and says
// what it could not stop, and is refused by a service given none.
func TestShutdown(t *testing.T) {
	s := NewService("v", ":0")
	c := serve(t, s)
	ctx := context.Background()
	if _, err := c.Shutdown(ctx, connect.NewRequest(&desktop.ShutdownRequest{})); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("Shutdown without a shutdown: %v, want unimplemented", err)
	}
	calls := 0
	fail := false
	s.SetShutdown(func(context.Context) error {
		calls++
		if fail {
			return errors.New("chromium did not exit")
		}
		return nil
	})
	resp, err := c.Shutdown(ctx, connect.NewRequest(&desktop.ShutdownRequest{}))
	if err != nil || resp.Msg.Error != "" || calls != 1 {
		t.Errorf("Shutdown = %v, %v after %d calls; want a clean answer after 1", resp, err, calls)
	}
	fail = true
	resp, err = c.Shutdown(ctx, connect.NewRequest(&desktop.ShutdownRequest{}))
	if err != nil || resp.Msg.Error != "chromium did not exit" {
		t.Errorf("a failed shutdown = %v, %v; want its error in the answer", resp, err)
	}
}

// TestServiceUsable: Info calls the desktop usable only once every window
// SetUsable names is up (and focused where it says so), and keeps saying
// so after; with none named, usable is ready.
func TestServiceUsable(t *testing.T) {
	d, display := openDesktop(t)
	ctx := context.Background()
	usable := func(s *Service) bool {
		t.Helper()
		info, err := serve(t, s).Info(ctx, connect.NewRequest(&desktop.InfoRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if !info.Msg.Ready {
			t.Fatal("not ready")
		}
		return info.Msg.Usable
	}
	plain := NewService("v1", display)
	plain.SetDesktop(d)
	if !usable(plain) {
		t.Error("with no windows named, a ready desktop is not usable")
	}

	s := NewService("v1", display)
	s.SetDesktop(d)
	s.SetUsable([]WindowWant{{Class: "cubicletest", Focused: true}, {Class: "Panel"}})
	if usable(s) {
		t.Fatal("usable before any of its windows is up")
	}
	newClient(t, display, winX, winY, winW, winH, "browser")
	if usable(s) {
		t.Fatal("usable with its panel missing")
	}
	panel := newClient(t, display, 0, 0, 100, 20, "panel")
	panel.setClass("panel", "Panel")
	// The panel, mapped last, has the focus: the browser does not.
	if usable(s) {
		t.Fatal("usable while the window that must hold the focus does not")
	}
	s2 := NewService("v1", display)
	s2.SetDesktop(d)
	s2.SetUsable([]WindowWant{{Class: "cubicletest"}, {Class: "Panel", Focused: true}})
	if !usable(s2) {
		t.Fatal("not usable with every window up and the right one focused")
	}
	panel.unmap()
	if !usable(s2) {
		t.Error("usable went back to false: it is about the session's start")
	}
}

// setClass sets the window's WM_CLASS.
func (c *client) setClass(instance, class string) {
	v := []byte(instance + "\x00" + class + "\x00")
	xproto.ChangeProperty(c.conn, xproto.PropModeReplace, c.win, xproto.AtomWmClass, xproto.AtomString, 8, uint32(len(v)), v)
	c.sync()
}

// unmap takes the window off the screen.
func (c *client) unmap() {
	xproto.UnmapWindow(c.conn, c.win)
	c.sync()
}
