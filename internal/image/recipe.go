package image

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// recipeFormat is mixed into every recipe hash; bump it when Build changes
// what it produces from the same recipe, so cached images are rebuilt.
const recipeFormat = "cubicle-recipe-v1"

// Recipe is the parsed recipe.json of an image recipe directory. Files to add
// to the rootfs live next to it under files/, mirroring their rootfs paths.
type Recipe struct {
	Comment string `json:"comment,omitempty"`
	// From names an installed image this recipe extends ("desktop"): the
	// build starts from a copy of its root filesystem instead of
	// debootstrap, so Suite, Variant, Mirror, Components and Security are
	// inherited and may not be given, Packages are installed on top, users
	// of the parent may own Dirs, and the VM form reuses the parent's
	// kernel. An operator's image is then a few lines on top of ours.
	From       string   `json:"from,omitempty"`
	Suite      string   `json:"suite"`      // Debian suite, e.g. "bookworm"
	Variant    string   `json:"variant"`    // debootstrap variant, e.g. "minbase"
	Mirror     string   `json:"mirror"`     // e.g. "http://deb.debian.org/debian"
	Components []string `json:"components"` // e.g. ["main"]
	// Security is the security archive; empty means
	// http://deb.debian.org/debian-security. "none" disables it.
	Security string   `json:"security,omitempty"`
	Packages []string `json:"packages"`
	Users    []User   `json:"users,omitempty"`
	Dirs     []Dir    `json:"dirs,omitempty"`
	// VM, when set, makes Build also produce the image's VM form (an ext4
	// disk and a guest kernel, see LookupVM) for the VM backends.
	VM *VMRecipe `json:"vm,omitempty"`
	// Modes maps absolute rootfs paths of files under files/ to octal modes
	// ("0755"); other files get 0644 (embedded files carry no modes).
	Modes map[string]string `json:"modes,omitempty"`
	// Links maps absolute rootfs paths of symbolic links to their targets
	// ("/opt/noVNC": "/usr/share/novnc"), made after the packages, files/
	// and dirs, so a link may point into or sit in any of them. A target is
	// resolved inside the sandbox; it may be relative to the link's
	// directory. Missing parent directories are made (0755, root). A
	// symlink already at a link path is replaced; anything else there is an
	// error, so a link never hides a file a package or files/ put there.
	// Links may not sit under /proc, /sys or /dev (the runtime mounts over
	// them) nor under another link.
	Links map[string]string `json:"links,omitempty"`
	// Remove lists absolute paths (files, links or whole directories) of
	// the parent image to delete before files/ is copied, so a recipe
	// that extends another can take out what it replaces (a stand-in
	// program, a default config). Only with From.
	Remove []string `json:"remove,omitempty"`
	// Chromium adds managed policies and launcher flags without the
	// recipe having to know the file layout Chromium and cubicle-browser
	// read. Policies of every recipe in a From chain are merged, the
	// child's keys winning.
	Chromium *ChromiumRecipe `json:"chromium,omitempty"`
}

// ChromiumRecipe is what a recipe adds to the image's Chromium.
type ChromiumRecipe struct {
	// Policies are Chromium enterprise policies (ManagedBookmarks,
	// ExtensionInstallForcelist, HomepageLocation, ...), written to
	// /etc/chromium/policies/managed/zz-recipe.json: Chromium gives the
	// file that sorts last the final say, so these override the base
	// image's cubicle.json.
	Policies map[string]json.RawMessage `json:"policies,omitempty"`
	// Flags are extra Chromium switches, one per element, appended to
	// /etc/cubicle/chromium-flags.d/recipe (read by cubicle-browser; the
	// agent's DevTools flag file sorts after it and wins).
	Flags []string `json:"flags,omitempty"`
	// Extensions are unpacked extensions in the image (absolute paths of
	// directories holding manifest.json, usually shipped under files/),
	// loaded into every Chromium the session starts (--load-extension).
	Extensions []string `json:"extensions,omitempty"`
}

// VMRecipe says how to build an image's VM form.
type VMRecipe struct {
	// Kernel is the Debian package of the guest kernel, e.g.
	// "linux-image-amd64"; it is downloaded, not installed in the rootfs.
	Kernel string `json:"kernel"`
	// FreeMB is the free space of the VM disk beyond the rootfs
	// (DefaultVMFreeMB when 0). Each VM's writes go to its own overlay.
	FreeMB int `json:"free_mb,omitempty"`
}

// User is an account the recipe adds to the image.
type User struct {
	Name  string `json:"name"`
	UID   int    `json:"uid"`
	GID   int    `json:"gid"`
	Home  string `json:"home"`
	Shell string `json:"shell,omitempty"`
}

// Dir is a directory the recipe creates in the image.
type Dir struct {
	Path  string `json:"path"`
	Mode  string `json:"mode,omitempty"`  // octal, default 0755
	Owner string `json:"owner,omitempty"` // a recipe user, default root
}

var (
	wordRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.+_-]*$`) // suites, variants, packages, users
	urlRE  = regexp.MustCompile(`^https?://[A-Za-z0-9.:/_~+-]+$`)
)

// LoadRecipe reads and validates recipe.json from recipeFS.
func LoadRecipe(recipeFS fs.FS) (*Recipe, error) {
	data, err := fs.ReadFile(recipeFS, "recipe.json")
	if err != nil {
		return nil, fmt.Errorf("read recipe: %w", err)
	}
	var r Recipe
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("parse recipe.json: %w", err)
	}
	if r.From != "" {
		if err := ValidateName(r.From); err != nil {
			return nil, fmt.Errorf("recipe.json: from: %w", err)
		}
		for field, set := range map[string]bool{"suite": r.Suite != "", "variant": r.Variant != "", "mirror": r.Mirror != "",
			"components": len(r.Components) > 0, "security": r.Security != ""} {
			if set {
				return nil, fmt.Errorf("recipe.json: %q comes from the image %s and may not be set with \"from\"", field, r.From)
			}
		}
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("recipe.json: %w", err)
		}
		return &r, nil
	}
	if len(r.Remove) > 0 {
		return nil, fmt.Errorf("recipe.json: \"remove\" needs \"from\" (there is nothing to remove from a fresh debootstrap)")
	}
	if r.Variant == "" {
		r.Variant = "minbase"
	}
	if r.Mirror == "" {
		r.Mirror = "http://deb.debian.org/debian"
	}
	if len(r.Components) == 0 {
		r.Components = []string{"main"}
	}
	if r.Security == "" {
		r.Security = "http://deb.debian.org/debian-security"
	}
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("recipe.json: %w", err)
	}
	return &r, nil
}

// validate rejects anything that would not be safe to put on a command line
// or in a shell script.
func (r *Recipe) validate() error {
	if r.From == "" {
		if !wordRE.MatchString(r.Suite) {
			return fmt.Errorf("bad suite %q", r.Suite)
		}
		if !wordRE.MatchString(r.Variant) {
			return fmt.Errorf("bad variant %q", r.Variant)
		}
		if !urlRE.MatchString(r.Mirror) {
			return fmt.Errorf("bad mirror %q", r.Mirror)
		}
		if r.Security != "none" && !urlRE.MatchString(r.Security) {
			return fmt.Errorf("bad security mirror %q", r.Security)
		}
	}
	for _, c := range r.Components {
		if !wordRE.MatchString(c) {
			return fmt.Errorf("bad component %q", c)
		}
	}
	for _, p := range r.Packages {
		if !wordRE.MatchString(p) {
			return fmt.Errorf("bad package name %q", p)
		}
	}
	if r.VM != nil && r.From != "" && r.VM.Kernel != "" {
		return fmt.Errorf("vm.kernel comes from the image %s; a recipe with \"from\" may set only vm.free_mb", r.From)
	}
	if r.VM != nil && ((r.From == "" && !wordRE.MatchString(r.VM.Kernel)) || r.VM.FreeMB < 0 || r.VM.FreeMB > 1<<20) {
		return fmt.Errorf("bad vm section %+v", *r.VM)
	}
	users := map[string]bool{"root": true}
	for _, u := range r.Users {
		if !wordRE.MatchString(u.Name) || u.UID <= 0 || u.GID <= 0 || !cleanAbs(u.Home) {
			return fmt.Errorf("bad user %+v", u)
		}
		if u.Shell != "" && !cleanAbs(u.Shell) {
			return fmt.Errorf("bad shell %q for user %s", u.Shell, u.Name)
		}
		users[u.Name] = true
	}
	for _, d := range r.Dirs {
		if !cleanAbs(d.Path) {
			return fmt.Errorf("bad dir path %q", d.Path)
		}
		if _, err := parseMode(d.Mode, 0o755); err != nil {
			return fmt.Errorf("dir %s: %w", d.Path, err)
		}
		// A recipe with From may name a user of its parent image;
		// the build resolves it in the image's /etc/passwd.
		if d.Owner != "" && !users[d.Owner] && (r.From == "" || !wordRE.MatchString(d.Owner)) {
			return fmt.Errorf("dir %s: owner %q is not a recipe user", d.Path, d.Owner)
		}
	}
	for p, m := range r.Modes {
		if !cleanAbs(p) {
			return fmt.Errorf("bad path %q in modes", p)
		}
		if _, err := parseMode(m, 0o644); err != nil {
			return fmt.Errorf("mode of %s: %w", p, err)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(r.Links)) {
		if err := validLink(p, r.Links[p], r.Links); err != nil {
			return err
		}
	}
	for _, p := range r.Remove {
		if !cleanAbs(p) || strings.ContainsAny(p, "\x00\n") {
			return fmt.Errorf("bad path %q in remove", p)
		}
		for _, f := range append([]string{"/etc/passwd", "/etc/group", "/etc/shadow", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"}, linkForbidden...) {
			if p == f {
				return fmt.Errorf("remove %s: would break the image", p)
			}
		}
	}
	if c := r.Chromium; c != nil {
		for k, v := range c.Policies {
			if !policyRE.MatchString(k) {
				return fmt.Errorf("chromium policy name %q: want a Chromium policy name (letters and digits)", k)
			}
			if !json.Valid(v) {
				return fmt.Errorf("chromium policy %s: not JSON", k)
			}
		}
		for _, f := range c.Flags {
			if !strings.HasPrefix(f, "--") || strings.ContainsAny(f, "\x00\n\r") {
				return fmt.Errorf("chromium flag %q: want one --switch[=value] per element", f)
			}
			if strings.HasPrefix(f, "--load-extension") {
				return fmt.Errorf("chromium flag %q: list unpacked extensions under \"extensions\" (Chromium reads only one --load-extension)", f)
			}
		}
		for _, e := range c.Extensions {
			if !cleanAbs(e) || strings.ContainsAny(e, ",\x00\n\r") {
				return fmt.Errorf("chromium extension %q: want the absolute path of an unpacked extension directory (no commas)", e)
			}
		}
	}
	return nil
}

// policyRE matches Chromium policy names (ManagedBookmarks, ...).
var policyRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,99}$`)

// linkForbidden lists the trees a recipe link may not sit in: the runtime
// mounts its own proc, sysfs and devices over them.
var linkForbidden = []string{"/proc", "/sys", "/dev"}

// validLink checks the link p → target of links.
func validLink(p, target string, links map[string]string) error {
	if !cleanAbs(p) {
		return fmt.Errorf("bad link path %q", p)
	}
	for _, f := range linkForbidden {
		if under(p, f) {
			return fmt.Errorf("link %s: links may not be made under %s", p, f)
		}
	}
	for q := path.Dir(p); q != "/"; q = path.Dir(q) {
		if _, ok := links[q]; ok {
			return fmt.Errorf("link %s: lies under link %s", p, q)
		}
	}
	if target == "" || path.Clean(target) != target || strings.ContainsAny(target, "\x00\n") {
		return fmt.Errorf("link %s: bad target %q", p, target)
	}
	if target == p {
		return fmt.Errorf("link %s points at itself", p)
	}
	return nil
}

// under reports whether the clean absolute path p is dir or lies under it.
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// cleanAbs reports whether p is an absolute, clean path other than "/".
func cleanAbs(p string) bool {
	return strings.HasPrefix(p, "/") && p != "/" && path.Clean(p) == p
}

func parseMode(s string, def fs.FileMode) (fs.FileMode, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("bad octal mode %q", s)
	}
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode, nil
}

// RecipeHash returns a hex SHA-256 over every file of recipeFS (paths and
// contents, in lexical order) and the recipe format version. Images are
// cached by it.
func RecipeHash(recipeFS fs.FS) (string, error) {
	h := sha256.New()
	h.Write([]byte(recipeFormat + "\x00"))
	err := fs.WalkDir(recipeFS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		data, err := fs.ReadFile(recipeFS, p)
		if err != nil {
			return err
		}
		h.Write([]byte(p + "\x00"))
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(data)))
		h.Write(n[:])
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash recipe: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
