package consolelog

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseLine(t *testing.T) {
	at := time.Date(2026, 12, 3, 21, 57, 11, 123000000, time.UTC)
	tests := []struct {
		name    string
		line    string
		want    Entry
		hasTime bool
	}{
		{"plain", "hello world", Entry{Level: LevelInfo, Source: SourceConsole, Message: "hello world"}, false},
		{"empty", "", Entry{Level: LevelInfo, Source: SourceConsole, Message: ""}, false},
		{"slog", `time=2026-12-03T21:57:11.123Z level=INFO msg="session: started" program=Xvfb pid=12`,
			Entry{Time: at, Level: LevelInfo, Source: SourceAgent, Message: "session: started",
				Fields: map[string]string{"program": "Xvfb", "pid": "12"}}, true},
		{"slog warn+2, quoted field", `time=2026-12-03T21:57:11.123Z level=WARN+2 msg=exited status="exit status 1" ran=1.5s`,
			Entry{Time: at, Level: LevelWarn, Source: SourceAgent, Message: "exited",
				Fields: map[string]string{"status": "exit status 1", "ran": "1.5s"}}, true},
		{"slog error escaped", `time=2026-12-03T21:57:11.123Z level=ERROR msg="a \"b\"\tc"`,
			Entry{Time: at, Level: LevelError, Source: SourceAgent, Message: "a \"b\"\tc"}, true},
		{"slog debug", `time=2026-12-03T21:57:11.123Z level=DEBUG msg=x`,
			Entry{Time: at, Level: LevelDebug, Source: SourceAgent, Message: "x"}, true},
		// No clock reads the zero time or earlier: the line is the
		// agent's, stamped when read.
		{"slog zero time", `time=0001-01-01T00:00:00Z level=WARN msg=x`,
			Entry{Level: LevelWarn, Source: SourceAgent, Message: "x"}, false},
		{"slog time before zero", `time=0000-01-01T00:00:00+01:00 level=INFO msg=x`,
			Entry{Level: LevelInfo, Source: SourceAgent, Message: "x"}, false},
		{"slog all fields dropped", `time=2026-12-03T21:57:11.123Z level=INFO msg=x ` + strings.Repeat("k", maxKeyBytes+1) + `=v`,
			Entry{Time: at, Level: LevelInfo, Source: SourceAgent, Message: "x"}, true},
		{"bad time is plain", `time=yesterday level=INFO msg=x`,
			Entry{Level: LevelInfo, Source: SourceConsole, Message: "time=yesterday level=INFO msg=x"}, false},
		{"unterminated quote is plain", `time=2026-12-03T21:57:11.123Z level=INFO msg="x`,
			Entry{Level: LevelInfo, Source: SourceConsole, Message: `time=2026-12-03T21:57:11.123Z level=INFO msg="x`}, false},
		{"wrong order is plain", `time=2026-12-03T21:57:11.123Z msg=x level=INFO`,
			Entry{Level: LevelInfo, Source: SourceConsole, Message: `time=2026-12-03T21:57:11.123Z msg=x level=INFO`}, false},
		{"controls dropped", "a\x1b[31mred\x1b[0m\x00b", Entry{Level: LevelInfo, Source: SourceConsole, Message: "a[31mred[0mb"}, false},
		{"invalid utf-8", "a\xffb", Entry{Level: LevelInfo, Source: SourceConsole, Message: "a\uFFFDb"}, false},
		{"kernel", "[    0.000000] Linux version 6.1", Entry{Level: LevelInfo, Source: SourceConsole, Message: "[    0.000000] Linux version 6.1"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := parseLine([]byte(tt.line), false)
			if diff := cmp.Diff(tt.want, p.Entry); diff != "" {
				t.Errorf("parseLine(%q) (-want +got):\n%s", tt.line, diff)
			}
			if p.hasTime != tt.hasTime {
				t.Errorf("parseLine(%q).hasTime = %v, want %v", tt.line, p.hasTime, tt.hasTime)
			}
		})
	}
}

func TestParseLineLimits(t *testing.T) {
	long := strings.Repeat("é", MaxLineBytes) // 2 bytes each: the cut must fall between runes
	p := parseLine([]byte(long), false)
	if len(p.Message) > MaxLineBytes || !strings.HasSuffix(p.Message, truncMark) {
		t.Errorf("long line: %d bytes, suffix %q; want at most %d ending %q", len(p.Message), p.Message[len(p.Message)-20:], MaxLineBytes, truncMark)
	}
	if !strings.HasPrefix(p.Message, "éé") || strings.ContainsRune(p.Message, '\uFFFD') {
		t.Error("long line: cut inside a rune")
	}
	var b strings.Builder
	b.WriteString("time=2026-12-03T21:57:11Z level=INFO msg=x")
	for i := range 100 {
		b.WriteString(" k" + strings.Repeat("x", i) + "=v")
	}
	p = parseLine([]byte(b.String()), false)
	if len(p.Fields) != maxFields {
		t.Errorf("fields kept = %d, want %d", len(p.Fields), maxFields)
	}
}

func TestParseLevel(t *testing.T) {
	tests := []struct {
		in      string
		want    Level
		wantErr bool
	}{
		{"debug", LevelDebug, false}, {"INFO", LevelInfo, false}, {"warn", LevelWarn, false},
		{"warning", LevelWarn, false}, {"error", LevelError, false}, {"fatal", 0, true}, {"", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseLevel(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err == nil {
			if back, _ := ParseLevel(got.String()); back != got {
				t.Errorf("ParseLevel(%v.String()) = %v", got, back)
			}
		}
	}
}
