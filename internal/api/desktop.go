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
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/proto/desktop"
)

// parseScreenshotQuery parses the query of GET /screenshot (format, quality,
// scale or width, x, y, w, h, cursor) into the agent's request. It uses the
// action package's parser, so the GET and the screenshot action accept the
// same options. Errors are *action.Error (400 invalid_argument).
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
		writeJSON(w, http.StatusOK, screenshotJSON{
			Format: format, Width: shot.GetWidth(), Height: shot.GetHeight(),
			Data: base64.StdEncoding.EncodeToString(shot.GetData()),
		})
		return
	}
	h := w.Header()
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
	req := &desktop.ActRequest{Actions: make([]*desktop.Action, len(acts))}
	for i, a := range acts {
		req.Actions[i] = action.ToProto(a)
	}
	ac, err := s.mgr.Agent(r.Context(), id)
	if err == nil {
		err = s.requireDesktop(r.Context(), id)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	start := time.Now()
	resp, err := ac.Desktop.Act(r.Context(), connect.NewRequest(req))
	elapsed := time.Since(start)
	// The agent runs the list in one call: a single action is timed under its
	// type, a list under "batch".
	label := "batch"
	if len(acts) == 1 {
		label = acts[0].Type
	}
	s.metrics.ActionDuration.WithLabelValues(label).Observe(elapsed.Seconds())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	msg := resp.Msg
	results := make([]map[string]any, 0, len(msg.GetResults()))
	for _, res := range msg.GetResults() {
		results = append(results, actionResult(res))
	}
	if i := int(msg.GetFailedIndex()); i >= 0 && (msg.GetError() != "" || msg.GetErrorCode() != "") {
		if i >= len(acts) {
			i = len(acts) - 1
		}
		var he *httpError
		switch msg.GetErrorCode() {
		case codeInvalid:
			he = &httpError{status: http.StatusBadRequest, code: codeInvalid,
				msg: "action " + strconv.Itoa(i) + ": " + orDefault(agentMessage(msg.GetError()), "invalid action")}
		case codeUnavailable:
			he = &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
				msg: "action " + strconv.Itoa(i) + ": the desktop is restarting; retry"}
		default:
			s.log.ErrorContext(r.Context(), "action failed in the agent", "sandbox", id,
				"index", i, "type", acts[i].Type, "err", msg.GetError())
			he = &httpError{status: http.StatusInternalServerError, code: codeInternal,
				msg: "action " + strconv.Itoa(i) + " failed: internal error"}
		}
		he.index = &i
		writeJSON(w, he.status, errorBody{
			Error:   apiError{Code: he.code, Message: he.msg, Index: he.index},
			Results: results,
		})
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Results    []map[string]any `json:"results"`
		DurationMS int64            `json:"duration_ms"`
	}{results, elapsed.Milliseconds()})
}

// actionResult is the JSON form of one action's result: {"type"} plus the
// fields its type reports (API.md "Desktop").
func actionResult(res *desktop.ActionResult) map[string]any {
	out := map[string]any{"type": res.GetType()}
	switch res.GetType() {
	case action.TypeCursorPosition:
		out["x"], out["y"] = res.GetX(), res.GetY()
	case action.TypeScreenSize:
		out["width"], out["height"] = res.GetWidth(), res.GetHeight()
	case action.TypeScreenshot:
		shot := res.GetScreenshot()
		out["format"] = shot.GetFormat()
		out["width"], out["height"] = shot.GetWidth(), shot.GetHeight()
		out["data"] = base64.StdEncoding.EncodeToString(shot.GetData())
	case action.TypeWindows:
		wins := make([]map[string]any, 0, len(res.GetWindows()))
		for _, win := range res.GetWindows() {
			wins = append(wins, map[string]any{
				"id": win.GetId(), "title": win.GetTitle(), "class": win.GetClass(),
				"x": win.GetX(), "y": win.GetY(), "width": win.GetWidth(), "height": win.GetHeight(),
				"focused": win.GetFocused(),
			})
		}
		out["windows"] = wins
	}
	return out
}
