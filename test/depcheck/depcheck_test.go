package depcheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// machineProvided are programs every machine of the project's kind has
// before any install step (MACHINE.md: Go at /usr/local/go), so no install
// script provides them.
var machineProvided = map[string]string{
	"go":    "Go at /usr/local/go is on every machine of the project's kind",
	"gofmt": "it comes with Go",
}

// scriptPrograms are the programs the Makefile and the install scripts run
// that the Go scan cannot see.
var scriptPrograms = []Site{
	{"gofmt", "Makefile (lint)"},
	{"shellcheck", "Makefile (lint)"},
	{"protoc", "Makefile (proto)"},
	{"git", "Makefile (VERSION)"},
	{"curl", "scripts/deps.sh, scripts/demo.sh"},
	{"sha512sum", "scripts/deps.sh"},
	{"tar", "scripts/deps.sh"},
	{"npm", "scripts/deps.sh (noVNC), test/e2b-js"},
	{"node", "test/e2b-js"},
	{"dpkg-query", "scripts/deps.sh"},
	{"apt-get", "scripts/deps.sh"},
}

// provides is what an install script says it installs (its --list).
type provides struct {
	debs  map[string]bool // Debian packages
	files map[string]bool // files it installs itself
	cmds  map[string]bool // commands it makes sure of, however they came
}

func listOf(t *testing.T, script string) provides {
	t.Helper()
	out, err := exec.Command("bash", script, "--list").Output()
	if err != nil {
		t.Fatalf("%s --list: %v", script, err)
	}
	p := provides{debs: map[string]bool{}, files: map[string]bool{}, cmds: map[string]bool{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		kind, what, _ := strings.Cut(sc.Text(), " ")
		switch kind {
		case "deb":
			p.debs[what] = true
		case "file":
			p.files[what] = true
		case "cmd":
			p.cmds[what] = true
		default:
			t.Fatalf("%s --list: bad line %q", script, sc.Text())
		}
	}
	return p
}

// dpkgOwner returns the Debian package that installed path, trying the
// other spelling of a path on a merged-/usr system (/bin vs /usr/bin).
func dpkgOwner(path string) (string, error) {
	cands := []string{path}
	if real, err := filepath.EvalSymlinks(path); err == nil && real != path {
		cands = append(cands, real)
	}
	for _, p := range append([]string(nil), cands...) {
		if rest, ok := strings.CutPrefix(p, "/usr"); ok {
			cands = append(cands, rest)
		} else {
			cands = append(cands, "/usr"+p)
		}
	}
	for _, p := range cands {
		out, err := exec.Command("dpkg-query", "-S", p).Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkgs, file, ok := strings.Cut(line, ": ")
			if !ok || file != p || strings.HasPrefix(pkgs, "diversion ") {
				continue
			}
			pkg, _, _ := strings.Cut(pkgs, ",")
			pkg, _, _ = strings.Cut(strings.TrimSpace(pkg), ":") // multiarch qualifier
			return pkg, nil
		}
	}
	return "", fmt.Errorf("no Debian package owns %s", path)
}

// baseSystem reports whether pkg is part of every Debian system (Essential
// or of priority required: what debootstrap --variant=minbase installs).
func baseSystem(pkg string) bool {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Essential} ${Priority}", pkg).Output()
	if err != nil {
		return false
	}
	f := strings.Fields(string(out))
	return len(f) == 2 && (f[0] == "yes" || f[1] == "required")
}

// TestDepsInstallEveryProgram checks that every host program the code and
// the tests run is installed by scripts/deps.sh, or is part of every Debian
// system, or (for production-only programs, which are not on development
// and test machines at all) by deploy/provision.sh. It runs
// after deps.sh in `make test`, so each program must be on this machine;
// which package it came from is asked of dpkg, so a program that is here
// only because someone installed it by hand fails the check.
func TestDepsInstallEveryProgram(t *testing.T) {
	wd, _ := os.Getwd()
	root, err := ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	sites, bad, err := Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range bad {
		t.Error(e)
	}
	sites = append(sites, scriptPrograms...)
	deps := listOf(t, filepath.Join(root, "scripts/deps.sh"))
	prov := listOf(t, filepath.Join(root, "deploy/provision.sh"))

	byProg := map[string][]string{}
	for _, s := range sites {
		byProg[s.Program] = append(byProg[s.Program], s.Pos)
	}
	progs := make([]string, 0, len(byProg))
	for p := range byProg {
		progs = append(progs, p)
	}
	sort.Strings(progs)
	var table strings.Builder
	for _, prog := range progs {
		where := byProg[prog][0]
		if n := len(byProg[prog]); n > 1 {
			where += fmt.Sprintf(" and %d more", n-1)
		}
		from, err := providerOf(prog, deps, prov)
		if err != nil {
			t.Errorf("%s (run at %s): %v", prog, where, err)
			continue
		}
		fmt.Fprintf(&table, "%-22s %-34s %s\n", prog, from, where)
	}
	t.Logf("%d programs, each with where it comes from and where it runs:\n%s", len(progs), table.String())
}

// providerOf says where prog comes from, or why that is not good enough.
func providerOf(prog string, deps, prov provides) (string, error) {
	if why, ok := machineProvided[prog]; ok {
		if _, err := exec.LookPath(prog); err != nil { //depcheck:caller
			return "", fmt.Errorf("not found (%s): %w", why, err)
		}
		return "the machine", nil
	}
	path, err := exec.LookPath(prog) //depcheck:caller
	if err != nil {
		for f := range prov.files {
			if filepath.Base(f) == filepath.Base(prog) {
				return "deploy/provision.sh (production only)", nil
			}
		}
		return "", errors.New("not installed, though scripts/deps.sh has run: add its package to scripts/deps.sh (or, if only production hosts need it, to deploy/provision.sh)")
	}
	switch {
	case deps.cmds[prog]:
		// deps.sh checks for it itself and installs it when it is
		// missing or too old (node from the npm registry).
		return "scripts/deps.sh (" + path + ")", nil
	case deps.files[path]:
		return "scripts/deps.sh (" + path + ")", nil
	}
	pkg, err := dpkgOwner(path)
	if err != nil {
		return "", fmt.Errorf("%s: %v, and neither scripts/deps.sh nor deploy/provision.sh lists it as a file they install", path, err)
	}
	switch {
	case deps.debs[pkg]:
		return "scripts/deps.sh: " + pkg, nil
	case baseSystem(pkg):
		return "base system: " + pkg, nil
	}
	// deploy/provision.sh counts only for programs that development and
	// test machines never run (it does not run there): one that is run
	// here must come from deps.sh.
	also := ""
	if prov.debs[pkg] {
		also = " (deploy/provision.sh does, but it is not run on development and test machines)"
	}
	return "", fmt.Errorf("%s comes from the Debian package %s, which scripts/deps.sh does not install%s; it is here only because something else installed it: add %s to scripts/deps.sh", path, pkg, also, pkg)
}

// TestScan checks the scanner on each form of site it understands, and that
// a site it cannot resolve is reported rather than passed over.
func TestScan(t *testing.T) {
	src := `package p

import "os/exec"

const tool = "mkfs.ext4"

//depcheck:runner
func run(name string, args ...string) error { return nil }

func f(bin string, argv []string) {
	exec.Command("nft", "list")
	exec.CommandContext(ctx, tool, "-q")
	exec.LookPath("qemu-img")
	for _, t := range []string{"debootstrap", "chroot"} {
		exec.LookPath(t)
	}
	for _, args := range [][]string{{"mount", "-o", "loop"}, {"umount", "x"}} {
		exec.Command(args[0], args[1:]...)
	}
	//depcheck:runs runsc runc
	exec.Command(bin)
	exec.Command(bin, "x") //depcheck:built
	exec.Command("/bin/sh", "-c", "nsenter true") //depcheck:runs nsenter
	run("xz", "-d")
	needs.Command(t, "node", "npm")
	needs.Runtime(t, "runsc")
	exec.Command(argv[0])
	exec.LookPath(bin) //depcheck:caller
}
`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	sites, bad, err := Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sites {
		got = append(got, s.Program+"@"+strings.TrimPrefix(s.Pos, "p.go:"))
	}
	want := []string{
		"nft@11", "mkfs.ext4@12", "qemu-img@13", "debootstrap@15", "chroot@15",
		"mount@18", "umount@18", "runsc@21", "runc@21", "/bin/sh@23", "nsenter@23",
		"xz@24", "node@25", "npm@25", "runsc@26",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sites (-want +got):\n%s", diff)
	}
	if len(bad) != 1 || !strings.Contains(bad[0].Error(), "p.go:27:") {
		t.Errorf("unresolved sites = %v, want exactly the one at p.go:27 (exec.Command(argv[0]))", bad)
	}
}
