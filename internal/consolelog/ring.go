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
}

// Options configure a Ring; zero values get the defaults.
type Options struct {
	// MaxEntries and MaxBytes bound what the ring holds (entries, and
	// bytes of messages and fields).
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
		if len(r.partial) > 0 {
			line = append(r.partial, line...)
			r.partial = r.partial[:0]
		}
		r.addLine(line, now, rawAt)
	}
}

// hold keeps the start of an unfinished line; one that has grown past
// MaxLineBytes is added cut, and the rest of it dropped.
func (r *Ring) hold(data []byte, now, rawAt time.Time) {
	if r.dropping {
		return
	}
	r.partial = append(r.partial, data...)
	if len(r.partial) > MaxLineBytes {
		// One byte more than fits tells addLine the line was cut.
		r.addLine(r.partial[:MaxLineBytes+1], now, rawAt)
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

func (r *Ring) addLine(line []byte, now, rawAt time.Time) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if r.hide != nil {
		line = []byte(r.hide.Replace(string(line)))
	}
	if len(bytes.TrimSpace(line)) == 0 {
		// Blank lines separate output on a terminal; in a log they
		// are noise.
		return
	}
	p := parseLine(line)
	if !p.hasTime {
		p.Time = rawAt
	}
	r.add(p.Entry, now)
}

// add appends e. Its time is at most now (a guest clock ahead of the
// host's) and later than the entry before's, by a nanosecond if need be:
// times are unique and follow the order of printing, so "after the last
// one I saw" is an exact cursor.
func (r *Ring) add(e Entry, now time.Time) {
	if e.Time.After(now) {
		e.Time = now
	}
	if !e.Time.After(r.last) && !r.last.IsZero() {
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

// entrySize is what an entry counts against the ring's byte bound.
func entrySize(e Entry) int {
	n := len(e.Message) + 32
	for k, v := range e.Fields {
		n += len(k) + len(v)
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
