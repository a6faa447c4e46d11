// Package errdefs holds the small set of error kinds shared by every layer of
// the daemon. Lower layers wrap these sentinels; the REST API maps them to a
// status code and API error code in exactly one place (internal/api). Any
// package may import it; it imports nothing of the project.
package errdefs

import (
	"errors"
	"fmt"
)

// The error kinds. Wrap them with fmt.Errorf("...: %w", ErrX) or use the
// constructors below, which also mark the message as safe to show users.
var (
	ErrNotFound    = errors.New("not found")
	ErrInvalid     = errors.New("invalid argument")
	ErrConflict    = errors.New("conflict")
	ErrUnavailable = errors.New("unavailable")
	ErrCapacity    = errors.New("capacity exhausted")
	// ErrQuota is ErrCapacity of one caller (an API key at its limit),
	// not of the daemon: the caller, not the daemon, must back off.
	ErrQuota = fmt.Errorf("%w for this API key", ErrCapacity)
	// ErrNoDesktop is ErrConflict of a desktop call (screenshot, input,
	// live view) to a headless sandbox: its image has no X server.
	ErrNoDesktop       = fmt.Errorf("%w: no desktop", ErrConflict)
	ErrRateLimited     = errors.New("rate limited")
	ErrTimeout         = errors.New("timeout")
	ErrNotSupported    = errors.New("not supported")
	ErrPayloadTooLarge = errors.New("payload too large")
	ErrUnauthorized    = errors.New("unauthorized")
)

// userError is an error whose message is meant for API users.
type userError struct {
	kind error
	msg  string
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.kind }

// New returns an error of the given kind whose message is shown to users as is.
func New(kind error, format string, args ...any) error {
	return &userError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// NotFound returns an ErrNotFound error with a user-facing message.
func NotFound(format string, args ...any) error { return New(ErrNotFound, format, args...) }

// Invalid returns an ErrInvalid error with a user-facing message.
func Invalid(format string, args ...any) error { return New(ErrInvalid, format, args...) }

// Conflict returns an ErrConflict error with a user-facing message.
func Conflict(format string, args ...any) error { return New(ErrConflict, format, args...) }

// UserMessage returns the user-facing message of err: the message of the
// outermost error made by New, or "" when err carries none (internal errors
// must not leak host details to users).
func UserMessage(err error) string {
	var ue *userError
	if errors.As(err, &ue) {
		return ue.msg
	}
	return ""
}
