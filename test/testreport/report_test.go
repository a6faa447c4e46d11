package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// goTestJSON runs the real go test -json on testdata/sample.
func goTestJSON(t *testing.T, env ...string) []byte {
	t.Helper()
	needs.Command(t, "go")
	cmd := exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = filepath.Join("testdata", "sample")
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.Output() // the sample fails on purpose
	if !bytes.Contains(out, []byte(`"Action":"start"`)) {
		t.Fatalf("go test -json printed no events: %s", out)
	}
	return out
}

func TestStream(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     []string
		res     result
		want    []string // in the log
		notWant []string
	}{{
		name: "a failing test",
		res:  result{passed: 4, failed: 2, skipped: 1, pkgFailed: 1},
		want: []string{
			"--- PASS: TestTakesAWhile (1.",
			"--- FAIL: TestFails/broken", "the pixel was black",
			// The recap after the output: the test's own lines, not
			// what it relayed.
			"=== TestFails failed; its own lines, without the logs it relayed:\n    sample_test.go:17: daemon log:\n    sample_test.go:18: the pixel was black\n--- FAIL: TestFails/broken",
			"--- SKIP: TestSkips", "needs a thing",
			"FAIL\tsample",
			"4 passed, 2 failed, 1 skipped\n",
		},
		notWant: []string{"quiet when it passes", "ok  \tsample", "--- PASS: TestPasses", "--- PASS: TestDies"},
	}, {
		name: "a test binary that exits mid-test",
		env:  []string{"SAMPLE_DIE=1"},
		want: []string{"=== RUN   TestDies\n--- NO END: TestDies", "FAIL\tsample"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			in := goTestJSON(t, tc.env...)
			var raw, log bytes.Buffer
			res, err := stream(bytes.NewReader(in), &raw, &log)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(raw.Bytes(), in) {
				t.Errorf("the recorded stream differs from go test's (%d bytes, want %d)", raw.Len(), len(in))
			}
			if tc.res != (result{}) && res != tc.res {
				t.Errorf("result %+v, want %+v", res, tc.res)
			}
			if res.failed+res.pkgFailed == 0 {
				t.Errorf("result %+v: a failing package counted no failure", res)
			}
			for _, w := range tc.want {
				if !strings.Contains(log.String(), w) {
					t.Errorf("log lacks %q:\n%s", w, log.String())
				}
			}
			if _, after, ok := strings.Cut(log.String(), "its own lines, without the logs it relayed"); ok && strings.Contains(after, "relayed noise") {
				t.Errorf("the recap has a relayed line:\n%s", after)
			}
			for _, w := range tc.notWant {
				if strings.Contains(log.String(), w) {
					t.Errorf("log has %q:\n%s", w, log.String())
				}
			}
		})
	}
}

func TestStreamPassing(t *testing.T) {
	in := `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"noise\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":1.5}
{"Action":"output","Package":"p","Output":"ok  \tp\t1.6s\n"}
{"Action":"pass","Package":"p","Elapsed":1.6}
not an event at all
`
	var log bytes.Buffer
	res, err := stream(strings.NewReader(in), &bytes.Buffer{}, &log)
	if err != nil {
		t.Fatal(err)
	}
	want := "--- PASS: TestA (1.50s) p\nok  \tp\t1.600s\nnot an event at all\n1 passed, 0 failed, 0 skipped\n"
	if res != (result{passed: 1}) || log.String() != want {
		t.Errorf("got %+v and\n%q\nwant\n%q", res, log.String(), want)
	}
}

func TestSummary(t *testing.T) {
	r, err := readRun(bytes.NewReader(goTestJSON(t)))
	if err != nil {
		t.Fatal(err)
	}
	p := r.pkgs["sample"]
	if p == nil || p.result != "fail" || p.passed != 4 || p.failed != 2 || p.skipped != 1 {
		t.Fatalf("package sample: %+v", p)
	}
	var b strings.Builder
	writeSummary(&b, []step{{"deps", 29, "0", ""}, {"unit", 90.4, "1", ""}, {"fuzz", 60, "0", "unit"}}, r, 2)
	s := b.String()
	for _, w := range []string{
		"| deps | 29 | 0 |", "| unit | 90 | 1 |", "| fuzz (beside unit) | 60 | 0 |", "**119** (2.0 min)",
		"| sample |", "| fail | 4 | 2 | 1 |",
		"## The 2 slowest tests", "## The 2 slowest subtests", "TestFails/",
		"\ntotal: 4 passed, 2 failed, 1 skipped\n",
	} {
		if !strings.Contains(s, w) {
			t.Errorf("summary lacks %q:\n%s", w, s)
		}
	}
	if n := strings.Count(s, "| Test"); n != 4 {
		t.Errorf("%d test rows, want 2 tests and 2 subtests:\n%s", n, s)
	}
}

// TestStreamPanicAfterPass: a panic that test2json gives to a test that
// passed (a goroutine it left) still reaches the log of the failed package.
func TestStreamPanicAfterPass(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS: TestA (0.00s)\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"panic: a goroutine TestA left\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}
{"Action":"fail","Package":"p","Elapsed":0.1}
`
	var log bytes.Buffer
	res, err := stream(strings.NewReader(in), &bytes.Buffer{}, &log)
	if err != nil {
		t.Fatal(err)
	}
	if res.pkgFailed != 1 || !strings.Contains(log.String(), "panic: a goroutine TestA left") {
		t.Errorf("got %+v and a log without the panic:\n%s", res, log.String())
	}
}
