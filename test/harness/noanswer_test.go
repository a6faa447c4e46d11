package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/client"
)

func TestNoAnswer(t *testing.T) {
	decodeErr := json.Unmarshal([]byte(`{"cut`), &struct{}{})
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"refused", fmt.Errorf("get: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), true},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"cut mid-body", fmt.Errorf("exec stream: %w", io.ErrUnexpectedEOF), true},
		{"timed out", fmt.Errorf("call: %w", context.DeadlineExceeded), true},
		{"a 500", &client.APIError{Status: http.StatusInternalServerError, Code: "internal", Message: "boom"}, false},
		{"a 500 without a code", &client.APIError{Status: http.StatusInternalServerError}, false},
		{"a 502", fmt.Errorf("x: %w", &client.APIError{Status: http.StatusBadGateway, Code: "unavailable"}), false},
		{"a body that does not decode", fmt.Errorf("decode: %w", decodeErr), false},
		{"a wrong answer", errors.New("screenshot is not a PNG"), false},
	} {
		if got := NoAnswer(tc.err); got != tc.want {
			t.Errorf("%s (%v): NoAnswer = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
