package action

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Keysym is an X11 keysym number, as listed in X11's keysymdef.h.
type Keysym uint32

// Well-known keysyms used by the agent.
const (
	KeysymReturn    Keysym = 0xff0d
	KeysymTab       Keysym = 0xff09
	KeysymBackSpace Keysym = 0xff08
	KeysymEscape    Keysym = 0xff1b
	KeysymDelete    Keysym = 0xffff
	KeysymShiftL    Keysym = 0xffe1
	KeysymControlL  Keysym = 0xffe3
	KeysymAltL      Keysym = 0xffe9
	KeysymSuperL    Keysym = 0xffeb

	// keysymUnicode is the offset of the keysyms that name a Unicode code
	// point directly (X11 "Unicode keysyms").
	keysymUnicode Keysym = 0x01000000
)

// Keys is a key combo: the names of keys to press together, modifiers first.
// In JSON it is either a string joined by "+" ("ctrl+shift+t") or an array of
// names (["ctrl", "shift", "t"]).
type Keys []string

// UnmarshalJSON accepts a "+"-joined string or an array of strings.
func (k *Keys) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*k = nil
		return nil
	}
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*k = SplitCombo(s)
		return nil
	}
	var list []string
	if err := json.Unmarshal(data, &list); err != nil {
		return fmt.Errorf(`keys must be a string like "ctrl+c" or an array of key names`)
	}
	if list == nil {
		list = []string{}
	}
	*k = list
	return nil
}

// String returns the combo joined by "+".
func (k Keys) String() string { return strings.Join(k, "+") }

// SplitCombo splits "ctrl+shift+t" into its key names. A "+" that is a key
// itself is kept: "+" gives ["+"] and "ctrl++" gives ["ctrl", "+"]. Spaces
// around names are trimmed.
func SplitCombo(s string) []string {
	if s == "" {
		return []string{}
	}
	var out []string
	for len(s) > 0 {
		i := strings.IndexByte(s, '+')
		switch {
		case i < 0:
			out = append(out, s)
			s = ""
		case i == 0:
			// A "+" at the start of a name is the plus key itself.
			out = append(out, "+")
			s = s[1:]
			if len(s) > 0 && s[0] == '+' {
				s = s[1:]
			}
		default:
			out = append(out, s[:i])
			s = s[i+1:]
			if s == "" {
				// "ctrl+" names an empty key; ParseCombo rejects it.
				out = append(out, "")
			}
		}
	}
	for i, name := range out {
		if t := strings.TrimSpace(name); t != "" {
			out[i] = t
		}
	}
	return out
}

// ParseCombo resolves key names to keysyms in order. An unknown or empty name
// is an error that names it.
func ParseCombo(keys []string) ([]Keysym, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("no keys given")
	}
	if len(keys) > MaxKeys {
		return nil, fmt.Errorf("too many keys in one combo: %d (at most %d)", len(keys), MaxKeys)
	}
	out := make([]Keysym, len(keys))
	for i, name := range keys {
		ks, ok := LookupKeysym(name)
		if !ok {
			if name == "" {
				return nil, fmt.Errorf("empty key name in combo %q", strings.Join(keys, "+"))
			}
			return nil, fmt.Errorf("unknown key %q", name)
		}
		out[i] = ks
	}
	return out, nil
}

// LookupKeysym resolves one key name. It tries, in order: the X11 keysym name
// exactly as X spells it ("Return", "Page_Up", "a", "A"); a case-insensitive
// alias from API.md and common computer-use clients ("enter", "esc", "cmd",
// "pageup", "arrowleft"); the X11 name case-insensitively when that is
// unambiguous ("f5", "return"); a single character (any Unicode rune); and a
// hexadecimal keysym number ("0xff0d").
func LookupKeysym(name string) (Keysym, bool) {
	if ks, ok := keysyms[name]; ok {
		return ks, true
	}
	lower := strings.ToLower(name)
	if ks, ok := aliases[lower]; ok {
		return ks, true
	}
	if ks, ok := keysymsFolded[lower]; ok {
		return ks, true
	}
	if r, size := utf8.DecodeRuneInString(name); size == len(name) && size > 0 && r != utf8.RuneError {
		return RuneKeysym(r)
	}
	if len(name) > 2 && (strings.HasPrefix(name, "0x") || strings.HasPrefix(name, "0X")) {
		if n, err := strconv.ParseUint(name[2:], 16, 32); err == nil && n > 0 && n <= 0x1fffffff {
			return Keysym(n), true
		}
	}
	return 0, false
}

// RuneKeysym returns the keysym that types r: Latin-1 characters map to the
// keysym of the same number, others to the Unicode keysym 0x01000000+r.
// Newline and carriage return map to Return, tab to Tab, backspace to
// BackSpace, escape to Escape and DEL to Delete; other control characters
// cannot be typed.
func RuneKeysym(r rune) (Keysym, bool) {
	switch {
	case r == '\n' || r == '\r':
		return KeysymReturn, true
	case r == '\t':
		return KeysymTab, true
	case r == '\b':
		return KeysymBackSpace, true
	case r == 0x1b:
		return KeysymEscape, true
	case r == 0x7f:
		return KeysymDelete, true
	case r < 0x20 || (r >= 0x80 && r < 0xa0):
		return 0, false
	case r <= 0xff:
		return Keysym(r), true
	case r > utf8.MaxRune || (r >= 0xd800 && r <= 0xdfff):
		return 0, false
	default:
		return keysymUnicode + Keysym(r), true
	}
}

// KeysymRune is the inverse of RuneKeysym for printable characters: it
// returns the character a keysym types, for Latin-1 and Unicode keysyms and
// Return/Tab ('\n', '\t'). Other keysyms give false.
func KeysymRune(ks Keysym) (rune, bool) {
	switch {
	case ks == KeysymReturn:
		return '\n', true
	case ks == KeysymTab:
		return '\t', true
	case ks >= 0x20 && ks <= 0x7e, ks >= 0xa0 && ks <= 0xff:
		return rune(ks), true
	case ks >= keysymUnicode+0x100 && ks <= keysymUnicode+utf8.MaxRune:
		r := rune(ks - keysymUnicode)
		if r >= 0xd800 && r <= 0xdfff {
			return 0, false
		}
		return r, true
	}
	return 0, false
}

// KeysymName returns the X11 name of ks, or its "0x" hex form when it has
// none in the table.
func KeysymName(ks Keysym) string {
	if name, ok := keysymNames[ks]; ok {
		return name
	}
	return fmt.Sprintf("0x%x", uint32(ks))
}

// keysymsFolded maps lower-cased X11 names to keysyms, leaving out names that
// differ only by case ("a"/"A", "eacute"/"Eacute").
var keysymsFolded, keysymNames = func() (map[string]Keysym, map[Keysym]string) {
	folded := make(map[string]Keysym, len(keysyms))
	ambiguous := map[string]bool{}
	for name, ks := range keysyms {
		l := strings.ToLower(name)
		if prev, ok := folded[l]; ok && prev != ks {
			ambiguous[l] = true
		}
		folded[l] = ks
	}
	for l := range ambiguous {
		delete(folded, l)
	}
	names := make(map[Keysym]string, len(keysyms))
	for name, ks := range keysyms {
		// Prefer a stable, shortest-then-alphabetical name for keysyms that
		// have several (Prior/Page_Up).
		if prev, ok := names[ks]; !ok || len(name) < len(prev) || len(name) == len(prev) && name < prev {
			names[ks] = name
		}
	}
	return folded, names
}()
