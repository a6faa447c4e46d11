package main

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent, with
// the build events go test adds since Go 1.24).
type event struct {
	Time        time.Time
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	ImportPath  string // build-output, build-fail
	FailedBuild string // a package's fail because another's build failed
}

// decoder reads events one line at a time. A line that is not an event
// (go test prints a few plain lines of its own, such as a vet or link
// error before the stream starts) comes back as an "output" event of no
// package, so that nothing it says is lost.
type decoder struct{ sc *bufio.Scanner }

func newDecoder(r io.Reader) *decoder {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	return &decoder{sc: sc}
}

// next returns the next event and its raw line, or false at the end.
func (d *decoder) next() (event, string, bool) {
	if !d.sc.Scan() {
		return event{}, "", false
	}
	line := d.sc.Text()
	var e event
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
		return event{Action: "output", Output: line + "\n"}, line, true
	}
	return e, line, true
}

// err is the scanner's error: a line over 16 MiB, or a read error.
func (d *decoder) err() error { return d.sc.Err() }

// topLevel reports whether name is a test and not a subtest.
func topLevel(name string) bool { return name != "" && !strings.Contains(name, "/") }
