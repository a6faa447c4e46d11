// Package image builds, imports, lists and removes sandbox images.
//
// An image is a version directory IMAGEDIR/.store/NAME@N holding image.json
// (metadata) and rootfs/ (the root filesystem, shared read-only by every
// sandbox started from it; drivers put a copy-on-write layer on top), and a
// symlink IMAGEDIR/NAME -> .store/NAME@N naming the current version. Images
// are built from a recipe (see images/desktop) with debootstrap and chroot —
// no Docker daemon needed — or imported from a `docker export` tarball.
//
// Every change is atomic: a new version is made in its own store directory
// and only a complete one is published by renaming a new symlink over NAME,
// so a failed or interrupted build leaves no half image. Lookup returns the
// resolved version path, so sandboxes keep their lower layer when the image
// is rebuilt or removed: an old version is deleted only once no mount uses
// it (see GC). Chroot steps run in a private mount namespace, so the mounts
// they need vanish with them even when the build is killed.
//
// The daemon and the CLI import this package; sandbox drivers only need the
// rootfs path from Lookup.
package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent/detect"
)

// DefaultDir is where images live unless configured otherwise.
const DefaultDir = "/var/lib/cubicle/images"

// DefaultCacheDir is where downloaded packages are cached between builds.
const DefaultCacheDir = "/var/cache/cubicle"

// metaFile is the metadata file inside an image directory.
const metaFile = "image.json"

// ErrNotFound is returned by Lookup and Remove for an unknown image.
var ErrNotFound = errors.New("image not found")

// ErrInvalidName is returned for an image name that is not
// [a-z0-9][a-z0-9._-]* (at most 64 characters).
var ErrInvalidName = errors.New("invalid image name")

// Image describes one installed image.
type Image struct {
	Name       string `json:"name"`
	Source     string `json:"source"`                // "recipe" or "import"
	RecipeHash string `json:"recipe_hash,omitempty"` // for Source "recipe"
	// KernelFrom names the image whose guest kernel an import was given
	// for VM backends ("" when it brought its own, or has none).
	KernelFrom string `json:"kernel_from,omitempty"`
	// From is the image version ("desktop-lite@3") a recipe with "from"
	// was built on.
	From      string    `json:"from,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"` // apparent size of the rootfs
	// Desktop is what the image has for a desktop session, as the agent in
	// its sandboxes will find it (see detect.Detect): without an X server
	// its sandboxes are headless.
	Desktop *detect.Found `json:"desktop,omitempty"`
	Cached  bool          `json:"-"` // Build found it up to date
	Dir     string        `json:"-"` // IMAGEDIR/NAME
	RootFS  string        `json:"-"` // IMAGEDIR/NAME/rootfs
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// ValidateName returns nil if name may be used as an image name.
func ValidateName(name string) error {
	if len(name) > 64 || !nameRE.MatchString(name) {
		return fmt.Errorf("%w %q: want [a-z0-9][a-z0-9._-]*, at most 64 characters", ErrInvalidName, name)
	}
	return nil
}

// storeDir is where image versions live, inside the image directory.
const storeDir = ".store"

// Lookup returns the installed image called name. Its RootFS is the path of
// the current version, stable for as long as a mount uses it.
func Lookup(imageDir, name string) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	dir, err := filepath.EvalSymlinks(filepath.Join(imageDir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return Image{}, err
	}
	return readImage(dir)
}

func readImage(dir string) (Image, error) {
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, fmt.Errorf("%w: %s", ErrNotFound, filepath.Base(dir))
	}
	if err != nil {
		return Image{}, err
	}
	var img Image
	if err := json.Unmarshal(data, &img); err != nil {
		return Image{}, fmt.Errorf("read %s: %w", filepath.Join(dir, metaFile), err)
	}
	img.Dir = dir
	img.RootFS = filepath.Join(dir, "rootfs")
	return img, nil
}

// List returns the installed images sorted by name. A missing imageDir is
// an empty list.
func List(imageDir string) ([]Image, error) {
	ents, err := os.ReadDir(imageDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, e := range ents {
		if ValidateName(e.Name()) != nil {
			continue // .store, .lock-*
		}
		img, err := Lookup(imageDir, e.Name())
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove unpublishes the image called name. Its files are deleted at once
// unless a sandbox still mounts them; then a later GC deletes them.
func Remove(imageDir, name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	unlock, err := lockName(imageDir, name)
	if err != nil {
		return err
	}
	defer unlock()
	link := filepath.Join(imageDir, name)
	if _, err := Lookup(imageDir, name); err != nil {
		return err
	}
	if err := os.Remove(link); err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	return gcName(imageDir, name)
}

// GC deletes the image versions in imageDir that are neither current nor
// used by a mount (an overlay lower layer of a running sandbox), and work
// directories of interrupted builds. Build, Import and Remove run it for
// their name; the daemon may run it after sandboxes stop.
func GC(imageDir string) error {
	ents, err := os.ReadDir(filepath.Join(imageDir, storeDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for _, e := range ents {
		if n, _, ok := strings.Cut(e.Name(), "@"); ok && ValidateName(n) == nil {
			names[n] = true
		}
	}
	var errs []error
	for n := range names {
		unlock, err := lockName(imageDir, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, gcName(imageDir, n))
		unlock()
	}
	return errors.Join(errs...)
}

// gcName deletes name's unused versions. The caller holds name's lock, so
// no build of name is in progress and every version but the current one is
// garbage unless mounted.
func gcName(imageDir, name string) error {
	current, _ := filepath.EvalSymlinks(filepath.Join(imageDir, name))
	vers, _ := filepath.Glob(filepath.Join(imageDir, storeDir, name+"@*"))
	var errs []error
	for _, v := range vers {
		if v == current {
			continue
		}
		used, err := inUse(v)
		if err == nil && !used && strings.HasSuffix(v, "@legacy") {
			// Mounts made before the store layout name the old path.
			used, err = inUse(filepath.Join(imageDir, name))
		}
		if err != nil || used {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, removeWork(v))
	}
	return errors.Join(errs...)
}

// inUse reports whether any mount in this mount namespace is at or below dir
// or names it in its options (an overlay's lowerdir=DIR/rootfs).
func inUse(dir string) (bool, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return true, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, dir+"/") || strings.HasSuffix(line, dir) || strings.Contains(line, dir+" ") {
			return true, nil
		}
	}
	return false, nil
}

// lockName takes an exclusive lock on IMAGEDIR/.lock-NAME so two builds,
// imports, removals or GCs of one name never interleave.
func lockName(imageDir, name string) (func(), error) {
	if err := os.MkdirAll(filepath.Join(imageDir, storeDir), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(imageDir, ".lock-"+name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock image %s: %w", name, err)
	}
	return func() { f.Close() }, nil
}

// lockNameShared takes name's lock shared, so that name is not rebuilt or
// collected meanwhile while other readers may hold it too. It gives up
// after 10 minutes (or when ctx ends) rather than wait forever: two
// recipes that extend each other would otherwise deadlock their builds.
func lockNameShared(ctx context.Context, imageDir, name string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(imageDir, ".lock-"+name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock image %s: %w (is it being built?)", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// newVersion creates the store directory for a new version of name. The
// caller holds name's lock.
func newVersion(imageDir, name string) (string, error) {
	return os.MkdirTemp(filepath.Join(imageDir, storeDir), name+"@")
}

// install writes image.json into the finished version directory ver
// (holding rootfs/) and publishes it as IMAGEDIR/NAME by renaming a new
// symlink over the old one, then deletes unused old versions.
func install(imageDir, ver string, img Image) (Image, error) {
	size, err := dirSize(filepath.Join(ver, "rootfs"))
	if err != nil {
		return Image{}, err
	}
	img.SizeBytes = size
	// Best effort: what could not be looked at (a link loop in /usr/bin)
	// is left out, as the agent will leave it out.
	found, _ := detect.Detect(filepath.Join(ver, "rootfs"))
	img.Desktop = &found
	data, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return Image{}, err
	}
	if err := os.WriteFile(filepath.Join(ver, metaFile), append(data, '\n'), 0o644); err != nil {
		return Image{}, err
	}
	if err := os.Chmod(ver, 0o755); err != nil {
		return Image{}, err
	}
	link := filepath.Join(imageDir, img.Name)
	tmpLink := filepath.Join(imageDir, ".link-"+img.Name)
	os.Remove(tmpLink)
	if err := os.Symlink(filepath.Join(storeDir, filepath.Base(ver)), tmpLink); err != nil {
		return Image{}, err
	}
	if fi, err := os.Lstat(link); err == nil && fi.IsDir() {
		// An image directory from before the store layout: move it into
		// the store so GC treats it as an old version.
		if err := os.Rename(link, filepath.Join(imageDir, storeDir, img.Name+"@legacy")); err != nil {
			os.Remove(tmpLink)
			return Image{}, err
		}
	}
	if err := os.Rename(tmpLink, link); err != nil {
		os.Remove(tmpLink)
		return Image{}, fmt.Errorf("publish image %s: %w", img.Name, err)
	}
	img.Dir = ver
	img.RootFS = filepath.Join(ver, "rootfs")
	gcName(imageDir, img.Name) // best effort: a busy old version stays for a later GC
	return img, nil
}

// dirSize sums the apparent sizes of the files under dir, counting hard
// links once.
func dirSize(dir string) (int64, error) {
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 && !fi.IsDir() {
			k := ino{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += fi.Size()
		return nil
	})
	return total, err
}
