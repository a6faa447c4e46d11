package api

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/cubicle-dev/cubicle/proto/desktop"
)

func TestParseScreenshotQuery(t *testing.T) {
	for _, c := range []struct {
		query string
		want  *desktop.ScreenshotRequest // nil = invalid
	}{
		{"", &desktop.ScreenshotRequest{Format: "png"}},
		{"format=png", &desktop.ScreenshotRequest{Format: "png"}},
		{"format=jpeg&quality=50", &desktop.ScreenshotRequest{Format: "jpeg", Quality: 50}},
		{"format=jpg", &desktop.ScreenshotRequest{Format: "jpeg"}},
		{"scale=0.5", &desktop.ScreenshotRequest{Format: "png", Scale: 0.5}},
		{"scale=0.1", &desktop.ScreenshotRequest{Format: "png", Scale: 0.1}},
		{"scale=1", &desktop.ScreenshotRequest{Format: "png", Scale: 1}},
		{"width=640", &desktop.ScreenshotRequest{Format: "png", Width: 640}},
		{"x=10&y=20&w=100&h=50", &desktop.ScreenshotRequest{Format: "png", Region: &desktop.Region{X: 10, Y: 20, W: 100, H: 50}}},
		{"w=100&h=50", &desktop.ScreenshotRequest{Format: "png", Region: &desktop.Region{W: 100, H: 50}}},
		{"cursor=true", &desktop.ScreenshotRequest{Format: "png", Cursor: true}},
		{"cursor=1&format=jpeg", &desktop.ScreenshotRequest{Format: "jpeg", Cursor: true}},
		{"settle_ms=250", &desktop.ScreenshotRequest{Format: "png", SettleMs: 250, SettleMaxMs: 2000}},
		{"settle_ms=250&settle_max_ms=5000", &desktop.ScreenshotRequest{Format: "png", SettleMs: 250, SettleMaxMs: 5000}},

		{"format=gif", nil},
		{"quality=0x10", nil},
		{"quality=101", nil},
		{"quality=-1", nil},
		{"scale=0.05", nil},
		{"scale=1.5", nil},
		{"scale=NaN", nil},
		{"scale=Inf", nil},
		{"scale=abc", nil},
		{"scale=0.5&width=100", nil},
		{"width=-1", nil},
		{"width=99999999", nil},
		{"x=1&y=2", nil},
		{"x=1&y=2&w=3", nil},
		{"w=3", nil},
		{"x=-1&y=0&w=1&h=1", nil},
		{"w=-5&h=5", nil},
		{"cursor=maybe", nil},
		{"format=png&format=jpeg", nil},
		{"bogus=1", nil},
		{"settle_ms=10001", nil},
		{"settle_ms=-1", nil},
		{"settle_max_ms=500", nil},
		{"settle_ms=600&settle_max_ms=500", nil},
	} {
		t.Run(c.query, func(t *testing.T) {
			q, err := url.ParseQuery(c.query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseScreenshotQuery(q)
			if c.want == nil {
				if err == nil {
					t.Fatalf("no error, got %v", got)
				}
				if he := classify(err); he.status != 400 || he.code != codeInvalid {
					t.Errorf("error maps to %d %s", he.status, he.code)
				}
				return
			}
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if d := cmp.Diff(c.want, got, protocmp.Transform()); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
		})
	}
}

func TestScreenshot(t *testing.T) {
	e := newTestEnv(t, Config{})
	base := "/v1/sandboxes/" + runningID + "/screenshot"

	w := e.do("GET", base, nil)
	if w.Code != 200 || w.Header().Get("Content-Type") != "image/png" || w.Body.String() != "IMG-png" {
		t.Errorf("png: %d %q %q", w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
	if w.Header().Get("X-Screenshot-Width") != "1024" {
		t.Errorf("width header %q", w.Header().Get("X-Screenshot-Width"))
	}

	w = e.do("GET", base+"?format=jpeg&quality=70&scale=0.5&cursor=true", nil)
	if w.Code != 200 || w.Header().Get("Content-Type") != "image/jpeg" {
		t.Errorf("jpeg: %d %q", w.Code, w.Header().Get("Content-Type"))
	}
	want := &desktop.ScreenshotRequest{Format: "jpeg", Quality: 70, Scale: 0.5, Cursor: true}
	if d := cmp.Diff(want, e.agent.lastShot, protocmp.Transform()); d != "" {
		t.Errorf("agent request (-want +got):\n%s", d)
	}

	got := decode[screenshotJSON](t, e.do("GET", base, nil, "Accept", "application/json"), 200)
	data, _ := base64.StdEncoding.DecodeString(got.Data)
	if got.Format != "png" || got.Width != 1024 || got.Height != 768 || string(data) != "IMG-png" {
		t.Errorf("json: %+v", got)
	}
	// An image Accept gets the image.
	if w := e.do("GET", base, nil, "Accept", "image/png, application/json;q=0"); w.Header().Get("Content-Type") != "image/png" {
		t.Errorf("Accept with q=0 json: %q", w.Header().Get("Content-Type"))
	}

	wantError(t, e.do("GET", base+"?format=bmp", nil), 400, codeInvalid)
	if n := testutil.CollectAndCount(e.metrics.ScreenshotDuration); n != 2 {
		t.Errorf("screenshot histograms = %d, want 2 (png, jpeg)", n)
	}
	if got := errorOf(t, e.do("GET", base+"?scale=7", nil)); got.Index != nil {
		t.Errorf("query error has an index: %v", *got.Index)
	}
}

type actionsResponse struct {
	Results    []map[string]any `json:"results"`
	DurationMS *int64           `json:"duration_ms"`
}

func TestActions(t *testing.T) {
	e := newTestEnv(t, Config{})
	p := "/v1/sandboxes/" + runningID + "/actions"

	got := decode[actionsResponse](t, e.do("POST", p, strings.NewReader(`{"type":"click","x":10,"y":20}`)), 200)
	if d := cmp.Diff([]map[string]any{{"type": "click"}}, got.Results); d != "" || got.DurationMS == nil {
		t.Errorf("single click (-want +got):\n%s duration %v", d, got.DurationMS)
	}
	if a := e.agent.lastAct.GetActions()[0]; a.GetButton() != "left" || a.GetCount() != 1 || a.GetX() != 10 {
		t.Errorf("agent got %v", a)
	}

	body := `{"actions":[{"type":"move","x":1,"y":2},{"type":"cursor_position"},{"type":"screen_size"},
		{"type":"screenshot","format":"jpeg"},{"type":"windows"},{"type":"key","keys":"ctrl+t"}]}`
	got = decode[actionsResponse](t, e.do("POST", p, strings.NewReader(body)), 200)
	want := []map[string]any{
		{"type": "move"},
		{"type": "cursor_position", "x": 5.0, "y": 0.0},
		{"type": "screen_size", "width": 1024.0, "height": 768.0},
		{"type": "screenshot", "format": "jpeg", "width": 1024.0, "height": 768.0, "data": base64.StdEncoding.EncodeToString([]byte("IMG-jpeg"))},
		{"type": "windows", "windows": []any{map[string]any{"id": 7.0, "title": "Chromium", "class": "chromium",
			"x": 0.0, "y": 0.0, "width": 800.0, "height": 600.0, "focused": true}}},
		{"type": "key"},
	}
	if d := cmp.Diff(want, got.Results); d != "" {
		t.Errorf("results (-want +got):\n%s", d)
	}
	if n := testutil.ToFloat64(e.metrics.HTTPRequests.WithLabelValues("POST /v1/sandboxes/{id}/actions", "200")); n != 2 {
		t.Errorf("request count %v", n)
	}
	if n := testutil.CollectAndCount(e.metrics.ActionDuration); n != 2 {
		t.Errorf("action histograms = %d, want 2 (click, batch)", n)
	}

	// Invalid input is rejected before the agent sees it, with the index.
	for _, c := range []struct {
		body  string
		index int
	}{
		{`{"type":"fly"}`, 0},
		{`{"actions":[{"type":"move","x":1,"y":1},{"type":"fly"}]}`, 1},
		{`{"actions":[{"type":"move","x":1,"y":1},{"type":"click","button":"huge"}]}`, 1},
		{`{"actions":[{"type":"wait","duration_ms":1},{"type":"wait","duration_ms":1},{"type":"key","keys":"notakey"}]}`, 2},
		{`{"type":"click","x":-1,"y":0}`, 0},
		{`{"type":"move","x":1,"y":1,"extra":true}`, 0},
		{`not json`, 0},
		{`{"actions":[]}`, 0},
	} {
		e.agent.lastAct = nil
		we := wantError(t, e.do("POST", p, strings.NewReader(c.body)), 400, codeInvalid)
		if we.Index == nil || *we.Index != c.index {
			t.Errorf("%s: index %v, want %d", c.body, we.Index, c.index)
		}
		if e.agent.lastAct != nil {
			t.Errorf("%s reached the agent", c.body)
		}
	}

	// The agent rejects a point off the screen: 400 with its index and the
	// results so far.
	w := e.do("POST", p, strings.NewReader(`{"actions":[{"type":"screen_size"},{"type":"click","x":5000,"y":1}]}`))
	we := wantError(t, w, 400, codeInvalid)
	if we.Index == nil || *we.Index != 1 || !strings.Contains(we.Message, "outside the screen") {
		t.Errorf("agent rejection: %+v", we)
	}
	partial := decode[actionsResponse](t, w, 400)
	if len(partial.Results) != 1 || partial.Results[0]["type"] != "screen_size" {
		t.Errorf("partial results %v", partial.Results)
	}

	// An internal failure in the agent: 500 with the index, no details.
	w = e.do("POST", p, strings.NewReader(`{"actions":[{"type":"move","x":1,"y":1},{"type":"wait","duration_ms":59999}]}`))
	we = wantError(t, w, http.StatusInternalServerError, codeInternal)
	if we.Index == nil || *we.Index != 1 || strings.Contains(w.Body.String(), "X11") {
		t.Errorf("internal failure: %s", w.Body.String())
	}
	if !strings.Contains(e.logs.String(), "X connection lost") {
		t.Error("agent failure not logged")
	}

	// The X server died under the action (the session restarts it): 503,
	// worth a retry, not a fault of the daemon.
	w = e.do("POST", p, strings.NewReader(`{"actions":[{"type":"move","x":1,"y":1},{"type":"wait","duration_ms":59998}]}`))
	we = wantError(t, w, http.StatusServiceUnavailable, codeUnavailable)
	if we.Index == nil || *we.Index != 1 || !strings.Contains(we.Message, "restarting") {
		t.Errorf("display gone: %s", w.Body.String())
	}
}

// TestHeadlessSandbox checks that the desktop calls of a sandbox without a
// desktop answer 409 no_desktop, and that its commands and files still work.
func TestHeadlessSandbox(t *testing.T) {
	e := newTestEnv(t, Config{})
	base := "/v1/sandboxes/" + headlessID
	for _, c := range []struct {
		method, path, body string
		header             string
	}{
		{"GET", "/screenshot", "", ""},
		{"GET", "/screenshot", "", PassiveHeader},
		{"POST", "/actions", `{"type":"screen_size"}`, ""},
		{"POST", "/actions", `{"actions":[{"type":"click","x":1,"y":1}]}`, ""},
	} {
		t.Run(c.method+c.path+c.header, func(t *testing.T) {
			var hdr []string
			if c.header != "" {
				hdr = []string{c.header, "1"}
			}
			w := e.do(c.method, base+c.path, strings.NewReader(c.body), hdr...)
			wantError(t, w, http.StatusConflict, codeNoDesktop)
			if !strings.Contains(w.Body.String(), "no X server") {
				t.Errorf("message does not say why: %s", w.Body.String())
			}
		})
	}
	// The live view: no link, no WebSocket.
	ve := newViewEnv(t, Config{})
	wantError(t, ve.do("POST", base+"/view", strings.NewReader(`{}`)), http.StatusConflict, codeNoDesktop)
	ws := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	wantError(t, ve.do("GET", base+"/vnc", nil, ws...), http.StatusConflict, codeNoDesktop)

	if w := e.do("GET", base+"/files/list?path=/", nil); w.Code != http.StatusOK {
		t.Errorf("files/list of a headless sandbox = %d %s, want 200", w.Code, w.Body)
	}
	if w := e.do("GET", base, nil); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"desktop":false`) {
		t.Errorf("GET sandbox = %d %s, want 200 with \"desktop\":false", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/"+runningID, nil); !strings.Contains(w.Body.String(), `"desktop":true`) {
		t.Errorf("GET of a desktop sandbox = %s, want \"desktop\":true", w.Body)
	}
}
