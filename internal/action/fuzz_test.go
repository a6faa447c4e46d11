package action

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"type":"move","x":10,"y":20}`,
		`{"type":"click","x":1,"y":2,"button":"right","count":2}`,
		`{"actions":[{"type":"key","keys":"ctrl+shift+t"},{"type":"type","text":"héllo ж 東 ✓"}]}`,
		`{"type":"drag","path":[[0,0],[5,6]]}`,
		`{"type":"screenshot","format":"jpeg","x":1,"y":2,"w":3,"h":4,"scale":0.5}`,
		`{"type":"key","keys":["ctrl","+"]}`,
		`{"type":"scroll","direction":"down","amount":3}`,
		`{"actions":[null]}`,
		`{"type":"wait","duration_ms":1e3}`,
		`{"type":"screenshot","settle_ms":250,"settle_max_ms":3000}`,
		`{"type":"screenshot","settle_ms":9000}`,
		`{"type":"click","button":"back"}`,
		`{"type":"drag","path":[[0,0],[5,6]],"button":"forward"}`,
		`{"actions":[{"type":"clipboard_set","text":"é✓\u0001"},{"type":"clipboard_get"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		as, err := Parse(body)
		if err != nil {
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is %T, want *Error", err, err)
			}
			return
		}
		if len(as) == 0 || len(as) > MaxActions {
			t.Fatalf("Parse returned %d actions", len(as))
		}
		for _, a := range as {
			// A parsed action is normalized, survives JSON and proto
			// round trips, and validates without panicking.
			n, err := Normalize(a)
			if err != nil || !reflect.DeepEqual(n, a) {
				t.Fatalf("Normalize(%+v) = %+v, %v", a, n, err)
			}
			js, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			again, err := Parse(js)
			if err != nil || !reflect.DeepEqual(again[0], a) {
				t.Fatalf("JSON round trip of %s: %+v, %v", js, again, err)
			}
			back, err := Normalize(FromProto(ToProto(a)))
			if err != nil || !reflect.DeepEqual(back, a) {
				t.Fatalf("proto round trip of %+v: %+v, %v", a, back, err)
			}
			_ = Validate(a, 1024, 768)
			_ = a.Screenshot()
		}
	})
}

func FuzzParseCombo(f *testing.F) {
	for _, s := range []string{"ctrl+shift+t", "+", "ctrl++", "Return", "é", "ж+東", "0xff0d", "F35", "ctrl+", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keys := SplitCombo(s)
		syms, err := ParseCombo(keys)
		if err != nil {
			return
		}
		if len(syms) != len(keys) {
			t.Fatalf("ParseCombo(%q) = %d keysyms for %d keys", keys, len(syms), len(keys))
		}
		for i, ks := range syms {
			if ks == 0 {
				t.Fatalf("ParseCombo(%q)[%d] = 0", keys, i)
			}
			_ = KeysymName(ks)
			if r, ok := KeysymRune(ks); ok {
				if back, ok := RuneKeysym(r); !ok || back != ks {
					t.Fatalf("RuneKeysym(KeysymRune(%#x)=%q) = %#x, %v", ks, r, back, ok)
				}
			}
		}
	})
}
