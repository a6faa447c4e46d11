package harness

import (
	"errors"
	"os"
	"strings"
)

// BENCHMARKS.md is written by several programs: `make bench` rewrites it,
// while the soak and the crash test each own one marked section, which
// the others keep. A section runs from "<!-- begin NAME -->" to
// "<!-- end NAME -->".

func markers(name string) (string, string) {
	return "<!-- begin " + name + " -->\n", "<!-- end " + name + " -->\n"
}

// ReplaceSection writes body as section name of the file at path: in place
// of the section's previous text, or appended when it has none yet.
func ReplaceSection(path, name, body string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	begin, end := markers(name)
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	section := begin + body + end
	text := string(old)
	if i := strings.Index(text, begin); i >= 0 {
		if j := strings.Index(text[i:], end); j >= 0 {
			return os.WriteFile(path, []byte(text[:i]+section+text[i+j+len(end):]), 0o644)
		}
	}
	if text != "" && !strings.HasSuffix(text, "\n\n") {
		text = strings.TrimRight(text, "\n") + "\n\n"
	}
	return os.WriteFile(path, []byte(text+section), 0o644)
}

// Sections returns the marked sections of the file at path (whole, with
// their markers, each followed by a blank line), for a program that
// rewrites the file to keep what others wrote.
func Sections(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	text := string(b)
	var out strings.Builder
	for {
		i := strings.Index(text, "<!-- begin ")
		if i < 0 {
			break
		}
		name, _, _ := strings.Cut(text[i+len("<!-- begin "):], " -->")
		_, end := markers(name)
		j := strings.Index(text[i:], end)
		if j < 0 {
			break
		}
		out.WriteString(text[i : i+j+len(end)])
		out.WriteString("\n")
		text = text[i+j+len(end):]
	}
	return out.String()
}
