// Package depcheck finds every host program the module executes, so that a
// test can hold scripts/deps.sh (and deploy/provision.sh, for production-only
// programs) to installing all of them: a new dependency cannot be forgotten
// in the install script again, as nftables once was.
//
// Scan reads the module's Go source (go/parser only: no build, no type
// check, so it runs in a second) and reports each call of exec.Command,
// exec.CommandContext and exec.LookPath, and each test gate that names a
// program (needs.Command, needs.Runtime). A site's program is found when it
// is a string literal, a string constant of its package, or the loop value
// of a range over a literal list (`for _, t := range []string{"a", "b"}`, and
// `args[0]` of a range over a literal list of argv lists). Any other site
// must say what it runs in a directive comment at the end of its line, or
// alone on the line above:
//
//	//depcheck:runs NAME...   the programs this site may run (also adds to a
//	                          resolved site: programs a shell script runs)
//	//depcheck:built          a binary the code built itself (cubicled)
//	//depcheck:guest          a program run inside a sandbox, not on the host
//	//depcheck:caller         the program is a parameter, named by callers
//	                          whose calls are sites of their own (needs.Command)
//
// A function whose doc carries //depcheck:runner takes a program name as
// its first string argument; every call of it with a literal is a site.
//
// Only the tests import this package.
package depcheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Site is one place that runs a host program.
type Site struct {
	Program string // name as on PATH, or an absolute path
	Pos     string // file:line, relative to the scanned root
}

// Scan returns the host-program sites of the Go files under root, and the
// sites it could not resolve (as errors naming their position). Vendor-like
// trees (node_modules, .git) and generated protobuf code are skipped.
func Scan(root string) ([]Site, []error, error) {
	pkgs := map[string][]*ast.File{} // directory → files
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", "proto":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(p)
		pkgs[dir] = append(pkgs[dir], f)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	var sites []Site
	var errs []error
	dirs := make([]string, 0, len(pkgs))
	for d := range pkgs {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		s, e := scanPackage(fset, root, pkgs[d])
		sites = append(sites, s...)
		errs = append(errs, e...)
	}
	return sites, errs, nil
}

// scanner holds what one package's files declare.
type scanner struct {
	fset    *token.FileSet
	root    string
	consts  map[string]string // string constants of the package
	runners map[string]bool   // functions marked //depcheck:runner
	sites   []Site
	errs    []error
}

func scanPackage(fset *token.FileSet, root string, files []*ast.File) ([]Site, []error) {
	s := &scanner{fset: fset, root: root, consts: map[string]string{}, runners: map[string]bool{}}
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.GenDecl:
				if d.Tok != token.CONST {
					continue
				}
				for _, spec := range d.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if v, ok := stringLit(vs.Values[i]); ok {
								s.consts[n.Name] = v
							}
						}
					}
				}
			case *ast.FuncDecl:
				if d.Doc != nil && strings.Contains(d.Doc.Text()+directives(d.Doc), "depcheck:runner") {
					s.runners[d.Name.Name] = true
				}
			}
		}
	}
	for _, f := range files {
		s.scanFile(f)
	}
	return s.sites, s.errs
}

// directives returns the //-directives of a comment group, which Text drops.
func directives(g *ast.CommentGroup) string {
	var b strings.Builder
	for _, c := range g.List {
		if strings.HasPrefix(c.Text, "//depcheck:") {
			b.WriteString(c.Text + "\n")
		}
	}
	return b.String()
}

// annotations maps the line of each call a depcheck directive applies to
// (its own line, or the next one for a directive alone on its line) to the
// directive.
func annotations(fset *token.FileSet, f *ast.File) map[int]string {
	out := map[int]string{}
	var lines []string
	for _, g := range f.Comments {
		for _, c := range g.List {
			rest, ok := strings.CutPrefix(c.Text, "//depcheck:")
			if !ok {
				continue
			}
			pos := fset.Position(c.Pos())
			if lines == nil {
				src, _ := os.ReadFile(pos.Filename)
				lines = strings.Split(string(src), "\n")
			}
			line := pos.Line
			if pos.Line <= len(lines) && strings.TrimSpace(lines[pos.Line-1][:pos.Column-1]) == "" {
				line++ // alone on its line: for the call below
			}
			out[line] = rest
		}
	}
	return out
}

func (s *scanner) scanFile(f *ast.File) {
	notes := annotations(s.fset, f)
	// The enclosing range statements of the node being visited, innermost
	// last, to resolve loop variables.
	var ranges []*ast.RangeStmt
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.RangeStmt:
			ranges = append(ranges, n)
			ast.Inspect(n.Body, visit)
			ranges = ranges[:len(ranges)-1]
			ast.Inspect(n.X, visit)
			return false
		case *ast.CallExpr:
			arg, ok := s.programArg(n)
			if !ok {
				return true
			}
			pos := s.fset.Position(n.Pos())
			rel, _ := filepath.Rel(s.root, pos.Filename)
			where := fmt.Sprintf("%s:%d", rel, pos.Line)
			note, noted := notes[pos.Line]
			kind, names, _ := strings.Cut(note, " ")
			if noted {
				switch kind {
				case "built", "guest", "caller":
					return true
				case "runs":
				default:
					s.errs = append(s.errs, fmt.Errorf("%s: unknown directive //depcheck:%s", where, kind))
					return true
				}
			}
			var progs []string
			for _, a := range arg {
				progs = append(progs, s.resolve(a, ranges)...)
			}
			if noted {
				progs = append(progs, strings.Fields(names)...)
			}
			if len(progs) == 0 {
				s.errs = append(s.errs, fmt.Errorf("%s: cannot tell which program this runs: name it in a //depcheck:runs comment (or //depcheck:built, //depcheck:guest)", where))
				return true
			}
			for _, p := range progs {
				s.sites = append(s.sites, Site{Program: p, Pos: where})
			}
		}
		return true
	}
	ast.Inspect(f, visit)
}

// programArg returns the argument expressions of call that name programs,
// and whether call is a site at all.
func (s *scanner) programArg(call *ast.CallExpr) ([]ast.Expr, bool) {
	switch fn := call.Fun.(type) {
	case *ast.SelectorExpr:
		pkg, _ := fn.X.(*ast.Ident)
		switch {
		case pkg != nil && pkg.Name == "exec" && (fn.Sel.Name == "Command" || fn.Sel.Name == "LookPath"):
			return call.Args[:min(1, len(call.Args))], len(call.Args) > 0
		case pkg != nil && pkg.Name == "exec" && fn.Sel.Name == "CommandContext":
			return call.Args[1:min(2, len(call.Args))], len(call.Args) > 1
		case pkg != nil && pkg.Name == "needs" && fn.Sel.Name == "Command":
			return call.Args[1:], len(call.Args) > 1
		case pkg != nil && pkg.Name == "needs" && fn.Sel.Name == "Runtime":
			return call.Args[1:min(2, len(call.Args))], len(call.Args) > 1
		case s.runners[fn.Sel.Name]:
			return firstString(call.Args)
		}
	case *ast.Ident:
		if s.runners[fn.Name] {
			return firstString(call.Args)
		}
	}
	return nil, false
}

// firstString returns the first string-literal argument of a runner call.
func firstString(args []ast.Expr) ([]ast.Expr, bool) {
	for _, a := range args {
		if _, ok := stringLit(a); ok {
			return []ast.Expr{a}, true
		}
	}
	return nil, true
}

// resolve returns the program names expression e can hold, or none.
func (s *scanner) resolve(e ast.Expr, ranges []*ast.RangeStmt) []string {
	if v, ok := stringLit(e); ok {
		return []string{v}
	}
	switch e := e.(type) {
	case *ast.Ident:
		if v, ok := s.consts[e.Name]; ok {
			return []string{v}
		}
		if lit := rangeList(e.Name, ranges); lit != nil {
			var out []string
			for _, el := range lit.Elts {
				if v, ok := stringLit(el); ok {
					out = append(out, v)
				}
			}
			return out
		}
	case *ast.IndexExpr:
		// args[0] of `for _, args := range [][]string{{"prog", ...}, ...}`
		id, ok := e.X.(*ast.Ident)
		if idx, isLit := e.Index.(*ast.BasicLit); !ok || !isLit || idx.Value != "0" {
			return nil
		}
		if lit := rangeList(id.Name, ranges); lit != nil {
			var out []string
			for _, el := range lit.Elts {
				if argv, ok := el.(*ast.CompositeLit); ok && len(argv.Elts) > 0 {
					if v, ok := stringLit(argv.Elts[0]); ok {
						out = append(out, v)
					}
				}
			}
			return out
		}
	}
	return nil
}

// rangeList returns the literal list that the innermost enclosing range
// with loop value name ranges over.
func rangeList(name string, ranges []*ast.RangeStmt) *ast.CompositeLit {
	for i := len(ranges) - 1; i >= 0; i-- {
		r := ranges[i]
		if v, ok := r.Value.(*ast.Ident); ok && v.Name == name {
			lit, _ := r.X.(*ast.CompositeLit)
			return lit
		}
	}
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(bl.Value)
	return v, err == nil
}

// ModuleRoot returns the directory of the go.mod above dir.
func ModuleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
	}
}
