package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/strictjson"
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

// readBody reads a request body of at most limit bytes (see
// strictjson.ReadBody; classify answers its errors).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return strictjson.ReadBody(w, r, limit)
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

// decodeOptionalJSON is decodeJSON for a body that may be left out: an
// empty body leaves v as it is.
func decodeOptionalJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	return decodeStrict(body, v)
}

// decodeOptionalEmpty accepts an empty body or an empty JSON object, and
// refuses any member: an endpoint that takes no arguments.
func decodeOptionalEmpty(w http.ResponseWriter, r *http.Request, limit int64) error {
	var none struct{}
	return decodeOptionalJSON(w, r, limit, &none)
}

// decodeStrict decodes exactly one JSON value into v the strict way (see
// strictjson.Decode). Errors about the body are 400 invalid_argument with a
// message free of Go types; an error a field's UnmarshalJSON made here is
// answered as it is.
func decodeStrict(data []byte, v any) error {
	err := strictjson.Decode(data, v)
	var he *httpError
	var je *strictjson.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &he):
		return he
	case errors.As(err, &je):
		return invalidf("invalid JSON body: %s", je.Error())
	}
	return err
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
