package consolelog

import (
	"bytes"
	"fmt"
	"strings"
	"time"
)

// Bounds of a Ring.
const (
	// DefaultMaxEntries and DefaultMaxBytes bound what one sandbox's ring
	// holds: the oldest entries go first.
	DefaultMaxEntries = 5000
	DefaultMaxBytes   = 1 << 20
	// MaxLimit is the most entries one query answers.
	MaxLimit = 1000
)

// Ring keeps the newest entries of one sandbox's console, in the order
// they were printed, with times that never go down: a cursor taken from
// one answer never skips an entry added later. It is not safe for
// concurrent use; its owner locks.
type Ring struct {
	maxEntries, maxBytes int

	entries []Entry // oldest first
	bytes   int     // entrySize of all entries
	last    time.Time
	// partial is the start of a line whose newline has not come yet.
	partial []byte
	// dropping is set while the rest of an over-long line is skipped.
	dropping bool
	hide     *strings.Replacer // nil: nothing to hide
	hidden   []string          // what hide replaces
}

// Options configure a Ring; zero values get the defaults.
type Options struct {
	// MaxEntries and MaxBytes bound what the ring holds (entries, and
	// bytes of messages and fields with what holding them costs).
	MaxEntries, MaxBytes int
	// Hide are strings replaced by "…" wherever a line has them: the
	// daemon's own directories, which a runtime's complaint may name
	// and which are no business of the sandbox's user.
	Hide []string
}

// NewRing returns an empty ring.
func NewRing(o Options) *Ring {
	r := &Ring{maxEntries: o.MaxEntries, maxBytes: o.MaxBytes}
	if r.maxEntries <= 0 {
		r.maxEntries = DefaultMaxEntries
	}
	if r.maxBytes <= 0 {
		r.maxBytes = DefaultMaxBytes
	}
	var pairs []string
	for _, h := range o.Hide {
		if h != "" {
			pairs = append(pairs, h, "…")
			r.hidden = append(r.hidden, h)
		}
	}
	if len(pairs) > 0 {
		r.hide = strings.NewReplacer(pairs...)
	}
	return r
}

// Write adds the complete lines of data, which continues what earlier
// calls gave (a line may span calls). Structured lines keep their own
// time, no later than now; the other lines are stamped rawAt: the time
// they were read (now), or, for a backlog printed before anyone read it,
// an earlier time, which the ordering rule (see add) then raises to just
// after the entry before's.
func (r *Ring) Write(data []byte, now, rawAt time.Time) {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			r.hold(data, now, rawAt)
			return
		}
		line := data[:i]
		data = data[i+1:]
		if r.dropping {
			r.dropping = false
			continue
		}
		// A line in one piece may be as long as a whole read (a MiB);
		// only what an entry can show of it is parsed, so that nothing
		// of the rest is kept or even copied.
		if len(r.partial) > 0 {
			line = append(r.partial, capLine(line, len(r.partial))...)
			r.partial = r.partial[:0]
		} else {
			line = capLine(line, 0)
		}
		r.addLine(line, now, rawAt)
	}
}

// capLine returns what of line fits after have bytes of its start: one
// byte more than MaxLineBytes at most, which tells addLine the line was
// cut.
func capLine(line []byte, have int) []byte {
	if room := max(MaxLineBytes+1-have, 0); len(line) > room {
		return line[:room]
	}
	return line
}

// hold keeps the start of an unfinished line; one that has grown past
// MaxLineBytes is added cut, and the rest of it dropped. Only what may
// be shown is kept: partial never grows past MaxLineBytes+1.
func (r *Ring) hold(data []byte, now, rawAt time.Time) {
	if r.dropping {
		return
	}
	r.partial = append(r.partial, capLine(data, len(r.partial))...)
	if len(r.partial) > MaxLineBytes {
		r.addLine(r.partial, now, rawAt)
		r.partial = r.partial[:0]
		r.dropping = true
	}
}

// Flush adds an unfinished line as it is (a box that stopped mid-line).
func (r *Ring) Flush(now, rawAt time.Time) {
	if len(r.partial) > 0 && !r.dropping {
		r.addLine(r.partial, now, rawAt)
	}
	r.partial = r.partial[:0]
	r.dropping = false
}

// Skip notes that n bytes of output were not read (more came at once
// than is worth keeping) and drops the line they cut into.
func (r *Ring) Skip(n int64, now time.Time) {
	r.partial = r.partial[:0]
	r.dropping = true
	r.Note(LevelWarn, now, "%d bytes of console output skipped", n)
}

// Note adds a line of cubicled's own, stamped now.
func (r *Ring) Note(level Level, now time.Time, format string, args ...any) {
	r.add(Entry{Time: now, Level: level, Source: SourceDaemon, Message: limit(fmt.Sprintf(format, args...))}, now)
}

// addLine adds one line, cut if it is longer than MaxLineBytes (the
// callers pass one byte more of a longer line, no more).
func (r *Ring) addLine(line []byte, now, rawAt time.Time) {
	// Whether it was cut is decided before hiding, which shortens it.
	cut := len(line) > MaxLineBytes
	line = bytes.TrimSuffix(line, []byte("\r"))
	if r.hide != nil {
		line = []byte(r.hide.Replace(string(line)))
		if cut {
			line = r.trimHiddenStart(line)
		}
	}
	if len(bytes.TrimSpace(line)) == 0 {
		// Blank lines separate output on a terminal; in a log they
		// are noise.
		return
	}
	p := parseLine(line, cut)
	if !p.hasTime {
		p.Time = rawAt
	}
	r.add(p.Entry, now)
}

// trimHiddenStart drops the end of a cut line if it is the start of a
// string to hide: the cut left it too short to be replaced, and what
// hiding took out before it may have brought it within what is shown.
func (r *Ring) trimHiddenStart(line []byte) []byte {
	for _, h := range r.hidden {
		for k := min(len(h)-1, len(line)); k > 0; k-- {
			if bytes.HasSuffix(line, []byte(h[:k])) {
				line = line[:len(line)-k]
				break
			}
		}
	}
	return line
}

// add appends e. Its time is at most now (a guest clock ahead of the
// host's) and later than the entry before's, by a nanosecond if need be:
// times are unique and follow the order of printing, so "after the last
// one I saw" is an exact cursor.
func (r *Ring) add(e Entry, now time.Time) {
	if e.Time.After(now) {
		e.Time = now
	}
	// Whether there was an entry before is told by the entries, never
	// empty once added to, not by a zero last: an entry's time may be
	// zero (a caller's zero now) and the next must still come after it.
	if len(r.entries) > 0 && !e.Time.After(r.last) {
		e.Time = r.last.Add(time.Nanosecond)
	}
	r.last = e.Time
	size := entrySize(e)
	drop := 0
	for drop < len(r.entries) && (len(r.entries)-drop >= r.maxEntries || r.bytes+size > r.maxBytes) {
		r.bytes -= entrySize(r.entries[drop])
		drop++
	}
	if drop > 0 {
		// Cutting the front off keeps the rest in place; append moves the
		// live entries to a new array once the old one's end is reached.
		clear(r.entries[:drop])
		r.entries = r.entries[drop:]
	}
	r.entries = append(r.entries, e)
	r.bytes += size
}

// What an entry holds besides the bytes of its strings, counted against
// the ring's byte bound so that it bounds the heap an entry keeps, not
// just its text: a line of many tiny fields costs far more than its
// bytes.
const (
	// entryOverhead is the Entry's 72 bytes in the ring's array and its
	// message's allocation. The array's spare room, bounded by the
	// entries bound, is not counted.
	entryOverhead = 96
	// mapOverhead is a Fields map's header and first group of slots.
	mapOverhead = 320
	// fieldOverhead is a field's slot in a map (less than full) and the
	// allocations of its key and value.
	fieldOverhead = 64
)

// entrySize is what an entry counts against the ring's byte bound. It
// holds for the entry's strings only because they are its own (see
// parseLine), not parts of a longer line.
func entrySize(e Entry) int {
	n := len(e.Message) + entryOverhead
	if e.Fields != nil {
		n += mapOverhead
	}
	for k, v := range e.Fields {
		n += len(k) + len(v) + fieldOverhead
	}
	return n
}

// Len is the number of entries held.
func (r *Ring) Len() int { return len(r.entries) }

// Query selects entries of a Ring.
type Query struct {
	// Cursor bounds the entries by time: with Backward, those at or
	// before it; otherwise those at or after it. Zero: no bound.
	Cursor time.Time
	// Backward answers newest first, from Cursor (or the newest) back;
	// otherwise oldest first.
	Backward bool
	// Limit is the most entries answered: 0 or more than MaxLimit means
	// MaxLimit.
	Limit int
	// MinLevel drops entries less severe.
	MinLevel Level
	// Search keeps only entries whose message contains it (case-sensitive).
	Search string
}

// Select returns the entries q selects, in its order. The caller may
// keep them but must not change their Fields.
func (r *Ring) Select(q Query) []Entry {
	limit := q.Limit
	if limit <= 0 || limit > MaxLimit {
		limit = MaxLimit
	}
	out := []Entry{}
	match := func(e Entry) bool {
		return e.Level >= q.MinLevel && (q.Search == "" || strings.Contains(e.Message, q.Search))
	}
	if q.Backward {
		for i := len(r.entries) - 1; i >= 0 && len(out) < limit; i-- {
			e := r.entries[i]
			if !q.Cursor.IsZero() && e.Time.After(q.Cursor) {
				continue
			}
			if match(e) {
				out = append(out, e)
			}
		}
		return out
	}
	for i := 0; i < len(r.entries) && len(out) < limit; i++ {
		e := r.entries[i]
		if !q.Cursor.IsZero() && e.Time.Before(q.Cursor) {
			continue
		}
		if match(e) {
			out = append(out, e)
		}
	}
	return out
}
