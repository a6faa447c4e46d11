package consolelog

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/needs"
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

func TestRingTimesNoClock(t *testing.T) {
	r := NewRing(Options{})
	now := t0.Add(time.Minute)
	// Times at or before the zero time are the time of reading, made
	// unique; one before the entry before comes just after it.
	r.Write([]byte(strings.Join([]string{
		"time=0001-01-01T00:00:00Z level=INFO msg=zero",
		"time=0001-01-01T00:00:00Z level=INFO msg=zero again",
		"time=0000-01-01T00:00:00+01:00 level=INFO msg=before zero",
		"time=0001-01-01T00:00:00.000000001Z level=INFO msg=year one",
		"",
	}, "\n")), now, t0)
	want := []time.Time{t0, t0.Add(time.Nanosecond), t0.Add(2 * time.Nanosecond), t0.Add(3 * time.Nanosecond)}
	got := r.Select(Query{})
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		if !got[i].Time.Equal(want[i]) {
			t.Errorf("entry %d (%q): time %v, want %v", i, got[i].Message, got[i].Time, want[i])
		}
	}
	// A zero time from a caller does not pass for "no entry yet".
	r = NewRing(Options{})
	r.Note(LevelInfo, time.Time{}, "a")
	r.Note(LevelInfo, time.Time{}, "b")
	if got := r.Select(Query{}); len(got) != 2 || !got[1].Time.After(got[0].Time) {
		t.Errorf("zero now: times %v, %v", got[0].Time, got[1].Time)
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
	r = NewRing(Options{MaxBytes: 3 * (10 + entryOverhead)})
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
	// Only what may be shown of an unfinished line is held.
	r.Write([]byte(strings.Repeat("y", 1<<20)), t0, t0)
	if c := cap(r.partial); c > 2*MaxLineBytes {
		t.Errorf("unfinished line of 1 MiB: %d bytes held", c)
	}
	// A string to hide that the cut splits shows no part of it, even
	// where hiding before it made room.
	r = NewRing(Options{Hide: []string{"/var/lib/cubicle"}})
	pre := strings.Repeat("/var/lib/cubicle", 100)
	r.Write([]byte(pre+strings.Repeat("x", MaxLineBytes+1-len(pre)-8)+"/var/lib/cubicle/x\n"), t0, t0)
	if got := r.Select(Query{}); len(got) != 1 || strings.Contains(got[0].Message, "/var") {
		t.Errorf("hidden string cut: %q", messages(got))
	}
	// A structured line in one piece, longer than fits, is cut too, and
	// marked: it is shown as plain text, as its end is missing.
	r = NewRing(Options{})
	r.Write([]byte("time=2026-12-03T12:00:00Z level=ERROR msg=m k="+strings.Repeat("é", MaxLineBytes)+"\n"), t0, t0)
	got = r.Select(Query{})
	if len(got) != 1 || got[0].Source != SourceConsole || len(got[0].Message) > MaxLineBytes ||
		!strings.HasSuffix(got[0].Message, truncMark) || strings.ContainsRune(got[0].Message, '\uFFFD') {
		t.Errorf("long structured line: %d entries, source %q, %d bytes", len(got), got[0].Source, len(got[0].Message))
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

// TestRingMemoryBound checks that what a ring keeps alive stays near its
// byte bound whatever the lines look like: an entry must not hold on to
// the whole line it was read from while counting only its message.
func TestRingMemoryBound(t *testing.T) {
	needs.Long(t, "writes hundreds of megabytes")
	// Many short fields and a long one past maxFields: the ring counts
	// little of each line, which must then be all it keeps.
	slogLine := func(pad int) []byte {
		var b strings.Builder
		b.WriteString("time=2026-12-03T12:00:00Z level=INFO msg=m")
		for i := range maxFields {
			fmt.Fprintf(&b, " f%02d=v", i)
		}
		b.WriteString(" pad=" + strings.Repeat("x", pad) + "\n")
		return []byte(b.String())
	}
	tests := []struct {
		name  string
		line  []byte
		count int
	}{
		// Whole lines of 1 MiB, as one read of the console may give.
		{"long lines", slogLine(1 << 20), 200},
		// Lines that fit, whose fields are all substrings of them.
		{"lines that fit", slogLine(MaxLineBytes - 400), 3 * DefaultMaxEntries},
		// Lines that fit of which little is kept: a field whose key is
		// too long is dropped, and the entry counts almost nothing.
		{"lines that fit, little kept", []byte("time=2026-12-03T12:00:00Z level=INFO msg=m " +
			strings.Repeat("k", maxKeyBytes+1) + "=" + strings.Repeat("v", MaxLineBytes-200) + "\n"), 3 * DefaultMaxEntries},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r := NewRing(Options{})
			for i := range tt.count {
				at := t0.Add(time.Duration(i) * time.Millisecond)
				r.Write(tt.line, at, at)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			t.Logf("%d entries, %d bytes counted, heap grew %.2f MiB", r.Len(), r.bytes, float64(kept)/(1<<20))
			if r.bytes > DefaultMaxBytes {
				t.Errorf("ring counts %d bytes, more than its bound %d", r.bytes, DefaultMaxBytes)
			}
			// The entries' array and the maps' slots are not all counted
			// exactly; a few MiB over the bound is the most allowed.
			if limit := int64(DefaultMaxBytes + 3<<20); kept > limit {
				t.Errorf("ring keeps %.1f MiB of heap, want at most %.1f MiB", float64(kept)/(1<<20), float64(limit)/(1<<20))
			}
			runtime.KeepAlive(r)
		})
	}
}
