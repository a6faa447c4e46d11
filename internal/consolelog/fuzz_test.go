package consolelog

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzRingWrite feeds a ring what a sandbox may print — anything — in two
// pieces, and checks what it keeps: valid UTF-8 without control
// characters, bounded lines, times in order and never after now.
func FuzzRingWrite(f *testing.F) {
	f.Add([]byte("hello\nworld\n"), 3)
	f.Add([]byte(`time=2026-12-03T21:57:11.123Z level=INFO msg="session: started" program=Xvfb pid=12`+"\n"), 10)
	f.Add([]byte(`time=2026-12-03T21:57:11Z level=WARN+4 msg="a \"q\" \x00" k="\u00e9" k2=`+"\n"), 0)
	f.Add([]byte("time=9999-12-31T23:59:59Z level=ERROR msg=future\nraw\r\n\x1b[0m\xff\xfe"), 5)
	f.Add([]byte("time= level= msg= ="), 1)
	f.Fuzz(func(t *testing.T, data []byte, cut int) {
		now := time.Date(2026, 12, 3, 22, 0, 0, 0, time.UTC)
		r := NewRing(Options{MaxEntries: 50, Hide: []string{"/data"}})
		if cut < 0 || cut > len(data) {
			cut = len(data) / 2
		}
		r.Write(data[:cut], now, now.Add(-time.Hour))
		r.Write(data[cut:], now, now)
		r.Flush(now, now)
		var last time.Time
		for _, e := range r.Select(Query{}) {
			for _, s := range append([]string{e.Message}, fieldStrings(e.Fields)...) {
				if !utf8.ValidString(s) {
					t.Fatalf("invalid UTF-8 kept: %q", s)
				}
				if strings.ContainsFunc(s, isControl) {
					t.Fatalf("control character kept: %q", s)
				}
			}
			if len(e.Message) > MaxLineBytes {
				t.Fatalf("message of %d bytes kept", len(e.Message))
			}
			if strings.Contains(e.Message, "/data") {
				t.Fatalf("hidden string kept: %q", e.Message)
			}
			if !last.IsZero() && !e.Time.After(last) {
				t.Fatalf("time %v not after the entry before's %v", e.Time, last)
			}
			if e.Time.After(now.Add(time.Microsecond)) {
				t.Fatalf("time %v after now", e.Time)
			}
			last = e.Time
		}
	})
}

func fieldStrings(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k, v)
	}
	return out
}
