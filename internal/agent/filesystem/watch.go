package filesystem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/cubicle-dev/cubicle/proto/filesystem"
)

// Bounds of the directory watchers of one sandbox (one agent). They are
// what README's watchDir section promises.
const (
	// MaxWatchers is how many watchers, streamed (WatchDir) and polled
	// (CreateWatcher) together, may exist at once; one more is refused
	// with ResourceExhausted. Each holds one inotify instance.
	MaxWatchers = 32
	// MaxWatchedDirs is how many directories all watchers may watch
	// together (one inotify watch each, kernel memory): a recursive watch
	// of a bigger tree is refused, and one whose tree grows past it ends
	// with ResourceExhausted.
	MaxWatchedDirs = 16384
	// MaxBufferedEvents is how many events a polled watcher holds between
	// two GetWatcherEvents. One more stops it: the next call returns the
	// events it holds, and every call after that ResourceExhausted, so a
	// client never misses events without being told.
	MaxBufferedEvents = 4096
	// WatcherIdleTimeout removes a polled watcher nobody asked for its
	// events for this long (a client that went away without
	// RemoveWatcher).
	WatcherIdleTimeout = 10 * time.Minute
)

// keepaliveHeader is the interval, in seconds, of a WatchDir stream's
// keepalive events (E2B's SDK sends 50); envd's default is 90 s.
const (
	keepaliveHeader  = "Keepalive-Ping-Interval"
	defaultKeepalive = 90 * time.Second
	maxKeepalive     = time.Hour
)

// streamBuffer is how many events a WatchDir stream holds while the client
// reads slowly; past it the reader waits, and the kernel's own queue
// (fs.inotify.max_queued_events) is the limit, whose overflow ends the
// stream with ResourceExhausted.
const streamBuffer = 64

type watchLimits struct {
	watchers int
	dirs     int64
	buffered int
	idle     time.Duration
}

var defaultWatchLimits = watchLimits{watchers: MaxWatchers, dirs: MaxWatchedDirs, buffered: MaxBufferedEvents, idle: WatcherIdleTimeout}

// watchers is a Service's registry of directory watchers.
type watchers struct {
	limits watchLimits
	budget *dirBudget

	mu     sync.Mutex
	active int                       // streamed and polled watchers
	polled map[string]*polledWatcher // by watcher id
	closed bool
}

func newWatchers(l watchLimits) *watchers {
	return &watchers{limits: l, budget: &dirBudget{limit: l.dirs}, polled: map[string]*polledWatcher{}}
}

// acquire takes a watcher slot; release gives it back.
func (r *watchers) acquire() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return connect.NewError(connect.CodeUnavailable, errors.New("the file service is shutting down"))
	}
	if r.active >= r.limits.watchers {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("too many directory watchers: %d exist, the limit; stop one (WatchHandle.stop, RemoveWatcher) first", r.active))
	}
	r.active++
	return nil
}

func (r *watchers) release() {
	r.mu.Lock()
	r.active--
	r.mu.Unlock()
}

// polledWatcher is a watcher of the polling form: events wait in a bounded
// buffer until GetWatcherEvents takes them.
type polledWatcher struct {
	id   string
	w    *dirWatcher
	idle *time.Timer   // removes the watcher when nobody polls
	done chan struct{} // closed when its reading goroutine has returned

	mu     sync.Mutex
	events []*pb.FilesystemEvent
	err    error // why it stopped; reported once events before it are taken
}

// openDir resolves a watch request's path for its user and opens a
// watcher on it, holding a slot that the returned release gives back.
func (s *Service) openDir(h interface{ Get(string) string }, path string, recursive, includeEntry bool) (*dirWatcher, func(), error) {
	p, _, err := s.path(h, path)
	if err != nil {
		return nil, nil, err
	}
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path %s not found", p))
	case err != nil:
		return nil, nil, rpcError(err)
	case !fi.IsDir():
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
	}
	if err := s.watch.acquire(); err != nil {
		return nil, nil, err
	}
	w, err := openWatcher(p, recursive, includeEntry, s.watch.budget)
	if err != nil {
		s.watch.release()
		return nil, nil, watchError(err)
	}
	return w, s.watch.release, nil
}

// watchError maps why a watcher could not start or go on.
func watchError(err error) error {
	switch {
	case errors.Is(err, errTooManyDirs), errors.Is(err, errOverflow),
		errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EMFILE), errors.Is(err, unix.ENFILE):
		return connect.NewError(connect.CodeResourceExhausted, err)
	default:
		return rpcError(err)
	}
}

func keepaliveOf(h interface{ Get(string) string }) time.Duration {
	if n, err := strconv.Atoi(h.Get(keepaliveHeader)); err == nil && n > 0 {
		return time.Duration(min(n, int(maxKeepalive/time.Second))) * time.Second
	}
	return defaultKeepalive
}

// WatchDir streams the events of a directory (and, when recursive, of
// every directory under it, those created later included): a start event
// once the watch is in place, then the events as they happen, with a
// keepalive every Keepalive-Ping-Interval seconds without one. Names are
// relative to the directory. The stream and everything it holds end with
// the request (the client's stop, disconnect or deadline); it ends by
// itself, without error, after the directory's own remove or rename event.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	w, release, err := s.openDir(req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer release()
	events := make(chan *pb.FilesystemEvent, streamBuffer)
	stop := make(chan struct{})
	var runErr error
	go func() {
		defer close(events)
		runErr = w.run(func(ev *pb.FilesystemEvent) bool {
			select {
			case events <- ev:
				return true
			case <-stop:
				return false
			}
		})
		w.release()
	}()
	defer func() {
		close(stop)
		w.Close()
		for range events { // until the reader has returned
		}
	}()

	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keepalive := keepaliveOf(req.Header())
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok { // runErr is set: close(events) came after it
				if runErr == nil || errors.Is(runErr, errRootGone) {
					return nil
				}
				s.log.Warn("directory watcher stopped", "path", w.root, "err", runErr)
				return watchError(runErr)
			}
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
			tick.Reset(keepalive)
		case <-tick.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// CreateWatcher starts a polled watcher, the non-streaming form of
// WatchDir, and returns its id. Its events wait for GetWatcherEvents (at
// most MaxBufferedEvents); it lives until RemoveWatcher, or until nobody
// has polled it for WatcherIdleTimeout.
func (s *Service) CreateWatcher(_ context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	w, _, err := s.openDir(req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	var b [10]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	pw := &polledWatcher{id: "w" + hex.EncodeToString(b[:]), w: w, done: make(chan struct{})}
	limit := s.watch.limits.buffered
	go func() {
		defer close(pw.done)
		err := w.run(func(ev *pb.FilesystemEvent) bool {
			pw.mu.Lock()
			defer pw.mu.Unlock()
			if len(pw.events) >= limit {
				pw.err = connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
					"watcher %s stopped: more than %d events waited for GetWatcherEvents, and later ones would have been lost; remove it and create another", pw.id, limit))
				return false
			}
			pw.events = append(pw.events, ev)
			return true
		})
		w.release()
		if err != nil && !errors.Is(err, errRootGone) {
			s.log.Warn("directory watcher stopped", "id", pw.id, "path", w.root, "err", err)
			pw.mu.Lock()
			if pw.err == nil {
				pw.err = watchError(err)
			}
			pw.mu.Unlock()
		}
	}()
	s.watch.mu.Lock()
	s.watch.polled[pw.id] = pw
	pw.idle = time.AfterFunc(s.watch.limits.idle, func() {
		if s.removeWatcher(pw.id) == nil {
			s.log.Info("directory watcher removed: not polled", "id", pw.id, "idle", s.watch.limits.idle)
		}
	})
	closed := s.watch.closed
	s.watch.mu.Unlock()
	if closed { // Close ran after openDir: it did not see this one
		_ = s.removeWatcher(pw.id)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the file service is shutting down"))
	}
	s.log.Debug("directory watcher created", "id", pw.id, "path", w.root, "recursive", w.recursive)
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: pw.id}), nil
}

// GetWatcherEvents returns, and forgets, the events a polled watcher has
// seen since the last call, oldest first. A watcher that stopped on an
// error returns that error once its events are taken.
func (s *Service) GetWatcherEvents(_ context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	pw, err := s.polledWatcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	pw.idle.Reset(s.watch.limits.idle)
	pw.mu.Lock()
	events, stopErr := pw.events, pw.err
	pw.events = nil
	pw.mu.Unlock()
	if len(events) == 0 && stopErr != nil {
		return nil, stopErr
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: events}), nil
}

// RemoveWatcher stops a polled watcher and frees what it holds.
func (s *Service) RemoveWatcher(_ context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	if err := s.removeWatcher(req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

func (s *Service) polledWatcher(id string) (*polledWatcher, error) {
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	pw, ok := s.watch.polled[id]
	if !ok {
		return nil, s.watcherNotFound(id)
	}
	return pw, nil
}

func (s *Service) watcherNotFound(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf(
		"watcher with id %q not found (removed, or not polled for %s)", id, s.watch.limits.idle))
}

// removeWatcher unregisters a polled watcher, closes its inotify
// instance and waits for its goroutine.
func (s *Service) removeWatcher(id string) error {
	s.watch.mu.Lock()
	pw, ok := s.watch.polled[id]
	delete(s.watch.polled, id)
	s.watch.mu.Unlock()
	if !ok {
		return s.watcherNotFound(id)
	}
	pw.idle.Stop()
	pw.w.Close()
	<-pw.done
	s.watch.release()
	return nil
}

// Close removes every polled watcher and refuses new watchers. Streamed
// watchers end with their requests. It is safe to call more than once.
func (s *Service) Close() {
	s.watch.mu.Lock()
	s.watch.closed = true
	ids := make([]string, 0, len(s.watch.polled))
	for id := range s.watch.polled {
		ids = append(ids, id)
	}
	s.watch.mu.Unlock()
	for _, id := range ids {
		_ = s.removeWatcher(id)
	}
}
