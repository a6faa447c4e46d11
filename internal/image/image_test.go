package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/images"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"desktop", true},
		{"desktop-2.1_x", true},
		{"0", true},
		{"", false},
		{".hidden", false},
		{"-x", false},
		{"Desktop", false},
		{"a/b", false},
		{"..", false},
		{"a b", false},
		{strings.Repeat("a", 65), false},
	} {
		err := ValidateName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", tc.name, err)
		}
	}
}

func TestLoadDesktopRecipe(t *testing.T) {
	d, err := LoadRecipe(images.Desktop())
	if err != nil {
		t.Fatal(err)
	}
	if d.From != "desktop-lite" || !slices.Contains(d.Packages, "xfce4-session") || !slices.Contains(d.Packages, "xfce4-panel") {
		t.Errorf("desktop recipe: from %q, packages %v; want XFCE on desktop-lite", d.From, d.Packages)
	}
	liteFS, ok := images.Recipe("desktop-lite")
	if !ok {
		t.Fatal("no desktop-lite recipe")
	}
	r, err := LoadRecipe(liteFS)
	if err != nil {
		t.Fatal(err)
	}
	if r.Suite != "bookworm" || r.Variant != "minbase" {
		t.Errorf("suite/variant = %s/%s", r.Suite, r.Variant)
	}
	for _, p := range []string{"/usr/local/bin/cubicle-browser", "/usr/local/bin/startxfce4", "/usr/local/bin/x11vnc"} {
		if got := r.Modes[p]; got != "0755" {
			t.Errorf("%s mode = %q, want 0755", p, got)
		}
	}
	// The E2B Desktop SDK runs noVNC from /opt/noVNC; cubicle's own VNC
	// server runs under another name so the SDK's `pgrep -x x11vnc` and
	// `pkill x11vnc` leave it alone.
	for p, want := range map[string]string{"/opt/noVNC": "/usr/share/novnc", "/usr/local/bin/cubicle-vnc": "/usr/bin/x11vnc"} {
		if got := r.Links[p]; got != want {
			t.Errorf("link %s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"files/etc/cubicle/session.json", "files/usr/local/bin/cubicle-browser", "files/usr/local/bin/startxfce4", "files/etc/chromium/policies/managed/cubicle.json"} {
		if _, err := liteFS.Open(p); err != nil {
			t.Errorf("recipe lacks %s: %v", p, err)
		}
	}
}

func TestLoadRecipeRejects(t *testing.T) {
	for name, js := range map[string]string{
		"package injection":   `{"suite":"bookworm","packages":["vim; rm -rf /"]}`,
		"bad suite":           `{"suite":"../x"}`,
		"bad mirror":          `{"suite":"bookworm","mirror":"ftp://x y"}`,
		"relative dir":        `{"suite":"bookworm","dirs":[{"path":"etc/x"}]}`,
		"unknown owner":       `{"suite":"bookworm","dirs":[{"path":"/x","owner":"bob"}]}`,
		"bad mode":            `{"suite":"bookworm","modes":{"/x":"999"}}`,
		"root uid":            `{"suite":"bookworm","users":[{"name":"u","uid":0,"gid":1,"home":"/home/u"}]}`,
		"from and suite":      `{"from":"desktop","suite":"bookworm"}`,
		"from and mirror":     `{"from":"desktop","mirror":"http://x"}`,
		"bad from":            `{"from":"../desktop"}`,
		"remove w/o from":     `{"suite":"bookworm","remove":["/opt/x"]}`,
		"remove relative":     `{"from":"desktop","remove":["opt/x"]}`,
		"remove /etc":         `{"from":"desktop","remove":["/etc"]}`,
		"remove root":         `{"from":"desktop","remove":["/"]}`,
		"policy name":         `{"from":"desktop","chromium":{"policies":{"a b":1}}}`,
		"flag no dashes":      `{"from":"desktop","chromium":{"flags":["load-extension=/x"]}}`,
		"load-extension flag": `{"from":"desktop","chromium":{"flags":["--load-extension=/x"]}}`,
		"flag newline":        `{"from":"desktop","chromium":{"flags":["--a\n--b"]}}`,
		"extension comma":     `{"from":"desktop","chromium":{"extensions":["/a,/b"]}}`,
		"extension rel":       `{"from":"desktop","chromium":{"extensions":["ext"]}}`,
		"vm kernel w/ from":   `{"from":"desktop","vm":{"kernel":"linux-image-amd64"}}`,
		"bad owner w/ from":   `{"from":"desktop","dirs":[{"path":"/x","owner":"B@d"}]}`,
	} {
		fsys := fstest.MapFS{"recipe.json": {Data: []byte(js)}}
		if _, err := LoadRecipe(fsys); err == nil {
			t.Errorf("%s: LoadRecipe accepted %s", name, js)
		}
	}
}

func TestRecipeLinks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		links string
		ok    bool
	}{
		{"absolute target", `{"/opt/noVNC": "/usr/share/novnc"}`, true},
		{"relative target", `{"/usr/local/bin/vnc": "../../bin/x11vnc"}`, true},
		{"sibling links", `{"/opt/a": "/x", "/opt/ab": "/y"}`, true},
		{"no links", `{}`, true},
		{"relative path", `{"opt/noVNC": "/usr/share/novnc"}`, false},
		{"dotdot in path", `{"/opt/../etc/x": "/y"}`, false},
		{"unclean path", `{"/opt//x": "/y"}`, false},
		{"trailing slash", `{"/opt/x/": "/y"}`, false},
		{"root", `{"/": "/y"}`, false},
		{"under proc", `{"/proc/self/x": "/y"}`, false},
		{"sys itself", `{"/sys": "/y"}`, false},
		{"under dev", `{"/dev/shm": "/tmp"}`, false},
		{"under another link", `{"/opt/a": "/x", "/opt/a/b": "/y"}`, false},
		{"empty target", `{"/opt/x": ""}`, false},
		{"unclean target", `{"/opt/x": "/usr//share"}`, false},
		{"newline in target", `{"/opt/x": "/usr/share\nx"}`, false},
		{"self link", `{"/opt/x": "/opt/x"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := `{"suite":"bookworm","links":` + tc.links + `}`
			_, err := LoadRecipe(fstest.MapFS{"recipe.json": {Data: []byte(js)}})
			if (err == nil) != tc.ok {
				t.Errorf("LoadRecipe(%s) = %v, want ok=%v", js, err, tc.ok)
			}
		})
	}
}

func TestRecipeHash(t *testing.T) {
	a := fstest.MapFS{"recipe.json": {Data: []byte(`{}`)}, "files/etc/x": {Data: []byte("1")}}
	b := fstest.MapFS{"recipe.json": {Data: []byte(`{}`)}, "files/etc/x": {Data: []byte("2")}}
	c := fstest.MapFS{"recipe.json": {Data: []byte(`{}`)}, "files/etc/y": {Data: []byte("1")}}
	ha, _ := RecipeHash(a)
	ha2, _ := RecipeHash(a)
	hb, _ := RecipeHash(b)
	hc, _ := RecipeHash(c)
	// Links live in recipe.json, which the hash covers like any other file.
	l1, _ := RecipeHash(fstest.MapFS{"recipe.json": {Data: []byte(`{"links":{"/opt/a":"/x"}}`)}})
	l2, _ := RecipeHash(fstest.MapFS{"recipe.json": {Data: []byte(`{"links":{"/opt/a":"/y"}}`)}})
	if l1 == l2 {
		t.Errorf("a changed link target leaves the hash at %s", l1)
	}
	if ha != ha2 || len(ha) != 64 {
		t.Fatalf("hash not stable: %s %s", ha, ha2)
	}
	if ha == hb || ha == hc || hb == hc {
		t.Errorf("hashes collide: %s %s %s", ha, hb, hc)
	}
	if h, err := RecipeHash(images.Desktop()); err != nil || len(h) != 64 {
		t.Errorf("desktop hash = %q, %v", h, err)
	}
}

type entry struct {
	name, link, body string
	typ              byte
	mode             int64
}

func makeTar(t *testing.T, ents []entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode,
			Size: int64(len(e.body)), Uid: os.Getuid(), Gid: os.Getgid()}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return &buf
}

func TestImport(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	os.Mkdir(outside, 0o755)
	tarball := makeTar(t, []entry{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		{name: "usr/bin/sh", typ: tar.TypeReg, body: "#!sh", mode: 0o4755},
		{name: "usr/bin/sh2", typ: tar.TypeLink, link: "usr/bin/sh"},
		{name: "etc/abs", typ: tar.TypeSymlink, link: outside},
		{name: "/etc/hosts", typ: tar.TypeReg, body: "hosts"},
		{name: "dev/null", typ: tar.TypeChar},
	})
	img, err := Import(context.Background(), "imp", tarball, dir, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img.Source != "import" || !strings.HasPrefix(img.RootFS, filepath.Join(dir, storeDir, "imp@")) || img.SizeBytes < 4+5 {
		t.Errorf("image = %+v", img)
	}
	fi, err := os.Stat(filepath.Join(img.RootFS, "usr/bin/sh"))
	if err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("sh mode = %v, %v; want setuid 0755", fi, err)
	}
	if l, _ := os.Readlink(filepath.Join(img.RootFS, "etc/abs")); l != outside {
		t.Errorf("etc/abs -> %q, want %q stored verbatim", l, outside)
	}
	if b, _ := os.ReadFile(filepath.Join(img.RootFS, "etc/hosts")); string(b) != "hosts" {
		t.Errorf("etc/hosts = %q", b)
	}
	if _, err := os.Lstat(filepath.Join(img.RootFS, "dev/null")); err == nil {
		t.Errorf("device node was created")
	}
	got, err := List(dir)
	if err != nil || len(got) != 1 || got[0].Name != "imp" {
		t.Errorf("List = %+v, %v", got, err)
	}
}

func TestImportHostile(t *testing.T) {
	for name, ents := range map[string][]entry{
		"dotdot":          {{name: "../evil", typ: tar.TypeReg, body: "x"}},
		"nested dotdot":   {{name: "a/../../evil", typ: tar.TypeReg, body: "x"}},
		"hardlink escape": {{name: "pw", typ: tar.TypeLink, link: "../outside/secret"}},
		"through abs symlink": {
			{name: "esc", typ: tar.TypeSymlink, link: "OUTSIDE"},
			{name: "esc/evil", typ: tar.TypeReg, body: "x"},
		},
		"through rel symlink": {
			{name: "esc", typ: tar.TypeSymlink, link: "../../../../../../../../OUTSIDE"},
			{name: "esc/evil", typ: tar.TypeReg, body: "x"},
		},
		"symlink then hardlink": {
			{name: "esc", typ: tar.TypeSymlink, link: "OUTSIDE/secret"},
			{name: "h", typ: tar.TypeLink, link: "esc"},
			{name: "h", typ: tar.TypeReg, body: "x"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			outside := filepath.Join(t.TempDir(), "outside")
			os.Mkdir(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)
			for i := range ents {
				ents[i].link = strings.ReplaceAll(ents[i].link, "OUTSIDE", outside)
			}
			_, err := Import(context.Background(), "bad", makeTar(t, ents), dir, ImportOptions{})
			if _, serr := os.Stat(filepath.Join(outside, "evil")); serr == nil {
				t.Fatalf("import wrote outside its root (err %v)", err)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
				t.Fatalf("import changed a file outside its root: %q", b)
			}
			if _, serr := os.Stat(filepath.Join(dir, "..", "evil")); serr == nil {
				t.Fatal("import wrote next to the image dir")
			}
			if err == nil {
				// Some of these may legally succeed (the write stays inside);
				// then the image must exist and be complete.
				if _, lerr := Lookup(dir, "bad"); lerr != nil {
					t.Fatalf("import succeeded but Lookup: %v", lerr)
				}
				return
			}
			assertNoWork(t, dir)
		})
	}
}

// assertNoWork checks that dir holds no image and no work directory.
func assertNoWork(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".lock-") && e.Name() != storeDir {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	ents, _ = os.ReadDir(filepath.Join(dir, storeDir))
	for _, e := range ents {
		t.Errorf("left behind: %s/%s", storeDir, e.Name())
	}
}

func TestImportFailureLeavesOldImage(t *testing.T) {
	dir := t.TempDir()
	good := makeTar(t, []entry{{name: "v", typ: tar.TypeReg, body: "1"}})
	if _, err := Import(context.Background(), "x", good, dir, ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := makeTar(t, []entry{{name: "v", typ: tar.TypeReg, body: "2"}, {name: "../e", typ: tar.TypeReg}})
	if _, err := Import(context.Background(), "x", bad, dir, ImportOptions{}); err == nil {
		t.Fatal("hostile import succeeded")
	}
	img, err := Lookup(dir, "x")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(img.RootFS, "v")); string(b) != "1" {
		t.Errorf("old image changed: v = %q", b)
	}
	// A good re-import replaces it atomically and leaves no old copy.
	if _, err := Import(context.Background(), "x", makeTar(t, []entry{{name: "v", typ: tar.TypeReg, body: "3"}}), dir, ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	img2, err := Lookup(dir, "x")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(img2.RootFS, "v")); string(b) != "3" {
		t.Errorf("after replace: v = %q, want 3", b)
	}
	if _, err := os.Stat(img.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unused old version %s not deleted: %v", img.Dir, err)
	}
	if err := Remove(dir, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := Lookup(dir, "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup after Remove = %v, want ErrNotFound", err)
	}
	if err := Remove(dir, "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove = %v, want ErrNotFound", err)
	}
	assertNoWork(t, dir)
}

func TestImportCancelled(t *testing.T) {
	dir := t.TempDir()
	var ents []entry
	for i := 0; i < 600; i++ {
		ents = append(ents, entry{name: "f" + strings.Repeat("x", i%50) + string(rune('a'+i%26)), typ: tar.TypeReg, body: "x"})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Import(ctx, "c", makeTar(t, ents), dir, ImportOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Import = %v, want context.Canceled", err)
	}
	assertNoWork(t, dir)
}

func TestReplaceKeepsMountedVersion(t *testing.T) {
	needs.Root(t)
	dir := t.TempDir()
	if _, err := Import(context.Background(), "x", makeTar(t, []entry{{name: "v", typ: tar.TypeReg, body: "1"}}), dir, ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	old, err := Lookup(dir, "x")
	if err != nil {
		t.Fatal(err)
	}
	// Use the version as a sandbox would: as an overlay lower layer.
	w := t.TempDir()
	for _, d := range []string{"upper", "work", "merged"} {
		os.Mkdir(filepath.Join(w, d), 0o755)
	}
	merged := filepath.Join(w, "merged")
	opts := "lowerdir=" + old.RootFS + ",upperdir=" + filepath.Join(w, "upper") + ",workdir=" + filepath.Join(w, "work")
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(merged, unix.MNT_DETACH)
	if _, err := Import(context.Background(), "x", makeTar(t, []entry{{name: "v", typ: tar.TypeReg, body: "2"}}), dir, ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(merged, "v")); string(b) != "1" {
		t.Errorf("running sandbox sees v = %q, want its old version 1", b)
	}
	if err := Remove(dir, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old.RootFS); err != nil {
		t.Errorf("mounted version was deleted: %v", err)
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
	if err := GC(dir); err != nil {
		t.Fatal(err)
	}
	assertNoWork(t, dir)
}

// fakeKernelImage installs an image called name that has only a VM kernel
// (the files LookupVM needs), as a recipe build would leave them.
func fakeKernelImage(t *testing.T, dir, name string) {
	t.Helper()
	ver := filepath.Join(dir, storeDir, name+"@1")
	for p, body := range map[string]string{
		"image.json":            `{"name":"` + name + `","source":"recipe"}`,
		"rootfs/etc/os-release": "ID=debian\n",
		"kernel/vmlinuz":        "bzImage",
		"kernel/release":        "6.1.0-test\n",
		"kernel/modules/order":  "",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(ver, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ver, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(storeDir, name+"@1"), filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// TestImportDesktopAndKernel checks what an import of an image that knows
// nothing of cubicle records in image.json (what it has for a desktop, where
// its VM kernel came from), and that a kernel image named explicitly must
// exist.
func TestImportDesktopAndKernel(t *testing.T) {
	needs.Command(t, "mkfs.ext4")
	desktopTar := func() *bytes.Buffer {
		return makeTar(t, []entry{
			{name: "usr/bin/Xvfb", typ: tar.TypeReg, body: "elf", mode: 0o755},
			{name: "usr/bin/startxfce4", typ: tar.TypeReg, body: "sh", mode: 0o755},
			{name: "usr/bin/chromium", typ: tar.TypeReg, body: "sh", mode: 0o755},
			{name: "etc/passwd", typ: tar.TypeReg, body: "root:x:0:0::/root:/bin/sh\n", mode: 0o644},
		})
	}
	headlessTar := func() *bytes.Buffer {
		return makeTar(t, []entry{{name: "bin/sh", typ: tar.TypeReg, body: "elf", mode: 0o755}})
	}
	readMeta := func(t *testing.T, img Image) map[string]any {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(img.Dir, metaFile))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}

	t.Run("no kernel image: container backends only", func(t *testing.T) {
		dir := t.TempDir()
		img, err := Import(context.Background(), "mine", desktopTar(), dir, ImportOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"session_config": false, "x_server": "/usr/bin/Xvfb", "session": "/usr/bin/startxfce4",
			"browser": "/usr/bin/chromium", "user": "root"}
		if diff := cmp.Diff(want, readMeta(t, img)["desktop"]); diff != "" {
			t.Errorf("image.json desktop (-want +got):\n%s", diff)
		}
		if img.KernelFrom != "" {
			t.Errorf("KernelFrom = %q with no kernel image installed", img.KernelFrom)
		}
		if _, err := LookupVM(img.RootFS); !errors.Is(err, ErrNoVM) {
			t.Errorf("LookupVM = %v, want ErrNoVM", err)
		}
	})
	t.Run("the desktop image's kernel by default", func(t *testing.T) {
		dir := t.TempDir()
		fakeKernelImage(t, dir, DefaultKernelFrom)
		img, err := Import(context.Background(), "headless", headlessTar(), dir, ImportOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if img.KernelFrom != DefaultKernelFrom || readMeta(t, img)["kernel_from"] != DefaultKernelFrom {
			t.Errorf("KernelFrom = %q, image.json %v; want %q", img.KernelFrom, readMeta(t, img)["kernel_from"], DefaultKernelFrom)
		}
		vm, err := LookupVM(img.RootFS)
		if err != nil || vm.Release != "6.1.0-test" {
			t.Errorf("LookupVM = %+v, %v; want the kernel 6.1.0-test", vm, err)
		}
		if d := readMeta(t, img)["desktop"].(map[string]any); d["x_server"] != nil {
			t.Errorf("headless image recorded an X server: %v", d)
		}
	})
	t.Run("--kernel names another image", func(t *testing.T) {
		dir := t.TempDir()
		fakeKernelImage(t, dir, "kern")
		img, err := Import(context.Background(), "mine", headlessTar(), dir, ImportOptions{KernelFrom: "kern"})
		if err != nil || img.KernelFrom != "kern" {
			t.Fatalf("Import = %+v, %v; want KernelFrom kern", img, err)
		}
	})
	t.Run("--kernel of a missing image fails and leaves nothing", func(t *testing.T) {
		dir := t.TempDir()
		_, err := Import(context.Background(), "mine", headlessTar(), dir, ImportOptions{KernelFrom: "nosuch"})
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "--kernel nosuch") {
			t.Errorf("Import = %v, want ErrNotFound naming --kernel nosuch", err)
		}
		if imgs, _ := List(dir); len(imgs) != 0 {
			t.Errorf("images left: %+v", imgs)
		}
		if vers, _ := filepath.Glob(filepath.Join(dir, storeDir, "mine@*")); len(vers) != 0 {
			t.Errorf("versions left: %v", vers)
		}
	})
}
