package strictjson

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// target is a request-like struct: the kinds of field a body holds.
type target struct {
	Name   string            `json:"name"`
	Count  int               `json:"count"`
	Ratio  float64           `json:"ratio"`
	On     *bool             `json:"on"`
	Tags   []string          `json:"tags"`
	Labels map[string]string `json:"labels"`
	Inner  *inner            `json:"inner"`
	Custom custom            `json:"custom"`
}

type inner struct {
	X int `json:"x"`
}

// custom has its own UnmarshalJSON, whose error is the caller's.
type custom string

var errCustom = errors.New("custom must be \"a\" or \"b\"")

func (c *custom) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `""`, `"a"`, `"b"`:
		*c = custom(b[1 : len(b)-1])
		return nil
	}
	return errCustom
}

func TestDecode(t *testing.T) {
	on := true
	for _, tt := range []struct {
		name string
		in   string
		opts Options
		want target
		err  string // the whole message; "" = decodes
	}{
		{name: "empty object", in: `{}`},
		{name: "every field", in: `{"name":"n","count":3,"ratio":0.5,"on":true,"tags":["a"],"labels":{"k":"v"},"inner":{"x":1},"custom":"b"}`,
			want: target{Name: "n", Count: 3, Ratio: 0.5, On: &on, Tags: []string{"a"}, Labels: map[string]string{"k": "v"}, Inner: &inner{X: 1}, Custom: "b"}},
		{name: "blanks around", in: " \n\t{\"name\":\"n\"}\r\n ", want: target{Name: "n"}},
		{name: "nested null is a value", in: `{"inner":null,"tags":null}`},
		{name: "Unicode", in: `{"name":"héllo ✓ \u00e9"}`, want: target{Name: "héllo ✓ é"}},

		{name: "empty", in: ``, err: "empty body"},
		{name: "blank", in: " \n ", err: "empty body"},
		{name: "null", in: `null`, err: "expected a JSON object, not null"},
		{name: "null in blanks", in: ` null `, err: "expected a JSON object, not null"},
		{name: "invalid UTF-8", in: "{\"name\":\"a\xffb\"}", err: "not valid UTF-8"},
		{name: "unknown field", in: `{"nmae":"x"}`, err: `unknown field "nmae"`},
		{name: "unknown nested field", in: `{"inner":{"x":1,"y":2}}`, err: `unknown field "y"`},
		{name: "trailing value", in: `{} {}`, err: "unexpected data after the JSON value"},
		{name: "trailing garbage", in: `{}x`, err: "unexpected data after the JSON value"},
		{name: "truncated", in: `{"name":`, err: "truncated JSON"},
		{name: "syntax", in: `{"name" "x"}`, err: "malformed JSON at byte 9: invalid character '\"' after object key"},
		{name: "not an object", in: `[1,2]`, err: "wrong type (array), expected a JSON object"},
		{name: "string for int", in: `{"count":"3"}`, err: `field "count" has the wrong type (string), expected an integer`},
		{name: "fraction for int", in: `{"count":1.5}`, err: `field "count" has the wrong type (number 1.5), expected an integer`},
		{name: "number for string", in: `{"tags":[1]}`, err: `field "tags" has the wrong type (number), expected a string`},
		{name: "nested field path", in: `{"inner":{"x":"1"}}`, err: `field "inner.x" has the wrong type (string), expected an integer`},
		{name: "object for bool", in: `{"on":{}}`, err: `field "on" has the wrong type (object), expected true or false`},
		{name: "the target's own error", in: `{"custom":"c"}`, err: errCustom.Error()},

		{name: "unknown field allowed", in: `{"name":"n","brandNew":{"a":[1]}}`, opts: Options{AllowUnknownFields: true}, want: target{Name: "n"}},
		{name: "allowed unknown field must still be JSON", in: `{"brandNew":}`, opts: Options{AllowUnknownFields: true}, err: "malformed JSON at byte 13: invalid character '}' looking for beginning of value"},
		{name: "trailing data with unknown fields allowed", in: `{"x":1} {}`, opts: Options{AllowUnknownFields: true}, err: "unexpected data after the JSON value"},
		{name: "optional body empty", in: ``, opts: Options{AllowEmpty: true}},
		{name: "optional body blank", in: "  \n", opts: Options{AllowEmpty: true}},
		{name: "optional body null", in: `null`, opts: Options{AllowEmpty: true}, err: "expected a JSON object, not null"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got target
			err := DecodeWith([]byte(tt.in), &got, tt.opts)
			if tt.err == "" {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				if d := cmp.Diff(tt.want, got); d != "" {
					t.Errorf("decoded (-want +got):\n%s", d)
				}
				return
			}
			var je *Error
			if !errors.As(err, &je) {
				t.Fatalf("error %#v, want an *Error %q", err, tt.err)
			}
			if err.Error() != tt.err {
				t.Errorf("message %q, want %q", err.Error(), tt.err)
			}
		})
	}
}

func TestDecodeKeepsTheTargetsError(t *testing.T) {
	var v target
	err := Decode([]byte(`{"custom":"z"}`), &v)
	if !errors.Is(err, errCustom) {
		t.Errorf("error %v does not wrap the UnmarshalJSON error", err)
	}
}

func TestDecodeNullNamesTheTarget(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want string
	}{
		{&target{}, "expected a JSON object, not null"},
		{&map[string]json.RawMessage{}, "expected a JSON object, not null"},
		{&[]json.RawMessage{}, "expected a JSON array, not null"},
		{new(string), "expected a string, not null"},
	} {
		if err := Decode([]byte("null"), tt.v); err == nil || err.Error() != tt.want {
			t.Errorf("Decode(null, %T) = %v, want %q", tt.v, err, tt.want)
		}
	}
}

func TestDecodeNonPointerIsABug(t *testing.T) {
	err := Decode([]byte(`{}`), target{})
	var je *Error
	if err == nil || errors.As(err, &je) {
		t.Errorf("non-pointer target: %#v, want an error that is not a user's *Error", err)
	}
}

// brokenBody fails after some bytes, as a client that breaks off does.
type brokenBody struct{ r io.Reader }

func (b *brokenBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *brokenBody) Close() error { return nil }

func TestReadBody(t *testing.T) {
	for _, tt := range []struct {
		name    string
		body    io.Reader
		length  int64 // Content-Length; -1 unknown
		want    string
		tooBig  bool
		userErr string
	}{
		{name: "small", body: strings.NewReader(`{"a":1}`), length: 7, want: `{"a":1}`},
		{name: "at the limit", body: strings.NewReader(strings.Repeat("a", 10)), length: 10, want: strings.Repeat("a", 10)},
		{name: "unknown length at the limit", body: strings.NewReader(strings.Repeat("a", 10)), length: -1, want: strings.Repeat("a", 10)},
		{name: "no body", body: nil, length: 0, want: ""},
		{name: "announced too large", body: strings.NewReader(strings.Repeat("a", 11)), length: 11, tooBig: true},
		{name: "announced too large, nothing sent", body: strings.NewReader(""), length: 1 << 40, tooBig: true},
		{name: "too large without a length", body: strings.NewReader(strings.Repeat("a", 11)), length: -1, tooBig: true},
		{name: "broken off", body: &brokenBody{strings.NewReader(`{"a":`)}, length: -1, userErr: "could not read the request body"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", tt.body)
			r.ContentLength = tt.length
			if tt.body == nil {
				r.Body = nil
			}
			got, err := ReadBody(httptest.NewRecorder(), r, 10)
			var mbe *http.MaxBytesError
			var je *Error
			switch {
			case tt.tooBig:
				if !errors.As(err, &mbe) || mbe.Limit != 10 {
					t.Errorf("error %v, want a MaxBytesError of limit 10", err)
				}
			case tt.userErr != "":
				if !errors.As(err, &je) || err.Error() != tt.userErr {
					t.Errorf("error %#v, want *Error %q", err, tt.userErr)
				}
			case err != nil:
				t.Errorf("error %v", err)
			case string(got) != tt.want:
				t.Errorf("body %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"name":"n","count":3,"tags":["a"],"labels":{"k":"v"},"inner":{"x":1}}`, `null`, ``, `[]`,
		`{"name":"\ud800"}`, "{\"name\":\"\xff\"}", `{"count":1e3}`, `{} {}`, `{"inner":{"y":1}}`, `{"custom":"a"}`,
		`{"Name":"case-insensitive match"}`, `"str"`, `{"labels":{"":""}}`, ` {"count":-0} `,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, lenient bool) {
		opts := Options{AllowUnknownFields: lenient}
		var v target
		err := DecodeWith(data, &v, opts)
		if err != nil {
			var je *Error
			if !errors.As(err, &je) {
				t.Fatalf("error %#v on input is not an *Error", err)
			}
			msg := err.Error()
			if msg == "" || !utf8.ValidString(msg) || strings.Contains(msg, "json:") ||
				strings.Contains(msg, "strictjson.") || strings.Contains(msg, "reflect") {
				t.Fatalf("message %q is not for users", msg)
			}
			if !lenient {
				// Whatever strict decoding refuses for another reason
				// than an unknown field, lenient decoding refuses too.
				var w target
				if DecodeWith(data, &w, Options{AllowUnknownFields: true}) == nil && !strings.HasPrefix(msg, "unknown field") {
					t.Fatalf("lenient decoding accepted %q, strict refused it with %q", data, msg)
				}
			}
			return
		}
		// Accepted input is one valid JSON value in valid UTF-8, not null.
		if !json.Valid(data) || !utf8.Valid(data) || strings.TrimSpace(string(data)) == "null" {
			t.Fatalf("accepted %q", data)
		}
		// encoding/json reads it the same way: strictness only refuses.
		var plain target
		if err := json.Unmarshal(data, &plain); err != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", data, err)
		}
		if d := cmp.Diff(plain, v); d != "" {
			t.Fatalf("decoded %q unlike encoding/json (-plain +strict):\n%s", data, d)
		}
		// What it decoded encodes back to input it accepts, strictly.
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var w target
		if err := Decode(again, &w); err != nil {
			t.Fatalf("re-encoded %s refused: %v", again, err)
		}
		if d := cmp.Diff(v, w); d != "" {
			t.Fatalf("round trip of %q (-first +second):\n%s", data, d)
		}
	})
}
