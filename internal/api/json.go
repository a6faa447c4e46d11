package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"
)

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only our own types are encoded; this is a bug, not bad input.
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"code":"internal","message":"internal error"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// readBody reads a JSON request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
}

// decodeJSON decodes a request body of at most limit bytes into v, strictly:
// unknown fields, trailing data and an empty body are errors.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	return decodeStrict(body, v)
}

// decodeStrict decodes exactly one JSON value into v, rejecting unknown
// fields. Errors are 400 invalid_argument with a message free of Go types.
func decodeStrict(data []byte, v any) error {
	// encoding/json takes null for any struct and changes nothing: a
	// request of "null" would pass for "{}" (a create with every default).
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return invalidf("invalid JSON body: expected a JSON object, not null")
	}
	// encoding/json turns invalid UTF-8 into U+FFFD without a word; a
	// command or path would then run or name something else than sent.
	if !utf8.Valid(data) {
		return invalidf("invalid JSON body: not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var he *httpError
		if errors.As(err, &he) {
			return he
		}
		return invalidf("invalid JSON body: %s", jsonMessage(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalidf("invalid JSON body: unexpected data after the JSON value")
	}
	return nil
}

// jsonMessage turns an encoding/json error into words for users.
func jsonMessage(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Sprintf("field %q has the wrong type (%s)", te.Field, te.Value)
		}
		return fmt.Sprintf("wrong type (%s)", te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("malformed JSON at byte %d", se.Offset)
	}
	if errors.Is(err, io.EOF) {
		return "empty body"
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "truncated JSON"
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown field " + rest
	}
	return strings.TrimPrefix(msg, "json: ")
}

// accepts reports whether the Accept header of r names mediaType (with a
// non-zero quality).
func accepts(r *http.Request, mediaType string) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil || !strings.EqualFold(mt, mediaType) {
				continue
			}
			if q, ok := params["q"]; ok && strings.Trim(q, "0.") == "" {
				continue
			}
			return true
		}
	}
	return false
}
