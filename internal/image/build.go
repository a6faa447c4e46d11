package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build builds the image called name from the recipe in recipeFS
// (recipe.json plus files/) into IMAGEDIR/NAME and returns it.
//
// If IMAGEDIR/NAME was built from a recipe with the same hash, Build returns
// it at once with Cached set. Otherwise it runs debootstrap and apt-get in a
// chroot inside IMAGEDIR/.build-NAME-*, adds users, files, directories and
// symlinks, removes apt's caches, writes image.json and atomically replaces
// the old image. Downloaded packages are kept in CACHEDIR/debs (cacheDir ""
// means DefaultCacheDir) so a rebuild downloads only what changed; the full
// build log is CACHEDIR/build-NAME.log. Progress lines (phase and elapsed
// time) go to progress, which may be nil.
//
// On any error, including ctx being cancelled, nothing of the new image is
// left and no mount survives: every chroot step runs in its own mount
// namespace. Build needs root, debootstrap, mount and chroot on the host.
func Build(ctx context.Context, name string, recipeFS fs.FS, imageDir, cacheDir string, progress io.Writer) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	if progress == nil {
		progress = io.Discard
	}
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	r, err := LoadRecipe(recipeFS)
	if err != nil {
		return Image{}, err
	}
	hash, err := RecipeHash(recipeFS)
	if err != nil {
		return Image{}, err
	}
	var parent Image
	if r.From != "" {
		if r.From == name {
			return Image{}, fmt.Errorf("build image %s: a recipe cannot extend the image it builds", name)
		}
		// Hold the parent's version until the child is built: a build
		// of the parent (which takes its lock) would otherwise delete
		// the version cp is reading once nothing mounts it.
		unlockParent, err := lockNameShared(ctx, imageDir, r.From)
		if err != nil {
			return Image{}, fmt.Errorf("build image %s: %w", name, err)
		}
		defer unlockParent()
		if parent, err = Lookup(imageDir, r.From); err != nil {
			return Image{}, fmt.Errorf("build image %s: its recipe extends %s: %w (build or import %s first)", name, r.From, err, r.From)
		}
		// Installing packages or adding users runs the parent's own
		// programs (its /bin/sh, apt, dpkg hooks) as root in a chroot on
		// the host. That is ours to trust only for images built from a
		// recipe; an imported tarball may be anyone's.
		if parent.Source != "recipe" && (len(r.Packages) > 0 || len(r.Users) > 0) {
			return Image{}, fmt.Errorf("build image %s: %s was imported, not built from a recipe: a recipe extending it may add files but not packages or users (that would run the imported image's programs as root on this host)", name, r.From)
		}
		// A new version of the parent makes a new child: its identity
		// (version directory, and the recipe it was built from) is part
		// of the child's hash.
		hash = fromHash(hash, parent)
	}
	unlock, err := lockName(imageDir, name)
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	if img, err := Lookup(imageDir, name); err == nil && img.Source == "recipe" && img.RecipeHash == hash {
		fmt.Fprintf(progress, "image %s: cached (recipe %s)\n", name, hash[:12])
		img.Cached = true
		gcName(imageDir, name) // best effort: versions no sandbox uses any more
		return img, nil
	}
	if os.Geteuid() != 0 {
		return Image{}, fmt.Errorf("build image %s: needs root (debootstrap, chroot)", name)
	}
	for _, tool := range []string{"debootstrap", "chroot", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return Image{}, fmt.Errorf("build image %s: %s not found on PATH (apt-get install debootstrap)", name, tool)
		}
	}
	gcName(imageDir, name) // interrupted builds
	debs := filepath.Join(cacheDir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return Image{}, err
	}
	logPath := filepath.Join(cacheDir, "build-"+name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return Image{}, err
	}
	defer logf.Close()

	tmp, err := newVersion(imageDir, name)
	if err != nil {
		return Image{}, err
	}
	done := false
	defer func() {
		if !done {
			removeWork(tmp)
		}
	}()
	rootfs := filepath.Join(tmp, "rootfs")
	b := &builder{r: r, fsys: recipeFS, rootfs: rootfs, debs: debs, log: logf, logPath: logPath, ph: newPhases(progress, name)}
	defer b.ph.stop()

	type step struct {
		name string
		fn   func(context.Context) error
	}
	steps := []step{
		{"debootstrap " + r.Suite + " (" + r.Variant + ")", b.debootstrap},
		{fmt.Sprintf("install %d packages", len(r.Packages)), b.installPackages},
		{"add files", b.addFiles},
	}
	if r.From != "" {
		b.parent = &parent
		steps = []step{{"copy image " + r.From, b.copyParent}}
		if len(r.Packages) > 0 || len(r.Users) > 0 {
			steps = append(steps, step{fmt.Sprintf("install %d packages", len(r.Packages)), b.installPackages})
		}
		steps = append(steps, step{"add files", b.addFiles})
		if _, err := os.Stat(filepath.Join(parent.Dir, kernelDir, "vmlinuz")); err == nil {
			steps = append(steps, step{"vm disk (kernel of " + r.From + ")", b.vmFromParent})
		}
	} else if r.VM != nil {
		steps = append(steps, struct {
			name string
			fn   func(context.Context) error
		}{"vm disk and kernel", b.vmImage})
	}
	for _, s := range steps {
		b.ph.begin(s.name)
		if err := s.fn(ctx); err != nil {
			if ctx.Err() != nil {
				err = errors.Join(ctx.Err(), err)
			}
			return Image{}, fmt.Errorf("build image %s: %s: %w", name, s.name, err)
		}
		b.ph.end()
	}
	b.ph.begin("install image")
	from := ""
	if r.From != "" {
		from = filepath.Base(parent.Dir)
	}
	img, err := install(imageDir, tmp, Image{
		Name:       name,
		Source:     "recipe",
		RecipeHash: hash,
		From:       from,
		CreatedAt:  time.Now().UTC().Truncate(time.Second),
	})
	if err != nil {
		return Image{}, err
	}
	done = true
	b.ph.end()
	fmt.Fprintf(progress, "image %s: built in %s, %d MB\n", name, b.ph.total().Round(time.Second), img.SizeBytes>>20)
	return img, nil
}

// builder holds the state of one Build.
type builder struct {
	r       *Recipe
	fsys    fs.FS
	rootfs  string
	debs    string
	log     *os.File
	logPath string
	ph      *phases
	parent  *Image // the image a recipe with From extends
}

func (b *builder) debootstrap(ctx context.Context) error {
	return b.run(ctx, "debootstrap",
		"--variant="+b.r.Variant,
		"--components="+strings.Join(b.r.Components, ","),
		"--cache-dir="+b.debs,
		b.r.Suite, b.rootfs, b.r.Mirror)
}

// installScript runs inside the chroot.
const installScript = `set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C PATH=/usr/sbin:/usr/bin:/sbin:/bin
apt-get -o Acquire::Retries=3 update
apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold %s
%s
if command -v fc-cache >/dev/null; then fc-cache -f >/dev/null 2>&1 || true; fi
`

// hostScript runs on the host in a private mount namespace: the mounts die
// with it, whatever happens.
const hostScript = `set -eu
R="$1"; C="$2"
mount -t proc proc "$R/proc"
mkdir -p "$R/var/cache/apt/archives"
mount --bind "$C" "$R/var/cache/apt/archives"
chroot "$R" /bin/sh /tmp/cubicle-build.sh
umount "$R/var/cache/apt/archives"
chroot "$R" /bin/sh -c 'apt-get clean; rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/cache/debconf/*-old /var/log/dpkg.log /var/log/alternatives.log'
umount "$R/proc"
`

func (b *builder) installPackages(ctx context.Context) error {
	var src bytes.Buffer
	comps := strings.Join(b.r.Components, " ")
	fmt.Fprintf(&src, "deb %s %s %s\n", b.r.Mirror, b.r.Suite, comps)
	fmt.Fprintf(&src, "deb %s %s-updates %s\n", b.r.Mirror, b.r.Suite, comps)
	if b.r.Security != "none" {
		fmt.Fprintf(&src, "deb %s %s-security %s\n", b.r.Security, b.r.Suite, comps)
	}
	var kernel string
	if b.r.VM != nil && b.parent == nil {
		kernel = fmt.Sprintf(kernelScript, b.r.VM.Kernel)
	}
	var users strings.Builder
	for _, u := range b.r.Users {
		shell := u.Shell
		if shell == "" {
			shell = "/bin/sh"
		}
		fmt.Fprintf(&users, "getent group %d >/dev/null || groupadd -g %d %s\n", u.GID, u.GID, u.Name)
		fmt.Fprintf(&users, "getent passwd %s >/dev/null || useradd -m -u %d -g %d -d %s -s %s %s\n",
			u.Name, u.UID, u.GID, u.Home, shell, u.Name)
	}
	resolv, _ := os.ReadFile("/etc/resolv.conf")
	files := map[string][]byte{
		"usr/sbin/policy-rc.d":         []byte("#!/bin/sh\n# no services start while the image is built\nexit 101\n"),
		"tmp/cubicle-build.sh":         fmt.Appendf(nil, installScript, strings.Join(b.r.Packages, " "), users.String()+kernel),
		"etc/resolv.conf":              resolv,
		"etc/apt/apt.conf.d/99cubicle": []byte("APT::Install-Recommends \"false\";\nAPT::Install-Suggests \"false\";\n"),
	}
	if b.parent == nil {
		// A recipe with From keeps the sources its parent was built
		// with: it inherits the suite and mirror.
		files["etc/apt/sources.list"] = src.Bytes()
	}
	if err := writeFiles(b.rootfs, files); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(b.rootfs, "usr/sbin/policy-rc.d"), 0o755); err != nil {
		return err
	}
	if err := b.run(ctx, "/bin/sh", "-c", hostScript, "sh", b.rootfs, b.debs); err != nil { //depcheck:runs mount chroot umount
		return err
	}
	return writeFiles(b.rootfs, map[string][]byte{
		"etc/resolv.conf": []byte("# written by the sandbox's network setup\n"),
		"etc/hostname":    []byte("cubicle\n"),
		"etc/machine-id":  nil,
	})
}

// writeFiles writes each rootfs-relative path, replacing what is there (a
// symlink included) without following links out of the rootfs.
func writeFiles(rootfs string, files map[string][]byte) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	for p, data := range files {
		if err := root.MkdirAll(path.Dir(p), 0o755); err != nil {
			return err
		}
		if err := root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := root.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// addFiles copies files/ into the rootfs, applies the recipe's modes,
// creates its directories and then its links, and removes the build-only
// files.
func (b *builder) addFiles(context.Context) error {
	root, err := os.OpenRoot(b.rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, p := range []string{"usr/sbin/policy-rc.d", "tmp/cubicle-build.sh"} {
		if err := root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	for _, p := range b.r.Remove {
		if err := root.RemoveAll(strings.TrimPrefix(p, "/")); err != nil {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	if err := copyTree(root, b.r, b.fsys); err != nil {
		return err
	}
	if err := addChromium(root, b.r.Chromium); err != nil {
		return err
	}
	uids := map[string][2]int{"root": {0, 0}}
	homes := map[string]string{}
	if b.parent != nil {
		if err := imageUsers(root, uids, homes); err != nil {
			return err
		}
	}
	for _, u := range b.r.Users {
		uids[u.Name] = [2]int{u.UID, u.GID}
		homes[u.Name] = u.Home
	}
	for _, d := range b.r.Dirs {
		rel := strings.TrimPrefix(d.Path, "/")
		mode, _ := parseMode(d.Mode, 0o755)
		if err := root.MkdirAll(rel, 0o755); err != nil {
			return fmt.Errorf("dir %s: %w", d.Path, err)
		}
		if err := root.Chmod(rel, mode); err != nil {
			return err
		}
		owner := d.Owner
		if owner == "" {
			owner = "root"
		}
		id, ok := uids[owner]
		if !ok {
			return fmt.Errorf("dir %s: owner %q is neither a recipe user nor a user of image %s", d.Path, owner, b.r.From)
		}
		// Chown the path up to (not including) the owner's home, so
		// intermediate directories under the home belong to the user too.
		for p := d.Path; p != "/" && p != homes[owner]; p = path.Dir(p) {
			if err := root.Lchown(strings.TrimPrefix(p, "/"), id[0], id[1]); err != nil {
				return err
			}
			if owner == "root" {
				break
			}
		}
	}
	return makeLinks(root, b.r.Links)
}

// makeLinks makes each symlink of links (rootfs path → target) in root, in
// path order, with its missing parent directories. It replaces a symlink at
// a link path and refuses to replace anything else. Running it again
// changes nothing.
func makeLinks(root *os.Root, links map[string]string) error {
	for _, p := range slices.Sorted(maps.Keys(links)) {
		target, rel := links[p], strings.TrimPrefix(p, "/")
		fi, err := root.Lstat(rel)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
				return fmt.Errorf("link %s: %w", p, err)
			}
		case err != nil:
			return fmt.Errorf("link %s: %w", p, err)
		case fi.Mode()&fs.ModeSymlink == 0:
			return fmt.Errorf("link %s: the image already has a %s there", p, fileKind(fi.Mode()))
		default:
			if old, err := root.Readlink(rel); err == nil && old == target {
				continue
			}
			if err := root.Remove(rel); err != nil {
				return fmt.Errorf("link %s: replace: %w", p, err)
			}
		}
		if err := root.Symlink(target, rel); err != nil {
			return fmt.Errorf("link %s: %w", p, err)
		}
	}
	return nil
}

// fileKind names the type of mode for messages.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	default:
		return "special file"
	}
}

// copyTree copies the recipe's files/ tree into root. Files get the mode
// the recipe lists for them or 0644, directories 0755, all owned by root.
func copyTree(root *os.Root, r *Recipe, recipeFS fs.FS) error {
	if _, err := fs.Stat(recipeFS, "files"); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return fs.WalkDir(recipeFS, "files", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, "files"), "/")
		if rel == "" {
			return nil
		}
		switch {
		case d.IsDir():
			if err := root.MkdirAll(rel, 0o755); err != nil {
				return fmt.Errorf("mkdir /%s: %w", rel, err)
			}
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("recipe file %s: only regular files and directories are supported", p)
		}
		data, err := fs.ReadFile(recipeFS, p)
		if err != nil {
			return err
		}
		mode, _ := parseMode(r.Modes["/"+rel], 0o644)
		if err := root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("replace /%s: %w", rel, err)
		}
		if err := root.WriteFile(rel, data, 0o600); err != nil {
			return fmt.Errorf("write /%s: %w", rel, err)
		}
		if err := root.Lchown(rel, 0, 0); err != nil {
			return err
		}
		return root.Chmod(rel, mode)
	})
}

// run runs a build command on the host with its output in the build log, in
// a private mount namespace and its own process group, which is killed when
// ctx ends. Errors carry the tail of the log.
//
//depcheck:runner
func (b *builder) run(ctx context.Context, name string, args ...string) error {
	fmt.Fprintf(b.log, "\n$ %s %s\n", name, strings.Join(args, " "))
	start, _ := b.log.Seek(0, io.SeekCurrent)
	cmd := exec.CommandContext(ctx, name, args...) //depcheck:caller
	cmd.Stdout, cmd.Stderr = b.log, b.log
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive", "HOME=/root"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w\n%s(full log: %s)", name, err, logTail(b.log, start, 20), b.logPath)
	}
	return nil
}

// logTail returns the last n lines written to f since offset start.
func logTail(f *os.File, start int64, n int) string {
	end, err := f.Seek(0, io.SeekCurrent)
	if err != nil || end <= start {
		return ""
	}
	buf := make([]byte, end-start)
	if _, err := f.ReadAt(buf, start); err != nil {
		return ""
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(buf))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// removeWork removes a work or version directory, first detaching any mount
// left under it (there should be none: chroot steps run in private mount
// namespaces), so RemoveAll can never reach into a bind-mounted host
// directory.
func removeWork(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err // leave it rather than delete through a mount
	}
	return os.RemoveAll(dir)
}

// phases prints one line per build phase, and a heartbeat every 15s while a
// phase runs.
type phases struct {
	w       io.Writer
	name    string
	start   time.Time
	mu      sync.Mutex
	cur     string
	curT    time.Time
	stopc   chan struct{}
	stopped sync.Once
}

func newPhases(w io.Writer, name string) *phases {
	p := &phases{w: w, name: name, start: time.Now(), stopc: make(chan struct{})}
	go func() {
		t := time.NewTicker(15 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-p.stopc:
				return
			case <-t.C:
				p.mu.Lock()
				if p.cur != "" {
					fmt.Fprintf(p.w, "image %s: %s ... %s\n", p.name, p.cur, time.Since(p.curT).Round(time.Second))
				}
				p.mu.Unlock()
			}
		}
	}()
	return p
}

func (p *phases) begin(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur, p.curT = s, time.Now()
	fmt.Fprintf(p.w, "image %s: %s\n", p.name, s)
}

func (p *phases) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "image %s: %s done in %s\n", p.name, p.cur, time.Since(p.curT).Round(100*time.Millisecond))
	p.cur = ""
}

func (p *phases) total() time.Duration { return time.Since(p.start) }

func (p *phases) stop() { p.stopped.Do(func() { close(p.stopc) }) }
