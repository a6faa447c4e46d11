package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

func TestLoadRecipeFrom(t *testing.T) {
	js := `{"from":"desktop","packages":["jq"],"remove":["/usr/local/lib/x"],
		"dirs":[{"path":"/home/user/work","owner":"user"}],
		"chromium":{"policies":{"ManagedBookmarks":[{"name":"Wiki","url":"http://wiki.test/"}]},
			"flags":["--lang=de"],"extensions":["/opt/ext/banner"]}}`
	r, err := LoadRecipe(fstest.MapFS{"recipe.json": {Data: []byte(js)}})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing inherited is defaulted: the parent's sources stay.
	if r.Suite != "" || r.Mirror != "" || r.Security != "" || len(r.Components) != 0 {
		t.Errorf("a recipe with from got defaults: %+v", r)
	}
	h1, _ := RecipeHash(fstest.MapFS{"recipe.json": {Data: []byte(js)}})
	p1 := fromHash(h1, Image{Name: "desktop", Dir: "/i/.store/desktop@1", RecipeHash: "a"})
	p2 := fromHash(h1, Image{Name: "desktop", Dir: "/i/.store/desktop@2", RecipeHash: "a"})
	p3 := fromHash(h1, Image{Name: "desktop", Dir: "/i/.store/desktop@1", RecipeHash: "b"})
	if p1 == p2 || p1 == p3 || p1 == h1 {
		t.Errorf("a new parent version leaves the child's hash alone: %s %s %s", p1, p2, p3)
	}
}

// TestAddChromium checks that a chain of recipes merges: the child's
// policies win a conflict and keep the parent's others, flags add up, and
// every extension of the chain stays on the one --load-extension line
// Chromium reads.
func TestAddChromium(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	parent := &ChromiumRecipe{
		Policies:   map[string]json.RawMessage{"HomepageLocation": json.RawMessage(`"http://a.test/"`), "BookmarkBarEnabled": json.RawMessage(`true`)},
		Flags:      []string{"--lang=de"},
		Extensions: []string{"/opt/ext/a"},
	}
	child := &ChromiumRecipe{
		Policies:   map[string]json.RawMessage{"HomepageLocation": json.RawMessage(`"http://b.test/"`)},
		Flags:      []string{"--force-dark-mode"},
		Extensions: []string{"/opt/ext/b"},
	}
	for _, c := range []*ChromiumRecipe{parent, child, nil} {
		if err := addChromium(root, c); err != nil {
			t.Fatal(err)
		}
	}
	var pol map[string]any
	data, err := os.ReadFile(filepath.Join(dir, recipePolicyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &pol); err != nil {
		t.Fatal(err)
	}
	if pol["HomepageLocation"] != "http://b.test/" || pol["BookmarkBarEnabled"] != true {
		t.Errorf("policies = %v; want the child's homepage and the parent's bookmark bar", pol)
	}
	flags, err := os.ReadFile(filepath.Join(dir, recipeFlagFile))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(flags)), "\n") {
		if !strings.HasPrefix(l, "#") {
			got = append(got, l)
		}
	}
	want := []string{"--lang=de", "--force-dark-mode", "--load-extension=/opt/ext/a,/opt/ext/b"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("flags = %q, want %q", got, want)
	}
	if fi, err := os.Stat(filepath.Join(dir, recipePolicyFile)); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("policy file: %v %v; want 0644", fi, err)
	}
}

func TestImageUsers(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nbroken:x:z:1::/x:/bin/sh\nshort:x\n"
	if err := os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	uids, homes := map[string][2]int{"root": {0, 0}}, map[string]string{}
	if err := imageUsers(root, uids, homes); err != nil {
		t.Fatal(err)
	}
	if uids["user"] != [2]int{1000, 1000} || homes["user"] != "/home/user" {
		t.Errorf("user = %v %q", uids["user"], homes["user"])
	}
	if _, ok := uids["broken"]; ok {
		t.Errorf("a line with a bad uid was taken: %v", uids)
	}
}

// TestBuildFrom builds a child of an imported image for real (no packages,
// so no chroot: cp, then files): the child has the parent's files, minus
// what it removes, plus its own and its Chromium section; the parent is
// untouched; a rebuild is cached until the parent changes. Packages on
// top of an imported parent are refused before anything runs.
func TestBuildFrom(t *testing.T) {
	needs.Root(t)
	needs.Command(t, "cp")
	dir := t.TempDir()
	tarball := makeTar(t, []entry{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/passwd", typ: tar.TypeReg, body: "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n", mode: 0o644},
		{name: "opt/stand-in/", typ: tar.TypeDir, mode: 0o755},
		{name: "opt/stand-in/x", typ: tar.TypeReg, body: "old", mode: 0o755},
		{name: "usr/keep", typ: tar.TypeReg, body: "keep", mode: 0o644},
	})
	if _, err := Import(context.Background(), "base", tarball, dir, ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	recipe := fstest.MapFS{
		"recipe.json": {Data: []byte(`{"from":"base","remove":["/opt/stand-in"],
			"dirs":[{"path":"/home/user/work","owner":"user"}],
			"modes":{"/usr/local/bin/tool":"0755"},
			"chromium":{"policies":{"BookmarkBarEnabled":true},"extensions":["/opt/ext"]}}`)},
		"files/usr/local/bin/tool": {Data: []byte("#!/bin/sh\n")},
	}
	img, err := Build(context.Background(), "child", recipe, dir, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	parent, _ := Lookup(dir, "base")
	if img.From != filepath.Base(parent.Dir) {
		t.Errorf("From = %q, want %q", img.From, filepath.Base(parent.Dir))
	}
	for p, want := range map[string]string{"usr/keep": "keep", "usr/local/bin/tool": "#!/bin/sh\n"} {
		if b, err := os.ReadFile(filepath.Join(img.RootFS, p)); err != nil || string(b) != want {
			t.Errorf("/%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(img.RootFS, "opt/stand-in")); err == nil {
		t.Errorf("/opt/stand-in was not removed")
	}
	if _, err := os.Stat(filepath.Join(parent.RootFS, "opt/stand-in/x")); err != nil {
		t.Errorf("the parent lost /opt/stand-in/x: %v", err)
	}
	fi, err := os.Stat(filepath.Join(img.RootFS, "home/user/work"))
	if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("/home/user/work: %v %v; want it owned by the parent's user (1000)", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(img.RootFS, recipeFlagFile)); !strings.Contains(string(b), "--load-extension=/opt/ext\n") {
		t.Errorf("flags = %q", b)
	}
	again, err := Build(context.Background(), "child", recipe, dir, t.TempDir(), nil)
	if err != nil || !again.Cached {
		t.Errorf("a second build: cached=%v, %v; want cached", again.Cached, err)
	}
	// A new version of the parent builds a new child.
	if _, err := Import(context.Background(), "base", makeTar(t, []entry{{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/passwd", typ: tar.TypeReg, body: "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n", mode: 0o644}}), dir, ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	if third, err := Build(context.Background(), "child", recipe, dir, t.TempDir(), nil); err != nil || third.Cached {
		t.Errorf("after the parent changed: cached=%v, %v; want a new build", third.Cached, err)
	}
	withPkgs := fstest.MapFS{"recipe.json": {Data: []byte(`{"from":"base","packages":["jq"]}`)}}
	if _, err := Build(context.Background(), "pkgs", withPkgs, dir, t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "was imported") {
		t.Errorf("packages on an imported parent: %v; want refused", err)
	}
	if _, err := Lookup(dir, "pkgs"); err == nil {
		t.Errorf("a refused build left an image")
	}
}
