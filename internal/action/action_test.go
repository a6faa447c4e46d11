package action

import (
	"errors"
	"image"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

func ip(n int) *int { return &n }

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []Action
	}{
		{"move", `{"type":"move","x":10,"y":20}`, []Action{{Type: "move", X: ip(10), Y: ip(20)}}},
		{"click defaults", `{"type":"click"}`, []Action{{Type: "click", Button: "left", Count: 1}}},
		{"click at", `{"type":"click","x":1,"y":2,"button":"right","count":2}`,
			[]Action{{Type: "click", X: ip(1), Y: ip(2), Button: "right", Count: 2}}},
		{"double", `{"type":"double_click","button":"middle"}`, []Action{{Type: "double_click", Button: "middle"}}},
		{"drag", `{"type":"drag","path":[[0,0],[5,6]]}`, []Action{{Type: "drag", Button: "left", Path: [][2]int{{0, 0}, {5, 6}}}}},
		{"scroll default amount", `{"type":"scroll","direction":"down"}`, []Action{{Type: "scroll", Direction: "down", Amount: 1}}},
		{"type", `{"type":"type","text":"héllo ж","delay_ms":5}`, []Action{{Type: "type", Text: "héllo ж", DelayMS: 5}}},
		{"key string", `{"type":"key","keys":"ctrl+shift+t"}`, []Action{{Type: "key", Keys: Keys{"ctrl", "shift", "t"}}}},
		{"key array", `{"type":"key","keys":["ctrl","c"]}`, []Action{{Type: "key", Keys: Keys{"ctrl", "c"}}}},
		{"key plus", `{"type":"key","keys":"ctrl++"}`, []Action{{Type: "key", Keys: Keys{"ctrl", "+"}}}},
		{"hold", `{"type":"hold_key","keys":"shift","duration_ms":100}`, []Action{{Type: "hold_key", Keys: Keys{"shift"}, DurationMS: 100}}},
		{"wait", `{"type":"wait","duration_ms":60000}`, []Action{{Type: "wait", DurationMS: 60000}}},
		{"screenshot default", `{"type":"screenshot"}`, []Action{{Type: "screenshot", Format: "png"}}},
		{"screenshot region", `{"type":"screenshot","format":"jpg","quality":50,"x":1,"y":2,"w":30,"h":40,"width":10,"cursor":true}`,
			[]Action{{Type: "screenshot", Format: "jpeg", Quality: 50, X: ip(1), Y: ip(2), W: 30, H: 40, Width: 10, Cursor: true}}},
		{"click back", `{"type":"click","button":"back"}`, []Action{{Type: "click", Button: "back", Count: 1}}},
		{"mouse down forward", `{"type":"mouse_down","x":3,"y":4,"button":"forward"}`,
			[]Action{{Type: "mouse_down", X: ip(3), Y: ip(4), Button: "forward"}}},
		{"mouse up back", `{"type":"mouse_up","button":"back"}`, []Action{{Type: "mouse_up", Button: "back"}}},
		{"drag forward", `{"type":"drag","path":[[0,0],[5,6]],"button":"forward"}`,
			[]Action{{Type: "drag", Button: "forward", Path: [][2]int{{0, 0}, {5, 6}}}}},
		{"screenshot settle default max", `{"type":"screenshot","settle_ms":250}`,
			[]Action{{Type: "screenshot", Format: "png", SettleMS: 250, SettleMaxMS: DefaultSettleMaxMS}}},
		{"screenshot settle long", `{"type":"screenshot","settle_ms":3000}`,
			[]Action{{Type: "screenshot", Format: "png", SettleMS: 3000, SettleMaxMS: 3000}}},
		{"screenshot settle max", `{"type":"screenshot","settle_ms":300,"settle_max_ms":10000}`,
			[]Action{{Type: "screenshot", Format: "png", SettleMS: 300, SettleMaxMS: 10000}}},
		{"screenshot settle equal", `{"type":"screenshot","settle_ms":10000,"settle_max_ms":10000}`,
			[]Action{{Type: "screenshot", Format: "png", SettleMS: 10000, SettleMaxMS: 10000}}},
		{"clipboard get", `{"type":"clipboard_get"}`, []Action{{Type: "clipboard_get"}}},
		// Anything on the clipboard, even what no keyboard types.
		{"clipboard set", `{"type":"clipboard_set","text":"héllo ✓ 東京 \u0001\t\n😀"}`,
			[]Action{{Type: "clipboard_set", Text: "héllo ✓ 東京 \u0001\t\n😀"}}},
		{"clipboard set longest", `{"type":"clipboard_set","text":"` + strings.Repeat("é", MaxClipboardBytes/2) + `"}`,
			[]Action{{Type: "clipboard_set", Text: strings.Repeat("é", MaxClipboardBytes/2)}}},
		{"list", `{"actions":[{"type":"cursor_position"},{"type":"screen_size"},{"type":"windows"}]}`,
			[]Action{{Type: "cursor_position"}, {Type: "screen_size"}, {Type: "windows"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.body))
			if err != nil {
				t.Fatalf("Parse(%s): %v", tt.body, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse(%s)\n got %+v\nwant %+v", tt.body, got, tt.want)
			}
			// Normalizing again changes nothing.
			for i := range got {
				n, err := Normalize(got[i])
				if err != nil || !reflect.DeepEqual(n, got[i]) {
					t.Errorf("Normalize(Parse()) = %+v, %v; want unchanged", n, err)
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, body string
		index      int
		msg        string
	}{
		{"empty", ``, 0, "JSON object"},
		{"not object", `[1]`, 0, "JSON object"},
		{"null", `null`, 0, "null"},
		{"invalid UTF-8", "{\"type\":\"type\",\"text\":\"a\xffb\"}", 0, "not valid UTF-8"},
		{"trailing", `{"type":"wait","duration_ms":1} {}`, 0, "after"},
		{"unknown field", `{"type":"move","x":1,"y":1,"z":3}`, 0, `"z"`},
		{"unknown type", `{"type":"teleport"}`, 0, "unknown action type"},
		{"no type", `{"x":1}`, 0, "type"},
		{"move no xy", `{"type":"move"}`, 0, "needs x and y"},
		{"x without y", `{"type":"click","x":1}`, 0, "together"},
		{"negative", `{"type":"move","x":-1,"y":1}`, 0, "out of range"},
		{"float coord", `{"type":"move","x":1.5,"y":1}`, 0, "wrong type"},
		{"field not used", `{"type":"move","x":1,"y":1,"button":"left"}`, 0, `"button" is not used by move`},
		{"bad button", `{"type":"click","button":"fourth"}`, 0, "button"},
		{"count", `{"type":"click","count":4}`, 0, "count"},
		{"drag short", `{"type":"drag","path":[[1,1]]}`, 0, "at least 2"},
		{"scroll no dir", `{"type":"scroll"}`, 0, "direction"},
		{"scroll bad dir", `{"type":"scroll","direction":"sideways"}`, 0, "direction"},
		{"scroll amount", `{"type":"scroll","direction":"up","amount":-1}`, 0, "amount"},
		{"scroll amount cap", `{"type":"scroll","direction":"up","amount":101}`, 0, "amount"},
		{"type no text", `{"type":"type"}`, 0, "needs text"},
		{"type control", `{"type":"type","text":"a\u0001"}`, 0, "U+0001"},
		{"type long", `{"type":"type","text":"` + strings.Repeat("a", MaxTextBytes+1) + `"}`, 0, "bytes"},
		{"clipboard set no text", `{"type":"clipboard_set"}`, 0, "clipboard_set needs text"},
		{"clipboard set empty", `{"type":"clipboard_set","text":""}`, 0, "clipboard_set needs text"},
		{"clipboard set long", `{"type":"clipboard_set","text":"` + strings.Repeat("a", MaxClipboardBytes+1) + `"}`, 0, "65537 bytes (at most 65536)"},
		{"clipboard set NUL", `{"type":"clipboard_set","text":"a\u0000b"}`, 0, "NUL"},
		{"clipboard set invalid UTF-8", "{\"type\":\"clipboard_set\",\"text\":\"a\xffb\"}", 0, "not valid UTF-8"},
		{"clipboard get text", `{"type":"clipboard_get","text":"x"}`, 0, `"text" is not used by clipboard_get`},
		{"clipboard set xy", `{"type":"clipboard_set","text":"x","x":1,"y":1}`, 0, `"x" is not used by clipboard_set`},
		{"key none", `{"type":"key"}`, 0, "needs keys"},
		{"key unknown", `{"type":"key","keys":"ctrl+blorp"}`, 0, `"blorp"`},
		{"key empty", `{"type":"key","keys":"ctrl+"}`, 0, "empty key"},
		{"key bad json", `{"type":"key","keys":3}`, 0, "keys"},
		{"wait long", `{"type":"wait","duration_ms":60001}`, 0, "duration_ms"},
		{"wait none", `{"type":"wait"}`, 0, "duration_ms"},
		{"hold none", `{"type":"hold_key","keys":"a"}`, 0, "duration_ms"},
		{"screenshot format", `{"type":"screenshot","format":"gif"}`, 0, "format"},
		{"screenshot scale", `{"type":"screenshot","scale":2}`, 0, "scale"},
		{"screenshot both", `{"type":"screenshot","scale":0.5,"width":100}`, 0, "not both"},
		{"screenshot half region", `{"type":"screenshot","w":5}`, 0, "w and h"},
		{"screenshot xy only", `{"type":"screenshot","x":5,"y":5}`, 0, "w and h"},
		{"back on scroll", `{"type":"scroll","direction":"up","button":"back"}`, 0, `"button" is not used by scroll`},
		{"button number", `{"type":"click","button":"8"}`, 0, "back or forward"},
		{"settle on click", `{"type":"click","settle_ms":200}`, 0, `"settle_ms" is not used by click`},
		{"settle on wait", `{"type":"wait","duration_ms":5,"settle_ms":200}`, 0, `"settle_ms" is not used by wait`},
		{"settle max on move", `{"type":"move","x":1,"y":1,"settle_max_ms":200}`, 0, `"settle_max_ms" is not used by move`},
		{"settle negative", `{"type":"screenshot","settle_ms":-1}`, 0, "settle_ms must be 0..10000"},
		{"settle too long", `{"type":"screenshot","settle_ms":10001}`, 0, "settle_ms must be 0..10000"},
		{"settle float", `{"type":"screenshot","settle_ms":1.5}`, 0, "wrong type"},
		{"settle max alone", `{"type":"screenshot","settle_max_ms":500}`, 0, "needs settle_ms"},
		{"settle max short", `{"type":"screenshot","settle_ms":500,"settle_max_ms":499}`, 0, "settle_max_ms must be"},
		{"settle max too long", `{"type":"screenshot","settle_ms":500,"settle_max_ms":10001}`, 0, "settle_max_ms must be"},
		{"settle max negative", `{"type":"screenshot","settle_ms":500,"settle_max_ms":-5}`, 0, "settle_max_ms must be"},
		{"list index", `{"actions":[{"type":"wait","duration_ms":1},{"type":"nope"}]}`, 1, "unknown action type"},
		{"list extra", `{"actions":[],"type":"wait"}`, 0, "no other fields"},
		{"list empty", `{"actions":[]}`, 0, "empty"},
		{"list null item", `{"actions":[null]}`, 0, "null"},
		{"list not array", `{"actions":{}}`, 0, "array"},
		{"list too long", `{"actions":[` + strings.Repeat(`{"type":"windows"},`, MaxActions) + `{"type":"windows"}]}`, 0, "too many"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.body))
			if err == nil {
				t.Fatalf("Parse(%.80s) = %+v, want error", tt.body, got)
			}
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is %T, want *Error", err, err)
			}
			if ae.Index != tt.index || !strings.Contains(ae.Msg, tt.msg) {
				t.Errorf("error = index %d %q, want index %d containing %q", ae.Index, ae.Msg, tt.index, tt.msg)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		a  Action
		ok bool
	}{
		{Action{Type: "move", X: ip(0), Y: ip(0)}, true},
		{Action{Type: "move", X: ip(1023), Y: ip(767)}, true},
		{Action{Type: "move", X: ip(1024), Y: ip(0)}, false},
		{Action{Type: "click", X: ip(5), Y: ip(768)}, false},
		{Action{Type: "click"}, true},
		{Action{Type: "drag", Path: [][2]int{{0, 0}, {2000, 1}}}, false},
		{Action{Type: "drag", Path: [][2]int{{0, 0}, {20, 1}}}, true},
		{Action{Type: "screenshot", X: ip(1000), Y: ip(0), W: 24, H: 768}, true},
		{Action{Type: "screenshot", X: ip(1000), Y: ip(0), W: 25, H: 10}, false},
		{Action{Type: "screenshot"}, true},
	}
	for _, tt := range tests {
		err := Validate(tt.a, 1024, 768)
		if (err == nil) != tt.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tt.a, err, tt.ok)
		}
		var ae *Error
		if err != nil && !errors.As(err, &ae) {
			t.Errorf("Validate error is %T, want *Error", err)
		}
	}
}

func TestLookupKeysym(t *testing.T) {
	tests := []struct {
		name string
		want Keysym
	}{
		{"Return", 0xff0d}, {"enter", 0xff0d}, {"ENTER", 0xff0d}, {"return", 0xff0d},
		{"esc", 0xff1b}, {"Escape", 0xff1b}, {"Tab", 0xff09}, {"space", 0x20}, {" ", 0x20},
		{"BackSpace", 0xff08}, {"backspace", 0xff08}, {"del", 0xffff}, {"Delete", 0xffff},
		{"ctrl", 0xffe3}, {"Control_L", 0xffe3}, {"control_r", 0xffe4}, {"shift", 0xffe1},
		{"alt", 0xffe9}, {"option", 0xffe9}, {"cmd", 0xffeb}, {"Super_L", 0xffeb}, {"win", 0xffeb},
		{"meta", 0xffeb}, {"Meta_L", 0xffe7}, {"ISO_Level3_Shift", 0xfe03},
		{"pageup", 0xff55}, {"Page_Up", 0xff55}, {"Prior", 0xff55}, {"PageDown", 0xff56},
		{"Home", 0xff50}, {"end", 0xff57}, {"Left", 0xff51}, {"arrowright", 0xff53}, {"UP", 0xff52},
		{"F1", 0xffbe}, {"f12", 0xffc9}, {"F35", 0xffe0}, {"Insert", 0xff63}, {"Print", 0xff61},
		{"printscreen", 0xff61}, {"Menu", 0xff67}, {"capslock", 0xffe5},
		{"comma", 0x2c}, {"period", 0x2e}, {"slash", 0x2f}, {"minus", 0x2d}, {"equal", 0x3d},
		{"bracketleft", 0x5b}, {"plus", 0x2b}, {"+", 0x2b},
		{"a", 0x61}, {"A", 0x41}, {"z", 0x7a}, {"0", 0x30}, {"9", 0x39},
		{"KP_Enter", 0xff8d}, {"KP_0", 0xffb0}, {"KP_Add", 0xffab},
		{"XF86AudioRaiseVolume", 0x1008ff13}, {"XF86AudioMute", 0x1008ff12}, {"volumeup", 0x1008ff13},
		{"é", 0xe9}, {"eacute", 0xe9}, {"Eacute", 0xc9}, {"ж", 0x1000436}, {"東", 0x1006771},
		{"✓", 0x1002713}, {"€", 0x10020ac}, {"0xff0d", 0xff0d},
	}
	for _, tt := range tests {
		got, ok := LookupKeysym(tt.name)
		if !ok || got != tt.want {
			t.Errorf("LookupKeysym(%q) = %#x, %v; want %#x", tt.name, got, ok, tt.want)
		}
	}
	for _, bad := range []string{"", "blorp", "ctrl+c", "F36", "\x01", "0x", "0xzz", "\xff"} {
		if ks, ok := LookupKeysym(bad); ok {
			t.Errorf("LookupKeysym(%q) = %#x, want not found", bad, ks)
		}
	}
}

func TestParseCombo(t *testing.T) {
	got, err := ParseCombo(SplitCombo("ctrl+shift+t"))
	if err != nil || !reflect.DeepEqual(got, []Keysym{0xffe3, 0xffe1, 0x74}) {
		t.Errorf("ParseCombo(ctrl+shift+t) = %#x, %v", got, err)
	}
	_, err = ParseCombo([]string{"ctrl", "nosuchkey"})
	if err == nil || !strings.Contains(err.Error(), `"nosuchkey"`) {
		t.Errorf("ParseCombo(unknown) error = %v, want it to name the key", err)
	}
	if _, err := ParseCombo(nil); err == nil {
		t.Error("ParseCombo(nil) succeeded")
	}
	if _, err := ParseCombo(strings.Split("a+b+c+d+e+f+g+h+i", "+")); err == nil {
		t.Error("ParseCombo(9 keys) succeeded")
	}
}

func TestSplitCombo(t *testing.T) {
	tests := map[string][]string{
		"":             {},
		"a":            {"a"},
		"+":            {"+"},
		"ctrl++":       {"ctrl", "+"},
		"ctrl+":        {"ctrl", ""},
		"ctrl + alt":   {"ctrl", "alt"},
		"ctrl+shift+t": {"ctrl", "shift", "t"},
		" ":            {" "},
	}
	for in, want := range tests {
		if got := SplitCombo(in); !reflect.DeepEqual(got, want) {
			t.Errorf("SplitCombo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRuneKeysym(t *testing.T) {
	for _, r := range "aZ09 ~éÿĀж東✓😀\n\t" {
		ks, ok := RuneKeysym(r)
		if !ok {
			t.Errorf("RuneKeysym(%q) not ok", r)
			continue
		}
		back, ok := KeysymRune(ks)
		if !ok || back != r {
			t.Errorf("KeysymRune(RuneKeysym(%q)=%#x) = %q, %v", r, ks, back, ok)
		}
	}
	for _, r := range []rune{0, 0x1f, 0x85, 0xd800, 0x110000} {
		if ks, ok := RuneKeysym(r); ok {
			t.Errorf("RuneKeysym(%U) = %#x, want not ok", r, ks)
		}
	}
	if got := KeysymName(0xff55); got != "Prior" {
		t.Errorf("KeysymName(0xff55) = %q, want Prior", got)
	}
}

func TestProtoRoundTrip(t *testing.T) {
	bodies := []string{
		`{"type":"move","x":10,"y":20}`,
		`{"type":"click","x":1,"y":2,"button":"right","count":3}`,
		`{"type":"drag","path":[[0,0],[5,6],[7,8]],"button":"middle"}`,
		`{"type":"scroll","x":3,"y":4,"direction":"left","amount":7}`,
		`{"type":"type","text":"héllo","delay_ms":12}`,
		`{"type":"hold_key","keys":["ctrl","a"],"duration_ms":50}`,
		`{"type":"screenshot","format":"jpeg","quality":50,"x":1,"y":2,"w":30,"h":40,"scale":0.5,"cursor":true}`,
		`{"type":"screenshot","width":300}`,
		`{"type":"screenshot","settle_ms":250,"settle_max_ms":4000}`,
		`{"type":"screenshot","settle_ms":250}`,
		`{"type":"click","button":"back"}`,
		`{"type":"mouse_up","button":"forward"}`,
		`{"type":"windows"}`,
		`{"type":"clipboard_get"}`,
		`{"type":"clipboard_set","text":"✓ 東京\n"}`,
	}
	for _, body := range bodies {
		as, err := Parse([]byte(body))
		if err != nil {
			t.Fatalf("Parse(%s): %v", body, err)
		}
		p := ToProto(as[0])
		wire, err := proto.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		p2 := ToProto(as[0])
		p2.Reset()
		if err := proto.Unmarshal(wire, p2); err != nil {
			t.Fatal(err)
		}
		got, err := Normalize(FromProto(p2))
		if err != nil {
			t.Fatalf("Normalize(FromProto(ToProto(%s))): %v", body, err)
		}
		if !reflect.DeepEqual(got, as[0]) {
			t.Errorf("round trip of %s\n got %+v\nwant %+v", body, got, as[0])
		}
	}
	if p := ToProto(Action{Type: "screenshot", X: ip(1), Y: ip(2), W: 3, H: 4}); p.X != nil || p.GetScreenshot().GetRegion().GetW() != 3 {
		t.Errorf("screenshot region not in the screenshot field: %v", p)
	}
	if a := FromScreenshotRequest(nil); a.Type != TypeScreenshot {
		t.Errorf("FromScreenshotRequest(nil) = %+v", a)
	}
}

func TestScreenshotFromQuery(t *testing.T) {
	q, _ := url.ParseQuery("format=jpeg&quality=70&x=10&y=20&w=100&h=50&scale=0.5&cursor=true")
	a, err := ScreenshotFromQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	o := a.Screenshot()
	want := ScreenshotOptions{Format: "jpeg", Quality: 70, Scale: 0.5, Region: image.Rect(10, 20, 110, 70), Cursor: true}
	if o != want {
		t.Errorf("options = %+v, want %+v", o, want)
	}
	a, err = ScreenshotFromQuery(url.Values{})
	if err != nil || a.Screenshot() != (ScreenshotOptions{Format: "png", Quality: DefaultJPEGQuality}) {
		t.Errorf("empty query = %+v, %v", a.Screenshot(), err)
	}
	q, _ = url.ParseQuery("settle_ms=250&settle_max_ms=3000&format=png")
	a, err = ScreenshotFromQuery(q)
	wantSettle := ScreenshotOptions{Format: "png", Quality: DefaultJPEGQuality, Settle: 250 * time.Millisecond, SettleMax: 3 * time.Second}
	if err != nil || a.Screenshot() != wantSettle {
		t.Errorf("settle query = %+v, %v; want %+v", a.Screenshot(), err, wantSettle)
	}
	if r := ScreenshotRequest(a); r.GetSettleMs() != 250 || r.GetSettleMaxMs() != 3000 {
		t.Errorf("ScreenshotRequest(settle) = %v", r)
	}
	q, _ = url.ParseQuery("settle_ms=300")
	if a, err := ScreenshotFromQuery(q); err != nil || a.SettleMaxMS != DefaultSettleMaxMS || a.Screenshot().SettleMax != 2*time.Second {
		t.Errorf("settle_ms alone = %+v, %v; want settle_max_ms %d", a, err, DefaultSettleMaxMS)
	}
	for _, bad := range []string{"format=bmp", "quality=x", "zoom=2", "w=5", "x=1&x=2", "cursor=maybe", "scale=0.01",
		"settle_ms=x", "settle_ms=-1", "settle_ms=10001", "settle_max_ms=100", "settle_ms=500&settle_max_ms=400",
		"settle_ms=500&settle_max_ms=20000", "settle_ms=1&settle_ms=2"} {
		q, _ := url.ParseQuery(bad)
		if _, err := ScreenshotFromQuery(q); err == nil {
			t.Errorf("ScreenshotFromQuery(%s) succeeded", bad)
		}
	}
}
