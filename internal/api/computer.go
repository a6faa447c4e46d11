package api

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/computer"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// computerDesktop returns the agent of a running desktop sandbox and the
// size of its screen, which the vendor endpoints scale against. The size
// is asked of the agent on every call (one short round trip): a screen
// the sandbox's own programs resized is still scaled right.
func (s *server) computerDesktop(r *http.Request, id string) (*agentclient.Client, computer.Size, error) {
	ac, err := s.mgr.Agent(r.Context(), id)
	if err == nil {
		err = s.requireDesktop(r.Context(), id)
	}
	if err != nil {
		return nil, computer.Size{}, err
	}
	screen, err := computer.ScreenSize(r.Context(), ac.Desktop)
	return ac, screen, err
}

// computerAnthropic runs a tool_use of Anthropic's computer tool (or the
// tool_use blocks of one model turn) and answers the tool_result(s) to
// send back. Bad input is a 400 that also carries the tool_result(s), as
// errors, so that an agent loop can hand the model the reason.
func (s *server) computerAnthropic(w http.ResponseWriter, r *http.Request) {
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
	call, err := computer.ParseAnthropic(body)
	if err != nil {
		var eb errorBody
		if call != nil {
			resp := call.ErrorResponse(err)
			eb.ToolResult, eb.ToolResults = resp.Result, resp.Results
		}
		s.writeErrorBody(w, r, err, eb)
		return
	}
	ac, screen, err := s.computerDesktop(r, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	start := time.Now()
	resp, err := call.Run(r.Context(), ac.Desktop, screen)
	s.metrics.ActionDuration.WithLabelValues("anthropic").Observe(time.Since(start).Seconds())
	if err != nil {
		if resp.Result == nil && resp.Results == nil {
			resp = call.ErrorResponse(err)
		}
		s.writeErrorBody(w, r, err, errorBody{ToolResult: resp.Result, ToolResults: resp.Results})
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// computerOpenAI runs a computer_call of OpenAI's computer tool and
// answers the computer_call_output to send back. A call with pending
// safety checks runs only when the request acknowledges them: they are
// for a person to confirm, not for cubicle to wave through.
func (s *server) computerOpenAI(w http.ResponseWriter, r *http.Request) {
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
	call, err := computer.ParseOpenAI(body)
	if err != nil {
		var eb errorBody
		if call != nil {
			// Only an action is wrong: the answer carries the screen as
			// it is (nothing ran), for the loop to send back.
			if ac, screen, derr := s.computerDesktop(r, id); derr == nil {
				if o, oerr := call.Observe(r.Context(), ac.Desktop, screen); oerr == nil {
					eb.ComputerCallOutput = &o
				}
			}
		}
		s.writeErrorBody(w, r, err, eb)
		return
	}
	if checks, ack := call.SafetyChecks(); len(checks) > 0 && !ack {
		var words []string
		for _, c := range checks {
			words = append(words, c.Code+": "+c.Message)
		}
		s.writeError(w, r, errdefs.New(errdefs.ErrConflict,
			"the computer_call has pending safety checks (%s); nothing was run. Have a person confirm them, then send the call again with \"acknowledge_safety_checks\": true",
			strings.Join(words, "; ")))
		return
	}
	ac, screen, err := s.computerDesktop(r, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	start := time.Now()
	out, err := call.Run(r.Context(), ac.Desktop, screen)
	s.metrics.ActionDuration.WithLabelValues("openai").Observe(time.Since(start).Seconds())
	if err != nil {
		var eb errorBody
		var re *computer.RequestError
		var fl *computer.Failure
		if errors.As(err, &re) || errors.As(err, &fl) {
			// The screen after what ran (nothing, for a bad request).
			if o, oerr := call.Observe(r.Context(), ac.Desktop, screen); oerr == nil {
				eb.ComputerCallOutput = &o
			}
		}
		s.writeErrorBody(w, r, err, eb)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
