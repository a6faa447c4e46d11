package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/strictjson"
)

// errorBody is E2B's Error schema, the body of every error answer.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// statusError is an error decided in this package: a status and a message
// meant for users.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

// statusErrorf returns a statusError with a formatted user message.
func statusErrorf(status int, format string, args ...any) error {
	return &statusError{status: status, msg: fmt.Sprintf(format, args...)}
}

// badRequestf returns a 400 with a user message.
func badRequestf(format string, args ...any) error {
	return statusErrorf(http.StatusBadRequest, format, args...)
}

// notFound is the answer for a sandbox this API does not know (or no longer
// knows: see the package doc on stopped sandboxes).
func notFound(id string) error {
	return statusErrorf(http.StatusNotFound, "sandbox %q not found", id)
}

// statusClientClosed is nginx's status for a client that went away; only
// logs see it.
const statusClientClosed = 499

// kinds maps each errdefs kind to its status and the message used when the
// error carries no user message. Capacity is 429 because that is how E2B
// says "too many sandboxes"; the SDK makes it a RateLimitError.
var kinds = []struct {
	kind   error
	status int
	msg    string
}{
	{errdefs.ErrNotFound, http.StatusNotFound, "not found"},
	{errdefs.ErrInvalid, http.StatusBadRequest, "invalid argument"},
	{errdefs.ErrConflict, http.StatusConflict, "conflict"},
	{errdefs.ErrCapacity, http.StatusTooManyRequests, "no capacity for another sandbox"},
	{errdefs.ErrRateLimited, http.StatusTooManyRequests, "too many requests"},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, "temporarily unavailable"},
	{errdefs.ErrTimeout, http.StatusGatewayTimeout, "timed out"},
	{errdefs.ErrNotSupported, http.StatusNotImplemented, "not supported by cubicle"},
	{errdefs.ErrPayloadTooLarge, http.StatusRequestEntityTooLarge, "payload too large"},
	{errdefs.ErrUnauthorized, http.StatusUnauthorized, "unauthorized"},
}

// classify is the one place that maps an error to the status and message of
// its answer. Internal errors get a generic message; writeError logs them.
func classify(err error) (int, string) {
	var se *statusError
	if errors.As(err, &se) {
		return se.status, se.msg
	}
	var je *strictjson.Error
	if errors.As(err, &je) {
		// A body that could not be read or decoded (readBody).
		return http.StatusBadRequest, je.Error()
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)
	}
	for _, k := range kinds {
		if errors.Is(err, k.kind) {
			if msg := errdefs.UserMessage(err); msg != "" {
				return k.status, msg
			}
			return k.status, k.msg
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "timed out"
	case errors.Is(err, context.Canceled):
		return statusClientClosed, "request canceled"
	}
	return http.StatusInternalServerError, "internal error"
}

// writeError answers with err's status and E2B's error body. Server-side
// errors are logged with their details, which the body never carries.
func writeError(w http.ResponseWriter, log *slog.Logger, r *http.Request, err error) {
	status, msg := classify(err)
	if status >= 500 {
		attrs := []any{"method", r.Method, "path", r.URL.Path, "status", status, "err", err}
		if id := r.PathValue("id"); id != "" {
			attrs = append(attrs, "sandbox", id)
		}
		log.ErrorContext(r.Context(), "e2b: request failed", attrs...)
	}
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only this package's own types are encoded: a bug, not bad input.
		status = http.StatusInternalServerError
		body = []byte(`{"code":500,"message":"internal error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
