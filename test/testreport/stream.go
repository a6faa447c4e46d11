package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

func streamMain(args []string) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	jsonOut := fs.String("json", "", "file to copy the event stream to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var raw io.Writer = io.Discard
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err != nil {
			return fmt.Errorf("record: %w", err)
		}
		defer f.Close()
		raw = f
	}
	res, err := stream(os.Stdin, raw, os.Stdout)
	if err != nil {
		return err
	}
	if res.failed > 0 || res.pkgFailed > 0 {
		return errors.New("tests failed")
	}
	return nil
}

// slowPass is how long a passing top-level test must have taken, in
// seconds, for the log to name it.
const slowPass = 1.0

// result counts what a stream held.
type result struct {
	passed, failed, skipped int // tests and subtests
	pkgFailed               int // packages that failed, builds included
}

// stream copies events from in to raw and prints the readable log to out.
// A top-level test's output, its subtests' included, is held until it
// ends and printed only when it failed or skipped: a passing end-to-end
// test logs hundreds of lines that only matter when something broke.
func stream(in io.Reader, raw, out io.Writer) (result, error) {
	var res result
	type key struct{ pkg, test string }
	held := map[key]*strings.Builder{}
	var order []key // tests in the order they started, for an unended stream
	pkgOut := map[string]*strings.Builder{}
	// The output of each package's last passing test, and how many of its
	// tests failed: a package that fails with no failed test (a panic in
	// a goroutine a passed test left, which test2json gives to that test)
	// shows it.
	lastPass := map[string]*strings.Builder{}
	pkgTestFails := map[string]int{}
	d := newDecoder(in)
	for {
		e, line, ok := d.next()
		if !ok {
			break
		}
		if _, err := io.WriteString(raw, line+"\n"); err != nil {
			return res, fmt.Errorf("record: %w", err)
		}
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Action == "build-fail":
			res.pkgFailed++
			fmt.Fprintf(out, "FAIL\t%s [build failed]\n", e.ImportPath)
		case e.Package == "" && e.Test == "":
			fmt.Fprint(out, e.Output) // not an event: go test's own words
		case e.Test == "":
			if e.Action == "pass" || e.Action == "fail" {
				// Tests of the package that never ended: its test
				// binary exited or was killed in the middle of them.
				for _, k := range order {
					if b, ok := held[k]; ok && k.pkg == e.Package {
						res.failed++
						fmt.Fprintf(out, "%s--- NO END: %s (the test binary ended during it)\n", b.String(), k.test)
						delete(held, k)
					}
				}
			}
			b := pkgOut[e.Package]
			if b == nil {
				b = &strings.Builder{}
				pkgOut[e.Package] = b
			}
			switch e.Action {
			case "output":
				b.WriteString(e.Output)
			case "pass":
				fmt.Fprintf(out, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
				delete(pkgOut, e.Package)
			case "skip": // no test files
				delete(pkgOut, e.Package)
			case "fail":
				res.pkgFailed++
				if lp := lastPass[e.Package]; lp != nil && pkgTestFails[e.Package] == 0 {
					fmt.Fprintf(out, "=== the output of the last test that passed, before the package failed:\n%s", lp.String())
				}
				fmt.Fprint(out, b.String())
				if e.FailedBuild != "" {
					fmt.Fprintf(out, "FAIL\t%s [build of %s failed]\n", e.Package, e.FailedBuild)
				} else if !strings.Contains(b.String(), "FAIL\t"+e.Package) {
					fmt.Fprintf(out, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
				}
				delete(pkgOut, e.Package)
			}
		default:
			top := e.Test
			if i := strings.IndexByte(top, '/'); i >= 0 {
				top = top[:i]
			}
			k := key{e.Package, top}
			b := held[k]
			if b == nil {
				b = &strings.Builder{}
				held[k] = b
				order = append(order, k)
			}
			switch e.Action {
			case "output":
				b.WriteString(e.Output)
			case "pass":
				res.passed++
			case "fail":
				res.failed++
				pkgTestFails[e.Package]++
			case "skip":
				res.skipped++
			}
			if !topLevel(e.Test) {
				continue
			}
			switch e.Action {
			case "pass":
				// A passing test is named only when it took a while:
				// the end-to-end tests' progress, without a line for
				// each of a unit package's hundreds.
				if e.Elapsed >= slowPass {
					fmt.Fprintf(out, "--- PASS: %s (%.2fs) %s\n", e.Test, e.Elapsed, e.Package)
				}
				lastPass[e.Package] = b
				delete(held, k)
			case "fail", "skip":
				fmt.Fprint(out, b.String())
				if e.Action == "fail" {
					recap(out, e.Test, b.String())
				}
				delete(held, k)
			}
		}
	}
	if err := d.err(); err != nil {
		return res, fmt.Errorf("read: %w", err)
	}
	// Tests that started and never ended: go test was killed, or a test
	// binary died in a way test2json could not attribute.
	for _, k := range order {
		if b, ok := held[k]; ok {
			res.failed++
			fmt.Fprintf(out, "%s--- NO END: %s %s (the stream ended during it)\n", b.String(), k.test, k.pkg)
		}
	}
	for pkg, b := range pkgOut {
		res.pkgFailed++
		fmt.Fprintf(out, "%sFAIL\t%s [no end]\n", b.String(), pkg)
	}
	fmt.Fprintf(out, "%d passed, %d failed, %d skipped\n", res.passed, res.failed, res.skipped)
	return res, nil
}

// A line the testing package wrote for a t.Log or t.Error: "file.go:12: ".
var testLine = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: `)

// Bounds of a recap: a test that logs in a loop must not bury the rest.
const (
	recapLines    = 40
	recapLineSize = 400
)

// recap prints again, after a failed test's whole output, only the lines
// the test itself logged (file:line first) and its subtests' FAIL lines.
// An end-to-end test's output is mostly the daemons' logs, relayed as
// continuation lines; a CI page that shows the log's end, or a part of it
// around the FAIL lines, then shows why the test failed.
func recap(out io.Writer, test, output string) {
	var lines []string
	for line := range strings.Lines(output) {
		line = strings.TrimRight(line, "\n")
		if !testLine.MatchString(line) && !strings.Contains(line, "--- FAIL: ") {
			continue
		}
		if len(line) > recapLineSize {
			line = strings.ToValidUTF8(line[:recapLineSize], "") + " …"
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(out, "=== %s failed; its own lines, without the logs it relayed:\n", test)
	if len(lines) > recapLines {
		fmt.Fprintf(out, "    (%d lines; the last %d)\n", len(lines), recapLines)
		lines = lines[len(lines)-recapLines:]
	}
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
}
