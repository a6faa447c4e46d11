package image

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
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
