package api

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/computer"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/proto/desktop"
)

// parseScreenshotQuery parses the query of GET /screenshot (format, quality,
// scale or width, x, y, w, h, cursor, settle_ms, settle_max_ms) into the
// agent's request. It uses the action package's parser, so the GET and the
// screenshot action accept the same options. Errors are *action.Error (400 invalid_argument).
func parseScreenshotQuery(q url.Values) (*desktop.ScreenshotRequest, error) {
	a, err := action.ScreenshotFromQuery(q)
	if err != nil {
		return nil, err
	}
	return action.ScreenshotRequest(a), nil
}

// screenshotJSON is the JSON form of a screenshot (Accept: application/json
// and the screenshot action's result).
type screenshotJSON struct {
	Format string `json:"format"`
	Width  int32  `json:"width"`
	Height int32  `json:"height"`
	Data   string `json:"data"`
	// Settled and SettleWaitMS are there only when the request had
	// settle_ms (and the agent knows it).
	Settled      *bool   `json:"settled,omitempty"`
	SettleWaitMS *uint32 `json:"settle_wait_ms,omitempty"`
}

// PassiveHeader marks a request that watches rather than uses a sandbox: a
// screenshot with "X-Cubicle-Passive: 1" does not restart the idle timer.
// The dashboard's thumbnails send it, so an open dashboard does not keep
// every sandbox alive.
const PassiveHeader = "X-Cubicle-Passive"

// screenshotAgent is the agent for a screenshot; passive ones do not count
// as activity.
func (s *server) screenshotAgent(r *http.Request, id string) (*agentclient.Client, error) {
	var ac *agentclient.Client
	var err error
	if r.Header.Get(PassiveHeader) == "1" {
		ac, _, err = s.mgr.Watch(r.Context(), id)
	} else {
		ac, err = s.mgr.Agent(r.Context(), id)
	}
	if err != nil {
		return nil, err
	}
	return ac, s.requireDesktop(r.Context(), id)
}

// requireDesktop answers ErrNoDesktop for a headless sandbox, whose image
// has no X server: desktop calls could only fail, or wait for a display
// that never comes.
func (s *server) requireDesktop(ctx context.Context, id string) error {
	sb, err := s.mgr.Get(ctx, id)
	if err != nil {
		return err
	}
	if sb.Headless() {
		return errdefs.New(errdefs.ErrNoDesktop, "sandbox %s has no desktop: its image has no X server (Xvfb or Xvnc), so screenshots, input and the live view cannot work; commands and files do", id)
	}
	return nil
}

func (s *server) screenshot(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req, err := parseScreenshotQuery(r.URL.Query())
	if err != nil {
		s.writeError(w, r, stripIndex(err))
		return
	}
	ac, err := s.screenshotAgent(r, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	start := time.Now()
	resp, err := ac.Desktop.Screenshot(r.Context(), connect.NewRequest(req))
	s.metrics.ScreenshotDuration.WithLabelValues(req.GetFormat()).Observe(time.Since(start).Seconds())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	shot := resp.Msg
	format := shot.GetFormat()
	if format != action.FormatPNG && format != action.FormatJPEG {
		format = req.GetFormat() // the agent's answer names no format we know
	}
	w.Header().Set("Cache-Control", "no-store")
	if accepts(r, "application/json") {
		js := screenshotJSON{
			Format: format, Width: shot.GetWidth(), Height: shot.GetHeight(),
			Data: base64.StdEncoding.EncodeToString(shot.GetData()),
		}
		if shot.Settled != nil {
			wait := shot.GetSettleWaitMs()
			js.Settled, js.SettleWaitMS = shot.Settled, &wait
		}
		writeJSON(w, http.StatusOK, js)
		return
	}
	h := w.Header()
	if shot.Settled != nil {
		h.Set("X-Screenshot-Settled", strconv.FormatBool(shot.GetSettled()))
		h.Set("X-Screenshot-Settle-Wait-Ms", strconv.FormatUint(uint64(shot.GetSettleWaitMs()), 10))
	}
	h.Set("Content-Type", "image/"+format)
	h.Set("Content-Length", strconv.Itoa(len(shot.GetData())))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Screenshot-Width", strconv.Itoa(int(shot.GetWidth())))
	h.Set("X-Screenshot-Height", strconv.Itoa(int(shot.GetHeight())))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(shot.GetData())
}

// stripIndex drops the action index of a query error: a GET has no list.
func stripIndex(err error) error {
	he := classify(err)
	he.index = nil
	return he
}

func (s *server) actions(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := readBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	acts, err := action.Parse(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ac, err := s.mgr.Agent(r.Context(), id)
	if err == nil {
		err = s.requireDesktop(r.Context(), id)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out, err := computer.Run(r.Context(), ac.Desktop, acts)
	// The agent runs the list in one call: a single action is timed under its
	// type, a list under "batch".
	label := "batch"
	if len(acts) == 1 {
		label = acts[0].Type
	}
	s.metrics.ActionDuration.WithLabelValues(label).Observe(out.Duration.Seconds())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	results := make([]map[string]any, 0, len(out.Results))
	for _, res := range out.Results {
		results = append(results, actionResult(res))
	}
	if out.Failure != nil {
		s.writeErrorResults(w, r, out.Failure, results)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Results    []map[string]any `json:"results"`
		DurationMS int64            `json:"duration_ms"`
	}{results, out.Duration.Milliseconds()})
}

// actionResult is the JSON form of one action's result: {"type"} plus the
// fields its type reports (API.md "Desktop"); clipboard_get always has
// "text", "" for an empty clipboard.
func actionResult(res computer.Result) map[string]any {
	out := map[string]any{"type": res.Type}
	switch {
	case res.Cursor != nil:
		out["x"], out["y"] = res.Cursor.X, res.Cursor.Y
	case res.Size != nil:
		out["width"], out["height"] = res.Size.Width, res.Size.Height
	case res.Image != nil:
		out["format"] = res.Image.Format
		out["width"], out["height"] = res.Image.Width, res.Image.Height
		out["data"] = base64.StdEncoding.EncodeToString(res.Image.Data)
		if res.Image.Settled != nil {
			out["settled"] = *res.Image.Settled
			out["settle_wait_ms"] = res.Image.SettleWait.Milliseconds()
		}
	case res.Windows != nil:
		wins := make([]map[string]any, 0, len(res.Windows))
		for _, win := range res.Windows {
			wins = append(wins, map[string]any{
				"id": win.ID, "title": win.Title, "class": win.Class,
				"x": win.X, "y": win.Y, "width": win.Width, "height": win.Height,
				"focused": win.Focused,
			})
		}
		out["windows"] = wins
	case res.Text != nil:
		out["text"] = *res.Text
	}
	return out
}
