// Package consolelog turns what a sandbox prints on its console into log
// entries: it splits the bytes into bounded lines, reads the agent's own
// structured lines (log/slog's text format) for their time, level and
// fields, stamps the others with when they were read, and keeps the
// newest in a bounded ring that answers queries by time, level and text.
// It knows nothing of drivers or files; internal/sandbox feeds it.
//
// Nothing here authenticates a line: the console is one stream that every
// program in the sandbox may write, so any of them can print a line in
// the agent's format and have it taken as the agent's, with whatever
// level, time and fields it likes. Source and Level tell how a line
// looks, not who printed it; the sandbox is no more trusted for them.
package consolelog

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Level is a log entry's severity, E2B's four levels.
type Level int

// The levels, least severe first.
const (
	LevelDebug Level = iota
	LevelInfo
	LevelWarn
	LevelError
)

var levelNames = [...]string{"debug", "info", "warn", "error"}

// String is the level's name as the APIs show it: debug, info, warn, error.
func (l Level) String() string {
	if l < LevelDebug || l > LevelError {
		return "info"
	}
	return levelNames[l]
}

// ParseLevel reads a level name (any case; "warning" and "err" too).
func ParseLevel(s string) (Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return LevelDebug, nil
	case "info":
		return LevelInfo, nil
	case "warn", "warning":
		return LevelWarn, nil
	case "error", "err":
		return LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q: want debug, info, warn or error", s)
}

// Sources of entries.
const (
	// SourceAgent is a structured line, as the sandbox's agent (its init)
	// prints them: session programs starting and exiting, the display
	// coming up. It is a claim of the line, not a proof: any program in
	// the sandbox can print such a line (see the package comment).
	SourceAgent = "agent"
	// SourceConsole is any other line: what the session's programs print,
	// a VM's kernel, the container runtime.
	SourceConsole = "console"
	// SourceDaemon is a note of cubicled's own in the log (lines skipped).
	SourceDaemon = "cubicled"
)

// Limits on what one line may hold.
const (
	// MaxLineBytes bounds an entry's message: a longer line is cut there
	// and marked, the rest of it dropped.
	MaxLineBytes = 4096
	// maxFields bounds the fields read from a structured line; the rest
	// stay in the message's text only.
	maxFields = 32
	// maxKeyBytes bounds a field's key.
	maxKeyBytes = 64
)

// truncMark ends a message cut at MaxLineBytes.
const truncMark = " [truncated]"

// Entry is one line a sandbox printed.
type Entry struct {
	Time    time.Time
	Level   Level
	Source  string
	Message string
	// Fields are the key=value pairs of a structured line besides time,
	// level and msg; nil for other lines.
	Fields map[string]string
}

// parsed is what ParseLine read from a line.
type parsed struct {
	Entry
	hasTime bool
}

// parseLine reads one line (without its newline). A line in log/slog's
// text format — "time=... level=... msg=..." followed by key=value
// pairs, which is how the agent logs — gives its own time, level and
// fields; any other line is an info line of the console, for the caller
// to stamp. The message is valid UTF-8 without control characters other
// than tabs, at most MaxLineBytes long. With cut, line is only the start
// of what was printed: it is taken as plain text and marked cut, as its
// last field or message would otherwise end short without a mark.
//
// The strings of the entry are its own, not substrings of line: the ring
// counts an entry's message and fields against its bound, so they must
// be all the entry keeps alive.
func parseLine(line []byte, cut bool) parsed {
	if cut {
		line = trimPartialRune(line)
	}
	s := clean(string(line))
	if !cut {
		if p, ok := parseSlog(s); ok {
			p.Message = strings.Clone(limit(p.Message))
			if len(p.Fields) == 0 {
				// Every field was dropped (keys too long).
				p.Fields = nil
			} else {
				fields := make(map[string]string, len(p.Fields))
				for k, v := range p.Fields {
					fields[strings.Clone(k)] = strings.Clone(v)
				}
				p.Fields = fields
			}
			return p
		}
	}
	msg := limit(s)
	if cut {
		msg = mark(s)
	}
	return parsed{Entry: Entry{Level: LevelInfo, Source: SourceConsole, Message: strings.Clone(msg)}}
}

// trimPartialRune drops the start of a rune that a cut left at the end
// of b, which would otherwise show as U+FFFD.
func trimPartialRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}

// clean makes a line printable: valid UTF-8, no carriage returns or other
// control characters but tabs (a program's colours and cursor moves mean
// nothing in a log).
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if isControl(r) {
			return -1
		}
		return r
	}, s)
}

func isControl(r rune) bool {
	return r != '\t' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0))
}

// limit cuts s to MaxLineBytes on a rune boundary, marking the cut.
func limit(s string) string {
	if len(s) <= MaxLineBytes {
		return s
	}
	return mark(s)
}

// mark marks s as cut, cutting it further, on a rune boundary, if the
// mark would not fit in MaxLineBytes.
func mark(s string) string {
	n := MaxLineBytes - len(truncMark)
	if len(s) <= n {
		return s + truncMark
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + truncMark
}

// parseSlog reads a line of log/slog's TextHandler: it must begin with
// time=, level= and msg= (in that order, as the handler writes them).
func parseSlog(s string) (parsed, bool) {
	if !strings.HasPrefix(s, "time=") {
		return parsed{}, false
	}
	var p parsed
	p.Source = SourceAgent
	rest := s
	for i := 0; rest != ""; i++ {
		var key, val string
		var ok bool
		key, val, rest, ok = nextPair(rest)
		if !ok {
			return parsed{}, false
		}
		switch {
		case i == 0 && key == "time":
			t, err := time.Parse(time.RFC3339Nano, val)
			if err != nil {
				return parsed{}, false
			}
			// The zero time, or one before it (year 0, or a negative
			// offset from it), is no clock's reading: a zero time would
			// also pass for "no entry yet" in the ring's ordering, and
			// one before year 0 makes the API's JSON fail. Such a line
			// is stamped when read, like a plain one.
			if t.After(time.Time{}) {
				p.Time, p.hasTime = t, true
			}
		case i == 1 && key == "level":
			p.Level = slogLevel(val)
		case i == 2 && key == "msg":
			p.Message = val
		case i < 3:
			return parsed{}, false
		default:
			if p.Fields == nil {
				p.Fields = map[string]string{}
			}
			if len(p.Fields) < maxFields && len(key) <= maxKeyBytes {
				p.Fields[key] = limit(val)
			}
		}
	}
	if p.Message == "" && !strings.Contains(s, " msg=") {
		return parsed{}, false
	}
	return p, true
}

// slogLevel maps slog's level names ("INFO", "WARN+2", "DEBUG-4") to a
// Level.
func slogLevel(s string) Level {
	base := s
	if i := strings.IndexAny(s, "+-"); i > 0 {
		base = s[:i]
	}
	if l, err := ParseLevel(base); err == nil {
		return l
	}
	return LevelInfo
}

// nextPair reads `key=value` and the space after it from s. A value is
// either bare (up to the next space) or Go-quoted, as slog quotes it.
func nextPair(s string) (key, val, rest string, ok bool) {
	eq := strings.IndexByte(s, '=')
	if eq <= 0 || strings.ContainsAny(s[:eq], " \"") {
		return "", "", "", false
	}
	key, s = s[:eq], s[eq+1:]
	if strings.HasPrefix(s, `"`) {
		end := quotedEnd(s)
		if end < 0 {
			return "", "", "", false
		}
		v, err := strconv.Unquote(s[:end])
		if err != nil {
			return "", "", "", false
		}
		// Quoting lets a value hold what the line could not.
		val, s = clean(v), s[end:]
	} else {
		end := strings.IndexByte(s, ' ')
		if end < 0 {
			end = len(s)
		}
		val, s = s[:end], s[end:]
	}
	if s != "" {
		if s[0] != ' ' {
			return "", "", "", false
		}
		s = s[1:]
	}
	return key, val, s, true
}

// quotedEnd returns the index just past the closing quote of the quoted
// string s begins with, or -1.
func quotedEnd(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}
