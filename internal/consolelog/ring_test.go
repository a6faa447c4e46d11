package consolelog

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// messages lists the messages of es.
func messages(es []Entry) []string {
	out := []string{}
	for _, e := range es {
		out = append(out, e.Message)
	}
	return out
}

func TestRingWriteSplitsLines(t *testing.T) {
	r := NewRing(Options{})
	r.Write([]byte("one\ntw"), t0, t0)
	r.Write([]byte("o\r\nthree"), t0.Add(time.Second), t0.Add(time.Second))
	if got, want := messages(r.Select(Query{})), []string{"one", "two"}; !cmp.Equal(got, want) {
		t.Errorf("after two writes: %q, want %q", got, want)
	}
	r.Flush(t0.Add(2*time.Second), t0.Add(2*time.Second))
	if got, want := messages(r.Select(Query{})), []string{"one", "two", "three"}; !cmp.Equal(got, want) {
		t.Errorf("after flush: %q, want %q", got, want)
	}
}

func TestRingTimes(t *testing.T) {
	r := NewRing(Options{})
	now := t0.Add(time.Minute)
	// A backlog: the raw line before any structured one gets rawAt; the
	// raw line after a structured one just after it; a structured line
	// from the future is brought back to now, and one from the past
	// after the entry before.
	r.Write([]byte(strings.Join([]string{
		"raw first",
		"time=2026-12-03T12:00:10Z level=INFO msg=agent",
		"raw second",
		"time=2026-12-03T12:00:05Z level=INFO msg=past",
		"time=2026-12-03T13:00:00Z level=INFO msg=future",
		"",
	}, "\n")), now, t0)
	got := r.Select(Query{})
	want := []time.Time{t0, t0.Add(10 * time.Second), t0.Add(10*time.Second + time.Nanosecond),
		t0.Add(10*time.Second + 2*time.Nanosecond), now}
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		if !got[i].Time.Equal(want[i]) {
			t.Errorf("entry %d (%q): time %v, want %v", i, got[i].Message, got[i].Time, want[i])
		}
	}
}

func TestRingBounds(t *testing.T) {
	r := NewRing(Options{MaxEntries: 3})
	for i := range 5 {
		r.Write(fmt.Appendf(nil, "line %d\n", i), t0.Add(time.Duration(i)*time.Second), t0.Add(time.Duration(i)*time.Second))
	}
	if got, want := messages(r.Select(Query{})), []string{"line 2", "line 3", "line 4"}; !cmp.Equal(got, want) {
		t.Errorf("entries bound: %q, want %q", got, want)
	}
	r = NewRing(Options{MaxBytes: 3 * (10 + 32)})
	for i := range 5 {
		r.Write([]byte(strings.Repeat(fmt.Sprint(i), 10)+"\n"), t0, t0)
	}
	if got := r.Len(); got != 3 {
		t.Errorf("bytes bound: %d entries kept, want 3", got)
	}
	// A line longer than MaxLineBytes in pieces: cut, the rest dropped.
	r = NewRing(Options{})
	long := strings.Repeat("x", MaxLineBytes)
	r.Write([]byte(long), t0, t0)
	r.Write([]byte(long+"\nnext\n"), t0, t0)
	got := r.Select(Query{})
	if len(got) != 2 || !strings.HasSuffix(got[0].Message, truncMark) || got[1].Message != "next" {
		t.Errorf("long line: %d entries %q", len(got), messages(got))
	}
}

func TestRingSkipAndHide(t *testing.T) {
	r := NewRing(Options{Hide: []string{"/var/lib/cubicle"}})
	r.Write([]byte("start of a li"), t0, t0)
	r.Skip(100, t0)
	r.Write([]byte("ne cut\nopen /var/lib/cubicle/oci/x/bundle: denied\n"), t0, t0)
	want := []string{"100 bytes of console output skipped", "open …/oci/x/bundle: denied"}
	got := r.Select(Query{})
	if diff := cmp.Diff(want, messages(got)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got[0].Source != SourceDaemon || got[0].Level != LevelWarn {
		t.Errorf("skip note: source %q level %v, want %q warn", got[0].Source, got[0].Level, SourceDaemon)
	}
}

func TestRingSelect(t *testing.T) {
	r := NewRing(Options{})
	lines := []string{
		"time=2026-12-03T12:00:01Z level=DEBUG msg=d1",
		"time=2026-12-03T12:00:02Z level=INFO msg=i2",
		"time=2026-12-03T12:00:03Z level=WARN msg=w3",
		"time=2026-12-03T12:00:04Z level=ERROR msg=e4",
		"time=2026-12-03T12:00:05Z level=INFO msg=i5",
	}
	r.Write([]byte(strings.Join(lines, "\n")+"\n"), t0.Add(time.Hour), t0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tests := []struct {
		name string
		q    Query
		want []string
	}{
		{"all", Query{}, []string{"d1", "i2", "w3", "e4", "i5"}},
		{"limit", Query{Limit: 2}, []string{"d1", "i2"}},
		{"cursor forward is inclusive", Query{Cursor: at(3)}, []string{"w3", "e4", "i5"}},
		{"backward", Query{Backward: true}, []string{"i5", "e4", "w3", "i2", "d1"}},
		{"backward cursor is inclusive", Query{Backward: true, Cursor: at(3), Limit: 2}, []string{"w3", "i2"}},
		{"level", Query{MinLevel: LevelWarn}, []string{"w3", "e4"}},
		{"search is case-sensitive", Query{Search: "i"}, []string{"i2", "i5"}},
		{"search none", Query{Search: "I"}, []string{}},
		{"cursor after all", Query{Cursor: at(6)}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, messages(r.Select(tt.q))); diff != "" {
				t.Errorf("Select(%+v) (-want +got):\n%s", tt.q, diff)
			}
		})
	}
}
