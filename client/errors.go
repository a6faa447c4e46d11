package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The API error codes of API.md. APIError.Code holds one of these, or a
// newer code this SDK does not know yet.
const (
	CodeUnauthorized    = "unauthorized"
	CodeNotFound        = "not_found"
	CodeInvalidArgument = "invalid_argument"
	CodeConflict        = "conflict"
	// CodeNoDesktop answers a desktop call (screenshot, actions, live view)
	// of a headless sandbox (Sandbox.Desktop false; see IsNoDesktop).
	CodeNoDesktop = "no_desktop"
	// CodeNotSupported answers what the sandbox's backend cannot do
	// (volumes on a backend without them, for one).
	CodeNotSupported      = "not_supported"
	CodePayloadTooLarge   = "payload_too_large"
	CodeCapacityExhausted = "capacity_exhausted"
	CodeRateLimited       = "rate_limited"
	CodeTimeout           = "timeout"
	CodeInternal          = "internal"
)

// APIError is an error answer of the daemon: a non-2xx status with the body
// {"error": {"code": "...", "message": "..."}}.
type APIError struct {
	// Status is the HTTP status code; 0 for an error reported inside an
	// exec output stream, after the 200 was sent.
	Status int
	// Code is the snake_case API error code, such as "not_found". When the
	// body carries none (a proxy answered, say) it is derived from Status.
	Code string
	// Message is the daemon's human-readable message.
	Message string
	// Index is, for a failed Actions call, the position of the action that
	// failed; the ones before it ran. Nil otherwise.
	Index *int
	// Body is the error answer as the daemon sent it. The vendor
	// computer-use endpoints put there, beside "error", the tool_result
	// that tells the model what went wrong (ComputerAnthropic).
	Body json.RawMessage

	retryAfter time.Duration
}

// Error returns the message, code and status, e.g.
// "sandbox abc not found (not_found, HTTP 404)".
func (e *APIError) Error() string {
	var b strings.Builder
	// The daemon's messages of failed actions already name the action.
	if e.Index != nil && !strings.HasPrefix(e.Message, fmt.Sprintf("action %d", *e.Index)) {
		fmt.Fprintf(&b, "action %d: ", *e.Index)
	}
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Status == 0 {
		fmt.Fprintf(&b, "%s (%s)", msg, e.Code)
	} else {
		fmt.Fprintf(&b, "%s (%s, HTTP %d)", msg, e.Code, e.Status)
	}
	return b.String()
}

// errorBody is the wire form of an error answer. The action index is read
// from inside the error object or beside it.
type errorBody struct {
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Index   *int   `json:"index"`
	} `json:"error"`
	Index *int `json:"index"`
}

func parseAPIError(resp *http.Response, body []byte) *APIError {
	e := &APIError{Status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}
	var eb errorBody
	if json.Valid(body) {
		e.Body = append(json.RawMessage(nil), body...)
	}
	if json.Unmarshal(body, &eb) == nil && eb.Error != nil {
		e.Code, e.Message = eb.Error.Code, eb.Error.Message
		e.Index = eb.Error.Index
		if e.Index == nil {
			e.Index = eb.Index
		}
	} else {
		e.Message = strings.TrimSpace(string(body))
		if len(e.Message) > 200 {
			e.Message = e.Message[:200] + "…"
		}
	}
	if e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
	}
	return e
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return CodeUnauthorized
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusBadRequest:
		return CodeInvalidArgument
	case http.StatusConflict:
		return CodeConflict
	case http.StatusRequestEntityTooLarge:
		return CodePayloadTooLarge
	case http.StatusTooManyRequests:
		return CodeRateLimited
	case http.StatusServiceUnavailable:
		return CodeCapacityExhausted
	case http.StatusGatewayTimeout:
		return CodeTimeout
	default:
		return CodeInternal
	}
}

// ErrorCode returns the API error code of err ("not_found", …), or "" when
// err is not (and does not wrap) an *APIError.
func ErrorCode(err error) string {
	var e *APIError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// IsNotFound reports whether err is the daemon saying the sandbox, file or
// path does not exist (404 not_found).
func IsNotFound(err error) bool { return ErrorCode(err) == CodeNotFound }

// IsUnauthorized reports whether the daemon rejected the API key (401).
func IsUnauthorized(err error) bool { return ErrorCode(err) == CodeUnauthorized }

// IsInvalidArgument reports whether the daemon rejected the request as
// malformed or out of range (400 invalid_argument).
func IsInvalidArgument(err error) bool { return ErrorCode(err) == CodeInvalidArgument }

// IsConflict reports whether the request does not fit the sandbox's state,
// e.g. it is not running (409 conflict).
func IsConflict(err error) bool { return ErrorCode(err) == CodeConflict }

// IsNoDesktop reports whether a desktop call (screenshot, actions, live
// view) was made to a headless sandbox, whose image has no X server (409
// no_desktop).
func IsNoDesktop(err error) bool { return ErrorCode(err) == CodeNoDesktop }

// IsCapacityExhausted reports whether the daemon has no room for another
// sandbox (capacity_exhausted).
func IsCapacityExhausted(err error) bool { return ErrorCode(err) == CodeCapacityExhausted }

// IsRateLimited reports whether the daemon asked the caller to slow down
// (429 rate_limited).
func IsRateLimited(err error) bool { return ErrorCode(err) == CodeRateLimited }

// IsTimeout reports whether the daemon gave up waiting (504 timeout). It
// does not report the caller's own context deadline; check
// errors.Is(err, context.DeadlineExceeded) for that.
func IsTimeout(err error) bool { return ErrorCode(err) == CodeTimeout }

// IsNotSupported reports whether err says the sandbox's backend or agent
// cannot do what was asked (409 not_supported), such as a pause on a
// backend that cannot pause.
func IsNotSupported(err error) bool { return ErrorCode(err) == CodeNotSupported }
