package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

func summaryMain(args []string) error {
	fs := flag.NewFlagSet("summary", flag.ContinueOnError)
	stepsFile := fs.String("steps", "", "tab-separated steps: name, seconds, exit status")
	outFile := fs.String("out", "", "Markdown file to write (stdout too)")
	top := fs.Int("top", 30, "how many of the slowest tests and subtests to list")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var steps []step
	if *stepsFile != "" {
		var err error
		if steps, err = readSteps(*stepsFile); err != nil {
			return err
		}
	}
	var runs []*run
	for _, name := range fs.Args() {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		r, err := readRun(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		runs = append(runs, r)
	}
	var b strings.Builder
	writeSummary(&b, steps, merge(runs), *top)
	fmt.Print(b.String())
	if *outFile != "" {
		return os.WriteFile(*outFile, []byte(b.String()), 0o644)
	}
	return nil
}

// step is one line of the steps file make test writes: name, seconds,
// exit status and, for a step run beside another, that one's name.
type step struct {
	name    string
	seconds float64
	status  string
	beside  string
}

func readSteps(path string) ([]step, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var steps []step
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) < 3 {
			continue
		}
		s, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: step %q: %w", path, fields[0], err)
		}
		st := step{name: fields[0], seconds: s, status: fields[2]}
		if len(fields) > 3 {
			st.beside = fields[3]
		}
		steps = append(steps, st)
	}
	return steps, sc.Err()
}

// pkgResult and testResult are what a run says of a package and a test.
type pkgResult struct {
	name                    string
	seconds                 float64
	result                  string // pass, fail, or "" when it never ended
	passed, failed, skipped int
}

type testResult struct {
	pkg, name string
	seconds   float64
	result    string
}

type run struct {
	pkgs  map[string]*pkgResult
	tests []testResult
}

func readRun(r io.Reader) (*run, error) {
	res := &run{pkgs: map[string]*pkgResult{}}
	pkg := func(name string) *pkgResult {
		p := res.pkgs[name]
		if p == nil {
			p = &pkgResult{name: name}
			res.pkgs[name] = p
		}
		return p
	}
	d := newDecoder(r)
	for {
		e, _, ok := d.next()
		if !ok {
			break
		}
		if e.Action == "build-fail" {
			pkg(e.ImportPath).result = "build failed"
			continue
		}
		if e.Package == "" {
			continue
		}
		switch e.Action {
		case "pass", "fail", "skip":
		default:
			continue
		}
		if e.Test == "" {
			if e.Action == "skip" {
				continue // no test files
			}
			p := pkg(e.Package)
			p.seconds, p.result = e.Elapsed, e.Action
			continue
		}
		p := pkg(e.Package)
		switch e.Action {
		case "pass":
			p.passed++
		case "fail":
			p.failed++
		case "skip":
			p.skipped++
		}
		res.tests = append(res.tests, testResult{e.Package, e.Test, e.Elapsed, e.Action})
	}
	return res, d.err()
}

// merge puts several runs (make test's go test invocations) into one.
func merge(runs []*run) *run {
	all := &run{pkgs: map[string]*pkgResult{}}
	for _, r := range runs {
		for k, p := range r.pkgs {
			all.pkgs[k] = p
		}
		all.tests = append(all.tests, r.tests...)
	}
	return all
}

func writeSummary(w io.Writer, steps []step, r *run, top int) {
	if len(steps) > 0 {
		var total float64
		fmt.Fprintf(w, "## Steps\n\n| step | seconds | status |\n|---|---:|---|\n")
		for _, s := range steps {
			name := s.name
			if s.beside != "" {
				// Its time overlaps the other step's: not added.
				name += " (beside " + s.beside + ")"
			} else {
				total += s.seconds
			}
			fmt.Fprintf(w, "| %s | %.0f | %s |\n", name, s.seconds, s.status)
		}
		fmt.Fprintf(w, "| **all** | **%.0f** (%.1f min) | |\n\n", total, total/60)
	}
	pkgs := make([]*pkgResult, 0, len(r.pkgs))
	var total float64
	for _, p := range r.pkgs {
		pkgs = append(pkgs, p)
		total += p.seconds
	}
	sort.Slice(pkgs, func(i, j int) bool {
		if pkgs[i].seconds != pkgs[j].seconds {
			return pkgs[i].seconds > pkgs[j].seconds
		}
		return pkgs[i].name < pkgs[j].name
	})
	fmt.Fprintf(w, "## Packages (%d; their times add up to %.0f s: packages run side by side overlap)\n\n", len(pkgs), total)
	fmt.Fprintf(w, "| package | seconds | result | passed | failed | skipped |\n|---|---:|---|---:|---:|---:|\n")
	for _, p := range pkgs {
		result := p.result
		if result == "" {
			result = "no end"
		}
		fmt.Fprintf(w, "| %s | %.1f | %s | %d | %d | %d |\n", short(p.name), p.seconds, result, p.passed, p.failed, p.skipped)
	}
	var tops, subs []testResult
	for _, t := range r.tests {
		if topLevel(t.name) {
			tops = append(tops, t)
		} else {
			subs = append(subs, t)
		}
	}
	slowest(w, "tests", tops, top)
	slowest(w, "subtests", subs, top)
	var passed, failed, skipped int
	for _, p := range pkgs {
		passed, failed, skipped = passed+p.passed, failed+p.failed, skipped+p.skipped
	}
	// The plain closing line a CI reads for the count of tests run.
	fmt.Fprintf(w, "\ntotal: %d passed, %d failed, %d skipped\n", passed, failed, skipped)
}

func slowest(w io.Writer, what string, ts []testResult, n int) {
	if len(ts) == 0 {
		return
	}
	sort.SliceStable(ts, func(i, j int) bool { return ts[i].seconds > ts[j].seconds })
	if len(ts) > n {
		ts = ts[:n]
	}
	fmt.Fprintf(w, "\n## The %d slowest %s\n\n| %s | package | seconds | result |\n|---|---|---:|---|\n", len(ts), what, strings.TrimSuffix(what, "s"))
	for _, t := range ts {
		fmt.Fprintf(w, "| %s | %s | %.1f | %s |\n", t.name, short(t.pkg), t.seconds, t.result)
	}
}

// short drops the module path from a package's import path.
func short(pkg string) string {
	const module = "github.com/cubicle-dev/cubicle/"
	if s, ok := strings.CutPrefix(pkg, module); ok {
		return s
	}
	return pkg
}
