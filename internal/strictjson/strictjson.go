// Package strictjson is the one home of decoding JSON that comes from
// outside the daemon — API request bodies (internal/api, internal/e2b) and
// desktop actions (internal/action) — the one way cubicle accepts it:
// exactly one value, no data after it, no field the target has no place
// for, no null where a value is asked for, valid UTF-8 only (encoding/json
// would turn bad bytes into U+FFFD without a word, and a command or a path
// would then name something other than what was sent), and bodies no
// larger than their limit. Its errors say what is wrong in words meant for
// users, without Go type names.
//
// It depends on the standard library only, so that the in-guest agent may
// import it through internal/action. Any package of the module may import
// it.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"
)

// Error is input that is not the JSON asked for. Its message is meant for
// users and has no prefix; callers put their own ("invalid JSON body: ")
// in front. When the error came from a json.Unmarshaler of the target,
// Unwrap returns it, so a caller's own error types survive errors.As.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }

// Unwrap returns the error of the target's json.Unmarshaler, if any.
func (e *Error) Unwrap() error { return e.err }

func errorf(format string, args ...any) *Error {
	return &Error{msg: fmt.Sprintf(format, args...)}
}

// Options relax Decode for callers whose wire format asks for it.
type Options struct {
	// AllowUnknownFields accepts object fields the target has no place
	// for, and ignores them. E2B's control plane needs it: its SDKs send
	// fields newer than this daemon.
	AllowUnknownFields bool
	// AllowEmpty lets an empty (or all-blank) input leave the target
	// unchanged, for optional bodies; without it that is an error.
	AllowEmpty bool
}

// Decode decodes exactly one JSON value from data into v, which must be a
// non-nil pointer, strictly: unknown fields, data after the value, an empty
// input, a top-level null and invalid UTF-8 are errors. Errors about the
// input are *Error; any other error (a nil or non-pointer v) is a bug of
// the caller.
func Decode(data []byte, v any) error {
	return DecodeWith(data, v, Options{})
}

// DecodeWith is Decode relaxed by o.
func DecodeWith(data []byte, v any, o Options) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		if o.AllowEmpty {
			return nil
		}
		return errorf("empty body")
	}
	// encoding/json takes null for any struct, map or slice and changes
	// nothing: a request of "null" would pass for "{}" (every default).
	if bytes.Equal(trimmed, []byte("null")) {
		return errorf("expected %s, not null", expected(reflect.TypeOf(v)))
	}
	if !utf8.Valid(data) {
		return errorf("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if !o.AllowUnknownFields {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return inWords(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errorf("unexpected data after the JSON value")
	}
	return nil
}

// inWords turns an error of encoding/json into an *Error for users. An
// error it does not know came from the target's own UnmarshalJSON, whose
// words are the target's, and is wrapped as it is.
func inWords(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var ie *json.InvalidUnmarshalError
	switch {
	case errors.As(err, &ie):
		return fmt.Errorf("decode JSON: %w", err) // v is not a pointer: a bug, not bad input
	case errors.As(err, &te):
		if te.Field != "" {
			return errorf("field %q has the wrong type (%s), expected %s", te.Field, te.Value, expected(te.Type))
		}
		return errorf("wrong type (%s), expected %s", te.Value, expected(te.Type))
	case errors.As(err, &se):
		return errorf("malformed JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errorf("truncated JSON")
	case errors.Is(err, io.EOF):
		return errorf("empty body")
	}
	if rest, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return errorf("unknown field %s", rest)
	}
	return &Error{msg: strings.TrimPrefix(err.Error(), "json: "), err: err}
}

// expected names the JSON a Go type takes, for messages.
func expected(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "a JSON object"
	case reflect.Slice, reflect.Array:
		return "a JSON array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a JSON value"
}

// ReadBody reads r's body, of at most limit bytes. A larger one is an
// *http.MaxBytesError (the caller answers 413), found from Content-Length
// before anything is read when the client announced it; a body the client
// broke off or sent broken is an *Error (its fault, a 400, not the
// daemon's). A request without a body gives an empty one.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, fmt.Errorf("read request body: %w", err)
	case err != nil:
		// The client's connection failed (reset, cut, stalled past its
		// deadline): nothing about it is the daemon's to report.
		return nil, errorf("could not read the request body")
	}
	return b, nil
}
