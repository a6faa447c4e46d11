package filesystem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	pb "github.com/cubicle-dev/cubicle/proto/filesystem"
)

// inotify is used directly through golang.org/x/sys/unix rather than
// github.com/fsnotify/fsnotify: fsnotify does not expose recursive
// watches on Linux, so the tree bookkeeping would be ours either way, and
// owning the read loop is what lets a watcher's one goroutine and one fd
// be accounted for and freed exactly (no hidden goroutine or channel).

// watchMask is what every directory watch asks the kernel for: the events
// envd reports (create, write, remove, rename, chmod) on the directory's
// entries and on the directory itself.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE |
	unix.IN_DELETE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_MOVE_SELF

// inotifyHeader is the size of struct inotify_event before its name.
const inotifyHeader = unix.SizeofInotifyEvent

// readBufSize holds at least one event with the longest name (NAME_MAX
// 255 plus its NUL), and usually a few hundred.
const readBufSize = 16 << 10

var (
	// errShortEvent means a read of the inotify fd ended inside an event.
	errShortEvent = errors.New("inotify: truncated event")
	// errBadName means an event's name is not one directory entry's name.
	errBadName = errors.New("inotify: malformed name")
	// errOverflow is the kernel saying that its event queue overflowed:
	// events were lost, so the watcher cannot go on truthfully.
	errOverflow = errors.New("inotify event queue overflowed (events were lost): the directory changes faster than the watcher is read")
	// errTooManyDirs means the watchers' directory budget is spent.
	errTooManyDirs = errors.New("too many directories watched")
	// errRootGone ends a watcher whose directory was removed or moved away:
	// nothing under its path can be reported any more.
	errRootGone = errors.New("the watched directory was removed or moved")
)

// inotifyEvent is one struct inotify_event.
type inotifyEvent struct {
	wd     int32
	mask   uint32
	cookie uint32
	name   string // "" for an event on the watched directory itself
}

// parseInotify calls fn for each event in buf, the bytes of one read of an
// inotify fd, in order. It fails on a truncated event or a name that is not
// a single path element (the kernel sends neither; the checks keep a bad
// buffer from turning into a path outside the watched tree).
func parseInotify(buf []byte, fn func(inotifyEvent) error) error {
	for len(buf) > 0 {
		if len(buf) < inotifyHeader {
			return fmt.Errorf("%w: %d bytes left", errShortEvent, len(buf))
		}
		ev := inotifyEvent{
			wd:     int32(binary.NativeEndian.Uint32(buf[0:4])),
			mask:   binary.NativeEndian.Uint32(buf[4:8]),
			cookie: binary.NativeEndian.Uint32(buf[8:12]),
		}
		n := binary.NativeEndian.Uint32(buf[12:16])
		if uint64(n) > uint64(len(buf)-inotifyHeader) {
			return fmt.Errorf("%w: name of %d bytes, %d left", errShortEvent, n, len(buf)-inotifyHeader)
		}
		raw := buf[inotifyHeader : inotifyHeader+int(n)]
		if i := bytes.IndexByte(raw, 0); i >= 0 {
			raw = raw[:i] // the name is NUL-padded
		}
		ev.name = string(raw)
		if ev.name == "." || ev.name == ".." || strings.IndexByte(ev.name, '/') >= 0 {
			return fmt.Errorf("%w: %q", errBadName, ev.name)
		}
		if err := fn(ev); err != nil {
			return err
		}
		buf = buf[inotifyHeader+int(n):]
	}
	return nil
}

// dirBudget is how many directories all of a service's watchers may watch
// together (each is one inotify watch, kernel memory in the sandbox).
type dirBudget struct {
	used  atomic.Int64
	limit int64
}

func (b *dirBudget) take() bool {
	if b.used.Add(1) > b.limit {
		b.used.Add(-1)
		return false
	}
	return true
}

func (b *dirBudget) give(n int) { b.used.Add(int64(-n)) }

// dirWatcher watches one directory, or a whole tree, with its own inotify
// instance and turns what the kernel reports into envd's events. Only the
// goroutine that calls run touches its maps after open returns; Close may
// be called from anywhere.
type dirWatcher struct {
	root         string // as the request named it (after Resolve)
	recursive    bool
	includeEntry bool

	fd     int
	file   *os.File // owns fd; closing it ends a Read in run
	once   sync.Once
	budget *dirBudget

	wds    map[int32]string // watch descriptor → directory path
	paths  map[string]int32 // directory path → watch descriptor
	rootWd int32
	names  names

	// uploads are the rename cookies of WriteFile's temporary files, the
	// last few (a rename's two halves are almost always adjacent).
	uploads     [8]uint32
	uploadsNext int
}

// isUploadTemp reports whether name is one of WriteFile's temporary files
// (os.CreateTemp's "." + base + ".cubicle-" + digits).
func isUploadTemp(name string) bool {
	i := strings.LastIndex(name, uploadTempMark)
	if !strings.HasPrefix(name, ".") || i < 1 || i+len(uploadTempMark) == len(name) {
		return false
	}
	for _, c := range name[i+len(uploadTempMark):] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func (w *dirWatcher) takeUpload(cookie uint32) bool {
	if cookie == 0 {
		return false
	}
	for i, c := range w.uploads {
		if c == cookie {
			w.uploads[i] = 0
			return true
		}
	}
	return false
}

// openWatcher starts watching root (a directory; a symlink to one is
// followed) and, when recursive, every directory under it (symlinks are
// not followed). It fails with errTooManyDirs when the tree needs more
// directories than budget has left.
func openWatcher(root string, recursive, includeEntry bool, budget *dirBudget) (*dirWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	w := &dirWatcher{
		root: root, recursive: recursive, includeEntry: includeEntry,
		fd: fd, file: os.NewFile(uintptr(fd), "inotify"), budget: budget,
		wds: map[int32]string{}, paths: map[string]int32{},
	}
	// The root follows a symlink, as envd's os.Stat check and
	// inotify_add_watch do; IN_ONLYDIR refuses a file put there since.
	wd, err := w.addWatch(root, unix.IN_ONLYDIR)
	if err == nil {
		w.rootWd = wd
		if recursive {
			err = w.addChildren(root, nil)
		}
	}
	if err != nil {
		w.release()
		return nil, err
	}
	return w, nil
}

// addWatch watches dir, taking one directory from the budget.
func (w *dirWatcher) addWatch(dir string, flags uint32) (int32, error) {
	if !w.budget.take() {
		return 0, fmt.Errorf("%w: the sandbox's watchers may watch %d directories together", errTooManyDirs, w.budget.limit)
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask|flags)
	if err != nil {
		w.budget.give(1)
		if errors.Is(err, unix.ENOSPC) {
			return 0, fmt.Errorf("watch %s: %w (the kernel's fs.inotify.max_user_watches is reached)", dir, err)
		}
		return 0, &fs.PathError{Op: "watch", Path: dir, Err: err}
	}
	wd32 := int32(wd)
	if old, ok := w.wds[wd32]; ok {
		// The same directory under another name (the kernel watches
		// inodes): keep one watch, known by its latest path.
		w.budget.give(1)
		delete(w.paths, old)
	}
	w.wds[wd32] = dir
	w.paths[dir] = wd32
	return wd32, nil
}

// addChildren watches the directories under dir, depth first. With emit,
// it also reports every entry it finds as created: they appeared with a
// directory created or moved into the tree, before its watch existed
// (mkdir -p a/b/c; a moved-in tree), as envd reports them. A directory
// that vanishes meanwhile is skipped.
func (w *dirWatcher) addChildren(dir string, emit func(*pb.FilesystemEvent) bool) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrPermission) {
			return nil
		}
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, de := range des {
		full := join(dir, de.Name())
		if emit != nil && !emit(w.event(full, pb.EventType_EVENT_TYPE_CREATE)) {
			return errStopped
		}
		if !de.IsDir() {
			continue
		}
		if _, err := w.addWatch(full, unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW); err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrPermission) {
				continue
			}
			return err
		}
		if err := w.addChildren(full, emit); err != nil {
			return err
		}
	}
	return nil
}

// errStopped is emit saying that nobody wants more events.
var errStopped = errors.New("watcher stopped")

// forget drops the watches of dir and everything under it (a directory
// moved out of its place: its watches would report under a stale path).
func (w *dirWatcher) forget(dir string) {
	for p, wd := range w.paths {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.paths, p)
			delete(w.wds, wd)
			w.budget.give(1)
		}
	}
}

// rel is path's name relative to the watched root, "." for the root.
func (w *dirWatcher) rel(path string) string {
	if path == w.root {
		return "."
	}
	if w.root == "/" {
		return path[1:]
	}
	return strings.TrimPrefix(path, w.root+"/")
}

func join(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

// event builds one envd event for path; with includeEntry, the kinds that
// describe an entry that exists (create, write, chmod) carry it when it
// can still be read, as envd does (best effort: it may be gone already).
func (w *dirWatcher) event(path string, t pb.EventType) *pb.FilesystemEvent {
	ev := &pb.FilesystemEvent{Name: w.rel(path), Type: t}
	if w.includeEntry && (t == pb.EventType_EVENT_TYPE_CREATE || t == pb.EventType_EVENT_TYPE_WRITE || t == pb.EventType_EVENT_TYPE_CHMOD) {
		if e, err := entry(path, &w.names); err == nil {
			ev.Entry = e
		}
	}
	return ev
}

// run reads the kernel's events and calls emit with envd's, until Close
// (nil), until emit returns false (nil), or until the watcher cannot go
// on: errRootGone after the root's own remove or rename event, or an
// error (overflow, directory budget, a failed read).
func (w *dirWatcher) run(emit func(*pb.FilesystemEvent) bool) error {
	buf := make([]byte, readBufSize)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read inotify events: %w", err)
		}
		err = parseInotify(buf[:n], func(ev inotifyEvent) error { return w.handle(ev, emit) })
		switch {
		case errors.Is(err, errStopped):
			return nil
		case err != nil:
			return err
		}
	}
}

// handle turns one kernel event into envd's, keeping the tree's watches
// up to date. Operation order within one event is envd's: create,
// rename, chmod, write, remove.
func (w *dirWatcher) handle(ev inotifyEvent, emit func(*pb.FilesystemEvent) bool) error {
	if ev.mask&unix.IN_Q_OVERFLOW != 0 {
		return errOverflow
	}
	dir, ok := w.wds[ev.wd]
	if !ok {
		return nil // a watch already dropped (forget) still had events queued
	}
	if ev.mask&(unix.IN_IGNORED|unix.IN_UNMOUNT) != 0 {
		// The watch is gone (its directory was deleted or unmounted).
		delete(w.wds, ev.wd)
		if w.paths[dir] == ev.wd {
			delete(w.paths, dir)
		}
		w.budget.give(1)
		if ev.wd == w.rootWd {
			return errRootGone
		}
		return nil
	}
	self := ev.name == ""
	if self && ev.wd != w.rootWd {
		// A subdirectory's own events are also its parent's, which
		// reports them (once) under the subdirectory's name.
		return nil
	}
	path := dir
	if !self {
		path = join(dir, ev.name)
	}
	isDir := ev.mask&unix.IN_ISDIR != 0
	send := func(t pb.EventType) error {
		if !emit(w.event(path, t)) {
			return errStopped
		}
		return nil
	}
	// An upload (/files, the SDKs' files.write) writes a temporary file
	// and renames it over the path; envd writes in place. Report it as
	// envd reports a new file's write, and the temporary file not at all.
	if !self && !isDir && isUploadTemp(ev.name) {
		if ev.mask&unix.IN_MOVED_FROM != 0 && ev.cookie != 0 {
			w.uploads[w.uploadsNext] = ev.cookie
			w.uploadsNext = (w.uploadsNext + 1) % len(w.uploads)
		}
		return nil
	}
	if ev.mask&unix.IN_MOVED_TO != 0 && !isDir && w.takeUpload(ev.cookie) {
		if err := send(pb.EventType_EVENT_TYPE_CREATE); err != nil {
			return err
		}
		return send(pb.EventType_EVENT_TYPE_WRITE)
	}
	if ev.mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		if err := send(pb.EventType_EVENT_TYPE_CREATE); err != nil {
			return err
		}
		if w.recursive && isDir {
			// Watch first, then list: an entry made in between is
			// reported twice rather than not at all.
			if _, err := w.addWatch(path, unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW); err != nil {
				if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
					return err
				}
			} else if err := w.addChildren(path, emit); err != nil {
				return err
			}
		}
	}
	if ev.mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0 {
		if err := send(pb.EventType_EVENT_TYPE_RENAME); err != nil {
			return err
		}
		if w.recursive && isDir && !self {
			w.forget(path)
		}
	}
	if ev.mask&unix.IN_ATTRIB != 0 {
		if err := send(pb.EventType_EVENT_TYPE_CHMOD); err != nil {
			return err
		}
	}
	if ev.mask&unix.IN_MODIFY != 0 {
		if err := send(pb.EventType_EVENT_TYPE_WRITE); err != nil {
			return err
		}
	}
	if ev.mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0 {
		if err := send(pb.EventType_EVENT_TYPE_REMOVE); err != nil {
			return err
		}
	}
	if self && ev.mask&unix.IN_MOVE_SELF != 0 {
		// The root moved: its watches go on under a path that no longer
		// names it, so stop (a deleted root stops with IN_IGNORED).
		return errRootGone
	}
	return nil
}

// Close stops run and frees the inotify instance. It is safe to call more
// than once and from any goroutine.
func (w *dirWatcher) Close() {
	w.once.Do(func() { _ = w.file.Close() })
}

// release closes the fd and gives back the budget of the watches still
// held; called once, by the goroutine that owns the maps, when it is done.
func (w *dirWatcher) release() {
	w.Close()
	w.budget.give(len(w.wds))
	clear(w.wds)
	clear(w.paths)
}
