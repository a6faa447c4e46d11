package harness

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/cubicle-dev/cubicle/client"
)

// NoAnswer reports whether err says that no answer came at all: the
// connection was refused, reset or cut, or the call timed out. An answer
// that came and was wrong (an API error of any status, a body that did
// not decode, a check of the caller's that failed) is not one: a test that
// forgives a daemon's absence (a restart, a kill) must not forgive those.
func NoAnswer(err error) bool {
	if err == nil {
		return false
	}
	var ae *client.APIError
	if errors.As(err, &ae) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}
