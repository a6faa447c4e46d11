// Command testreport reads `go test -json` and tells where a test run's time
// went. It has two verbs:
//
//	testreport stream -json FILE   < go-test-json
//	testreport summary -steps FILE -out FILE JSON...
//
// stream copies the event stream to FILE untouched and prints what a person
// reads in a CI log: each top-level test as it ends (`--- PASS: TestX
// (12.3s)`), the whole output of every test that failed, a package's build
// errors, go test's own per-package lines (`ok`/`FAIL`), and a closing
// `N passed, N failed, N skipped`. Its exit status is 1 when any test or
// package failed, so a pipeline's status does not depend on go test's
// alone. summary reads the recorded streams and the step timings `make
// test` wrote, and writes a Markdown table: per-package totals, the slowest
// tests and subtests, and how long each step took.
//
// It is written here rather than taken from gotestsum: the summary is this
// project's own table, the stream filter is a hundred lines over
// test2json's documented events, and one less program to install keeps the
// fresh machine's set-up short.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testreport stream -json FILE | testreport summary -steps FILE -out FILE JSON...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "stream":
		err = streamMain(os.Args[2:])
	case "summary":
		err = summaryMain(os.Args[2:])
	default:
		err = fmt.Errorf("unknown verb %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
}
