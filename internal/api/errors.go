package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/computer"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/strictjson"
)

// API error codes (the "code" of an error body).
const (
	codeUnauthorized     = "unauthorized"
	codeNotFound         = "not_found"
	codeInvalid          = "invalid_argument"
	codeConflict         = "conflict"
	codeNoDesktop        = "no_desktop"
	codePayloadTooLarge  = "payload_too_large"
	codeCapacity         = "capacity_exhausted"
	codeRateLimited      = "rate_limited"
	codeTimeout          = "timeout"
	codeNotSupported     = "not_supported"
	codeUnavailable      = "unavailable"
	codePermissionDenied = "permission_denied"
	codeMethodNotAllowed = "method_not_allowed"
	codeCanceled         = "canceled"
	codeInternal         = "internal"
)

// statusClientClosed is nginx's status for a client that went away; the
// client never sees it, logs and metrics do.
const statusClientClosed = 499

// agentGone answers a request whose agent stream was cut under it.
const agentGone = "the sandbox's agent went away during the request; retry"

// stopNoticeWait bounds how long a failed request waits for its
// sandbox's death to be noticed before answering: the agent's stream
// breaks at once, but the runtime's exit (a ptrace sentry with hundreds
// of threads, on a loaded host) was seen to take over a second.
const stopNoticeWait = 3 * time.Second

// apiError is the inner object of an error body.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Index is the failing action's position (actions endpoint only).
	Index *int `json:"index,omitempty"`
}

// errorBody is the body of every error answer.
type errorBody struct {
	Error apiError `json:"error"`
	// Results are the results of the actions before the failing one.
	Results []map[string]any `json:"results,omitempty"`
	// ToolResult and ToolResults answer the tool uses of a request to
	// Anthropic's computer tool as errors, ready to send back to the model.
	ToolResult  *computer.AnthropicResult  `json:"tool_result,omitempty"`
	ToolResults []computer.AnthropicResult `json:"tool_results,omitempty"`
	// ComputerCallOutput answers a request to OpenAI's computer tool that
	// failed with the screen as it is, so that the agent loop can send the
	// model the call's output with the reason.
	ComputerCallOutput *computer.OpenAIOutput `json:"computer_call_output,omitempty"`
}

// httpError is an error decided in this package: status, code and a message
// meant for users.
type httpError struct {
	status int
	code   string
	msg    string
	index  *int
}

func (e *httpError) Error() string { return e.msg }

// invalidf returns a 400 invalid_argument error with a user message.
func invalidf(format string, args ...any) error {
	return &httpError{status: http.StatusBadRequest, code: codeInvalid, msg: fmt.Sprintf(format, args...)}
}

// kinds maps each errdefs kind to its status, code and default message.
var kinds = []struct {
	kind   error
	status int
	code   string
	msg    string
}{
	{errdefs.ErrNotFound, http.StatusNotFound, codeNotFound, "not found"},
	{errdefs.ErrInvalid, http.StatusBadRequest, codeInvalid, "invalid argument"},
	{errdefs.ErrNoDesktop, http.StatusConflict, codeNoDesktop, "this sandbox has no desktop"},
	{errdefs.ErrConflict, http.StatusConflict, codeConflict, "conflict"},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, codeUnavailable, "temporarily unavailable"},
	{errdefs.ErrQuota, http.StatusTooManyRequests, codeCapacity, "this API key has no room for another sandbox"},
	{errdefs.ErrCapacity, http.StatusServiceUnavailable, codeCapacity, "no capacity for another sandbox"},
	{errdefs.ErrRateLimited, http.StatusTooManyRequests, codeRateLimited, "too many requests"},
	{errdefs.ErrTimeout, http.StatusGatewayTimeout, codeTimeout, "timed out"},
	{errdefs.ErrNotSupported, http.StatusConflict, codeNotSupported, "not supported by this sandbox's backend"},
	{errdefs.ErrPayloadTooLarge, http.StatusRequestEntityTooLarge, codePayloadTooLarge, "payload too large"},
	{errdefs.ErrUnauthorized, http.StatusUnauthorized, codeUnauthorized, "unauthorized"},
}

// classify is the one place that maps an error to the HTTP status, API error
// code and user message of its answer. Messages of internal errors are
// generic; the caller logs the details.
func classify(err error) *httpError {
	var he *httpError
	if errors.As(err, &he) {
		return he
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return &httpError{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
			msg: fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)}
	}
	var je *strictjson.Error
	if errors.As(err, &je) {
		// A body that could not be read or decoded (readBody).
		return &httpError{status: http.StatusBadRequest, code: codeInvalid, msg: je.Error()}
	}
	var ae *action.Error
	if errors.As(err, &ae) {
		i := ae.Index
		return &httpError{status: http.StatusBadRequest, code: codeInvalid, msg: ae.Error(), index: &i}
	}
	var re *computer.RequestError
	if errors.As(err, &re) {
		he := &httpError{status: http.StatusBadRequest, code: codeInvalid, msg: re.Msg}
		if re.Index >= 0 {
			i := re.Index
			he.index = &i
		}
		return he
	}
	var fl *computer.Failure
	if errors.As(err, &fl) {
		i := fl.Index
		switch fl.Code {
		case computer.CodeInvalid:
			return &httpError{status: http.StatusBadRequest, code: codeInvalid, index: &i,
				msg: "action " + strconv.Itoa(i) + ": " + orDefault(fl.Message, "invalid action")}
		case computer.CodeUnavailable:
			return &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable, index: &i,
				msg: "action " + strconv.Itoa(i) + ": the desktop is restarting; retry"}
		}
		return &httpError{status: http.StatusInternalServerError, code: codeInternal, index: &i,
			msg: "action " + strconv.Itoa(i) + " failed: internal error"}
	}
	for _, k := range kinds {
		if errors.Is(err, k.kind) {
			msg := errdefs.UserMessage(err)
			if msg == "" {
				msg = k.msg
			}
			return &httpError{status: k.status, code: k.code, msg: msg}
		}
	}
	var se *agentclient.StatusError
	if errors.As(err, &se) {
		return classifyAgentStatus(se)
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return classifyConnect(ce)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &httpError{status: http.StatusGatewayTimeout, code: codeTimeout, msg: "timed out"}
	case errors.Is(err, context.Canceled):
		return &httpError{status: statusClientClosed, code: codeCanceled, msg: "request canceled"}
	}
	return &httpError{status: http.StatusInternalServerError, code: codeInternal, msg: "internal error"}
}

// classifyConnect maps an error of the agent's Connect services. Messages of
// client-side codes come from the agent and describe the request (a bad
// path, a missing file); others are replaced.
func classifyConnect(ce *connect.Error) *httpError {
	if errors.Is(ce, io.ErrUnexpectedEOF) {
		// The stream was cut mid-message ("incomplete envelope"): the
		// agent or its sandbox went away, not a fault of the request.
		return &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable, msg: agentGone}
	}
	guest := agentMessage(ce.Message())
	switch ce.Code() {
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return &httpError{status: http.StatusBadRequest, code: codeInvalid, msg: orDefault(guest, "invalid argument")}
	case connect.CodeNotFound:
		return &httpError{status: http.StatusNotFound, code: codeNotFound, msg: orDefault(guest, "not found")}
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition, connect.CodeAborted:
		return &httpError{status: http.StatusConflict, code: codeConflict, msg: orDefault(guest, "conflict")}
	case connect.CodePermissionDenied:
		return &httpError{status: http.StatusForbidden, code: codePermissionDenied, msg: orDefault(guest, "permission denied")}
	case connect.CodeUnimplemented:
		return &httpError{status: http.StatusConflict, code: codeNotSupported, msg: "not supported by this sandbox's agent"}
	case connect.CodeResourceExhausted:
		return &httpError{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge, msg: orDefault(guest, "too large")}
	case connect.CodeDeadlineExceeded:
		return &httpError{status: http.StatusGatewayTimeout, code: codeTimeout, msg: "the sandbox did not answer in time"}
	case connect.CodeUnavailable:
		if connect.IsWireError(ce) && guest != "" {
			// The agent answered: it is there, its desktop is not
			// ("the desktop is restarting; retry").
			return &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable, msg: guest}
		}
		return &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable, msg: "the sandbox's agent is unavailable"}
	case connect.CodeCanceled:
		return &httpError{status: statusClientClosed, code: codeCanceled, msg: "request canceled"}
	}
	return &httpError{status: http.StatusInternalServerError, code: codeInternal, msg: "internal error"}
}

// classifyAgentStatus maps a non-2xx answer of the agent's /files endpoints.
func classifyAgentStatus(se *agentclient.StatusError) *httpError {
	guest := agentMessage(se.Message)
	switch se.Code {
	case http.StatusNotFound:
		return &httpError{status: http.StatusNotFound, code: codeNotFound, msg: orDefault(guest, "file not found")}
	case http.StatusBadRequest:
		return &httpError{status: http.StatusBadRequest, code: codeInvalid, msg: orDefault(guest, "invalid argument")}
	case http.StatusForbidden:
		return &httpError{status: http.StatusForbidden, code: codePermissionDenied, msg: orDefault(guest, "permission denied")}
	case http.StatusConflict:
		return &httpError{status: http.StatusConflict, code: codeConflict, msg: orDefault(guest, "conflict")}
	case http.StatusRequestEntityTooLarge:
		return &httpError{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge, msg: orDefault(guest, "payload too large")}
	case http.StatusInsufficientStorage:
		return &httpError{status: http.StatusInsufficientStorage, code: "insufficient_storage", msg: "no space left in the sandbox"}
	}
	return &httpError{status: http.StatusInternalServerError, code: codeInternal, msg: "internal error"}
}

// agentMessage tidies a message from inside a sandbox for an error body: one
// line, valid UTF-8, bounded.
func agentMessage(s string) string {
	s = strings.TrimSpace(strings.ToValidUTF8(s, "\uFFFD"))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	const maxLen = 512
	if len(s) > maxLen {
		cut := maxLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// connectionLost reports whether err is the agent's connection failing
// (refused, reset, cut mid-stream) rather than an answer the agent gave,
// such as "the desktop is restarting". Only then can the sandbox be dying
// under the request, and only then is it worth waiting to find out: the
// agent's own answers go back at once.
func connectionLost(err error) bool {
	var oe *net.OpError
	switch {
	case errors.As(err, &oe),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, context.Canceled),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}

// writeError answers with err's status and error body. Server-side errors
// are logged with their details, which the body never carries.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	s.writeErrorResults(w, r, err, nil)
}

// writeErrorResults is writeError with the results of the actions that ran
// before a failing one.
func (s *server) writeErrorResults(w http.ResponseWriter, r *http.Request, err error, results []map[string]any) {
	s.writeErrorBody(w, r, err, errorBody{Results: results})
}

// writeErrorBody writes err's answer with the other fields of body.
func (s *server) writeErrorBody(w http.ResponseWriter, r *http.Request, err error, body errorBody) {
	he := classify(err)
	if he.status == statusClientClosed && r.Context().Err() == nil {
		// Canceled, but not by this client: the agent's stream was cut
		// under the request (its sandbox's runtime died, say). Seen in
		// the soak as 499s on requests whose clients were waiting.
		he = &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
			msg: agentGone}
	}
	if he.status >= 500 && he.status != http.StatusGatewayTimeout {
		// The sandbox may have died under the request (its runtime
		// killed for memory, say): that is the answer, not a fault of
		// the daemon.
		if id := r.PathValue("id"); id != "" {
			if _, ending, werr := s.mgr.Watch(r.Context(), id); werr == nil && connectionLost(err) {
				// The runtime's death is noticed a moment after
				// the agent's stream breaks.
				select {
				case <-ending:
				case <-time.After(stopNoticeWait):
				case <-r.Context().Done():
				}
			}
			// An error the manager worded itself says what became of
			// the sandbox ("…; it is still paused" of a failed resume):
			// it is the answer. Only an agent's failure is retold.
			if sb, gerr := s.mgr.Get(r.Context(), id); gerr == nil && errdefs.UserMessage(err) == "" &&
				sb.State != sandbox.StateRunning && sb.State != sandbox.StateStarting {
				s.log.Info("request ended by its sandbox stopping", "sandbox", id, "state", sb.State, "err", err)
				he = &httpError{status: http.StatusConflict, code: codeConflict,
					msg: fmt.Sprintf("sandbox %s stopped while the request ran (it is %s)", id, sb.State)}
			}
		}
	}
	if he.status >= 500 {
		s.logInternal(r, "request failed", err)
	}
	body.Error = apiError{Code: he.code, Message: he.msg, Index: he.index}
	writeJSON(w, he.status, body)
}
