package filesystem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	pb "github.com/cubicle-dev/cubicle/proto/filesystem"
	"github.com/cubicle-dev/cubicle/proto/filesystem/filesystemconnect"
)

// ev is an event as a test expects it: "create sub/f".
type ev string

func evOf(e *pb.FilesystemEvent) ev {
	t := strings.ToLower(strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_"))
	return ev(t + " " + e.GetName())
}

// newWatchTest serves a file service with limits l over a real HTTP
// connection, as the agent does.
func newWatchTest(t *testing.T, l watchLimits) (*Service, filesystemconnect.FilesystemClient) {
	t.Helper()
	svc := New(Options{})
	svc.watch = newWatchers(l)
	mux := http.NewServeMux()
	mux.Handle(filesystemconnect.NewFilesystemHandler(svc))
	ts := httptest.NewServer(mux)
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ts.Listener.Addr().String())
	}, "tok")
	t.Cleanup(func() {
		c.Close()
		ts.Close()
		svc.Close()
	})
	return svc, c.Filesystem
}

// watching is one WatchDir stream read by a goroutine into events.
type watching struct {
	events chan *pb.FilesystemEvent
	ended  chan error // the stream's end: nil, or its error
	cancel context.CancelFunc
}

// watchDir opens a stream and waits for its start event.
func watchDir(t *testing.T, fs filesystemconnect.FilesystemClient, req *pb.WatchDirRequest, header ...string) (*watching, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := connect.NewRequest(req)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header().Set(header[i], header[i+1])
	}
	stream, err := fs.WatchDir(ctx, r)
	if err != nil {
		cancel()
		return nil, err
	}
	if !stream.Receive() {
		cancel()
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, errors.New("stream ended before its start event")
	}
	if stream.Msg().GetStart() == nil {
		cancel()
		return nil, fmt.Errorf("first event is %v, want start", stream.Msg())
	}
	w := &watching{events: make(chan *pb.FilesystemEvent, 1024), ended: make(chan error, 1), cancel: cancel}
	go func() {
		defer stream.Close()
		for stream.Receive() {
			if e := stream.Msg().GetFilesystem(); e != nil {
				select {
				case w.events <- e:
				case <-ctx.Done():
				}
			}
		}
		w.ended <- stream.Err()
	}()
	t.Cleanup(cancel)
	return w, nil
}

// collect gathers events until one equals until (or the timeout) and
// returns them all, until included.
func collect(t *testing.T, events <-chan *pb.FilesystemEvent, until ev) []ev {
	t.Helper()
	var got []ev
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-events:
			got = append(got, evOf(e))
			if evOf(e) == until {
				return got
			}
		case <-deadline:
			t.Fatalf("no %q within 10 s; got %q", until, got)
		}
	}
}

// inOrder reports whether want is a subsequence of got.
func inOrder(got, want []ev) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestWatchDir drives a real directory and checks what a WatchDir stream
// reports, recursive and not, ending each step with a sentinel file whose
// create proves that everything before it was delivered (inotify keeps
// order), so an event that must not come is known not to have come. An
// act that must not go on before the watcher has handled what it did so
// far (added the watch of a directory it made) calls settle, which does
// the same mid-way.
func TestWatchDir(t *testing.T) {
	for _, tt := range []struct {
		name      string
		recursive bool
		setup     []string // directories made before the watch starts
		act       func(t *testing.T, dir string, settle func())
		want      []ev // in this order, others may be in between
		absent    []ev // must not be reported at all
	}{
		{
			name: "write, chmod, rename, remove",
			act: func(t *testing.T, dir string, settle func()) {
				must(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("hello"), 0o644))
				must(t, os.Chmod(filepath.Join(dir, "a.txt"), 0o600))
				must(t, os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")))
				must(t, os.Remove(filepath.Join(dir, "b.txt")))
			},
			want: []ev{"create a.txt", "write a.txt", "chmod a.txt", "rename a.txt", "create b.txt", "remove b.txt"},
		},
		{
			name: "an upload (atomic replace) is a create and a write of its path",
			act: func(t *testing.T, dir string, settle func()) {
				for _, data := range []string{"new", "replaced"} {
					if _, err := WriteFile(filepath.Join(dir, "up.txt"), strings.NewReader(data), nil); err != nil {
						t.Fatal(err)
					}
				}
			},
			want:   []ev{"create up.txt", "write up.txt", "create up.txt", "write up.txt"},
			absent: []ev{"rename up.txt"},
		},
		{
			name:  "not recursive: subdirectories' own events are not reported",
			setup: []string{"old"},
			act: func(t *testing.T, dir string, settle func()) {
				must(t, os.WriteFile(filepath.Join(dir, "old/f"), []byte("x"), 0o644))
				must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
				settle() // a recursive watch would now see sub/f
				must(t, os.WriteFile(filepath.Join(dir, "sub/f"), []byte("x"), 0o644))
				must(t, os.Remove(filepath.Join(dir, "sub/f")))
			},
			want:   []ev{"create sub"},
			absent: []ev{"create old/f", "write old/f", "create sub/f", "write sub/f", "remove sub/f"},
		},
		{
			name:      "recursive: a subdirectory that was there at the start is watched",
			recursive: true,
			setup:     []string{"old/deeper"},
			act: func(t *testing.T, dir string, settle func()) {
				must(t, os.WriteFile(filepath.Join(dir, "old/deeper/f"), []byte("x"), 0o644))
			},
			want: []ev{"create old/deeper/f", "write old/deeper/f"},
		},
		{
			name:      "recursive: a directory made after the start is watched",
			recursive: true,
			act: func(t *testing.T, dir string, settle func()) {
				must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
				// The watch on sub is added when its create is read: what
				// is made in sub before that is reported as found, but
				// its later events would be missed.
				settle()
				must(t, os.WriteFile(filepath.Join(dir, "sub/f"), []byte("x"), 0o644))
				must(t, os.Rename(filepath.Join(dir, "sub/f"), filepath.Join(dir, "sub/g")))
				must(t, os.Remove(filepath.Join(dir, "sub/g")))
			},
			want: []ev{"create sub", "create sub/f", "write sub/f", "rename sub/f", "create sub/g", "remove sub/g"},
		},
		{
			name:      "recursive: mkdir -p and a file in it at once",
			recursive: true,
			act: func(t *testing.T, dir string, settle func()) {
				// Made faster than the watcher can add watches: what it
				// finds in a new directory it reports as created.
				must(t, os.MkdirAll(filepath.Join(dir, "x/y/z"), 0o755))
				must(t, os.WriteFile(filepath.Join(dir, "x/y/z/f"), []byte("x"), 0o644))
			},
			want: []ev{"create x", "create x/y", "create x/y/z", "create x/y/z/f"},
		},
		{
			name:      "recursive: a renamed directory reports under its new name only",
			recursive: true,
			act: func(t *testing.T, dir string, settle func()) {
				must(t, os.MkdirAll(filepath.Join(dir, "d1/in"), 0o755))
				settle()
				must(t, os.Rename(filepath.Join(dir, "d1"), filepath.Join(dir, "d2")))
				settle()
				must(t, os.WriteFile(filepath.Join(dir, "d2/in/f"), []byte("x"), 0o644))
			},
			want:   []ev{"create d1", "rename d1", "create d2", "create d2/in", "create d2/in/f", "write d2/in/f"},
			absent: []ev{"create d1/in/f", "write d1/in/f"},
		},
		{
			name:      "recursive: a directory moved out is no longer watched",
			recursive: true,
			act: func(t *testing.T, dir string, settle func()) {
				must(t, os.Mkdir(filepath.Join(dir, "gone"), 0o755))
				settle()
				out := filepath.Join(t.TempDir(), "out")
				must(t, os.Rename(filepath.Join(dir, "gone"), out))
				must(t, os.WriteFile(filepath.Join(out, "f"), []byte("x"), 0o644))
			},
			want:   []ev{"create gone", "rename gone"},
			absent: []ev{"create gone/f", "write gone/f", "create f", "write f"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, fs := newWatchTest(t, defaultWatchLimits)
			dir := t.TempDir()
			for _, d := range tt.setup {
				must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
			}
			w, err := watchDir(t, fs, &pb.WatchDirRequest{Path: dir, Recursive: tt.recursive})
			if err != nil {
				t.Fatal(err)
			}
			var got []ev
			settles := 0
			settle := func() {
				t.Helper()
				settles++
				name := fmt.Sprintf("settled-%d", settles)
				must(t, os.WriteFile(filepath.Join(dir, name), nil, 0o644))
				got = append(got, collect(t, w.events, ev("create "+name))...)
			}
			tt.act(t, dir, settle)
			must(t, os.WriteFile(filepath.Join(dir, "sentinel"), nil, 0o644))
			got = append(got, collect(t, w.events, "create sentinel")...)
			if !inOrder(got, tt.want) {
				t.Errorf("events %q\ndo not include, in order, %q", got, tt.want)
			}
			for _, a := range tt.absent {
				if slices.Contains(got, a) {
					t.Errorf("events %q include %q", got, a)
				}
			}
			for _, g := range got {
				if strings.Contains(string(g), uploadTempMark) {
					t.Errorf("events %q include an upload's temporary file", got)
					break
				}
			}
		})
	}
}

// TestWatchDirEntry: with include_entry, create and write carry the
// entry (envd's EntryInfo, path included); remove carries none.
func TestWatchDirEntry(t *testing.T) {
	_, fs := newWatchTest(t, defaultWatchLimits)
	dir := t.TempDir()
	w, err := watchDir(t, fs, &pb.WatchDirRequest{Path: dir, IncludeEntry: true})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "f.txt")
	must(t, os.WriteFile(p, []byte("12345"), 0o640))
	next := func() *pb.FilesystemEvent {
		select {
		case e := <-w.events:
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10 s")
			return nil
		}
	}
	// The entry is read when the event is handled: the file stays until
	// its events are in.
	if e := next(); evOf(e) != "create f.txt" || e.Entry == nil || e.Entry.GetPath() != p || e.Entry.GetType() != pb.FileType_FILE_TYPE_FILE {
		t.Errorf("first event %v, want create f.txt with its entry", e)
	}
	if e := next(); evOf(e) != "write f.txt" || e.Entry == nil || e.Entry.GetName() != "f.txt" {
		t.Errorf("second event %v, want write f.txt with its entry", e)
	}
	must(t, os.Remove(p))
	if e := next(); evOf(e) != "remove f.txt" || e.Entry != nil {
		t.Errorf("third event %v, want remove f.txt without an entry", e)
	}
}

// TestWatchDirRootRemoved: removing the watched directory reports
// "remove ." and ends the stream without error, freeing the watcher.
func TestWatchDirRootRemoved(t *testing.T) {
	svc, fs := newWatchTest(t, defaultWatchLimits)
	dir := filepath.Join(t.TempDir(), "root")
	must(t, os.Mkdir(dir, 0o755))
	w, err := watchDir(t, fs, &pb.WatchDirRequest{Path: dir, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.Remove(dir))
	if got := collect(t, w.events, "remove ."); len(got) != 1 {
		t.Errorf("events %q, want only remove .", got)
	}
	select {
	case err := <-w.ended:
		if err != nil {
			t.Errorf("stream ended with %v, want no error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end after its directory was removed")
	}
	waitIdle(t, svc)
}

// TestWatchDirKeepalive: a quiet stream sends keepalives at the interval
// the client's Keepalive-Ping-Interval header asks for.
func TestWatchDirKeepalive(t *testing.T) {
	_, fs := newWatchTest(t, defaultWatchLimits)
	r := connect.NewRequest(&pb.WatchDirRequest{Path: t.TempDir()})
	r.Header().Set(keepaliveHeader, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := fs.WatchDir(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var kinds []string
	for len(kinds) < 3 && stream.Receive() {
		switch {
		case stream.Msg().GetStart() != nil:
			kinds = append(kinds, "start")
		case stream.Msg().GetKeepalive() != nil:
			kinds = append(kinds, "keepalive")
		default:
			kinds = append(kinds, "event")
		}
	}
	if want := []string{"start", "keepalive", "keepalive"}; !slices.Equal(kinds, want) {
		t.Errorf("stream sent %q (err %v), want %q", kinds, stream.Err(), want)
	}
}

// TestWatchErrors: what both forms answer for paths and users they cannot
// watch, as envd answers them; and nothing is left held.
func TestWatchErrors(t *testing.T) {
	svc, fs := newWatchTest(t, defaultWatchLimits)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	must(t, os.WriteFile(file, nil, 0o644))
	for _, tt := range []struct {
		name   string
		path   string
		header []string
		want   connect.Code
	}{
		{"missing path", filepath.Join(dir, "missing"), nil, connect.CodeNotFound},
		{"a file", file, nil, connect.CodeInvalidArgument},
		{"under a file", filepath.Join(file, "x"), nil, connect.CodeInvalidArgument},
		{"empty path", "", nil, connect.CodeInvalidArgument},
		{"NUL in path", dir + "\x00x", nil, connect.CodeInvalidArgument},
		{"unknown user", dir, []string{"Authorization", "Basic bm8tc3VjaC11c2VyLXh5ejo="}, connect.CodePermissionDenied},
		{"bad Basic auth", dir, []string{"Authorization", "Basic !!!"}, connect.CodeUnauthenticated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := watchDir(t, fs, &pb.WatchDirRequest{Path: tt.path}, tt.header...)
			if got := connect.CodeOf(err); got != tt.want {
				t.Errorf("WatchDir: %v (code %v), want %v", err, got, tt.want)
			}
			r := connect.NewRequest(&pb.CreateWatcherRequest{Path: tt.path})
			for i := 0; i+1 < len(tt.header); i += 2 {
				r.Header().Set(tt.header[i], tt.header[i+1])
			}
			_, err = fs.CreateWatcher(context.Background(), r)
			if got := connect.CodeOf(err); got != tt.want {
				t.Errorf("CreateWatcher: %v (code %v), want %v", err, got, tt.want)
			}
		})
	}
	for _, id := range []string{"", "wnosuchwatcher", "../x"} {
		if _, err := fs.GetWatcherEvents(context.Background(), connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("GetWatcherEvents(%q): %v, want not found", id, err)
		}
		if _, err := fs.RemoveWatcher(context.Background(), connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("RemoveWatcher(%q): %v, want not found", id, err)
		}
	}
	waitIdle(t, svc)
}

// poll calls GetWatcherEvents until an event equals until.
func poll(t *testing.T, fs filesystemconnect.FilesystemClient, id string, until ev) []ev {
	t.Helper()
	var got []ev
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		r, err := fs.GetWatcherEvents(context.Background(), connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatalf("GetWatcherEvents: %v (after %q)", err, got)
		}
		for _, e := range r.Msg.GetEvents() {
			got = append(got, evOf(e))
			if evOf(e) == until {
				return got
			}
		}
	}
	t.Fatalf("no %q within 10 s; got %q", until, got)
	return nil
}

// TestWatcherPolling: the polling form sees the same events, recursive
// included; GetWatcherEvents hands each event out once; RemoveWatcher
// ends it.
func TestWatcherPolling(t *testing.T) {
	svc, fs := newWatchTest(t, defaultWatchLimits)
	ctx := context.Background()
	dir := t.TempDir()
	cr, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Msg.GetWatcherId()
	if !strings.HasPrefix(id, "w") {
		t.Errorf("watcher id %q, want envd's w prefix", id)
	}
	must(t, os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o644))
	must(t, os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")))
	must(t, os.Remove(filepath.Join(dir, "b")))
	must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	// Once the watcher has reported a file made after sub, it has handled
	// sub's create, and watches sub.
	must(t, os.WriteFile(filepath.Join(dir, "settled"), nil, 0o644))
	got := poll(t, fs, id, "create settled")
	must(t, os.WriteFile(filepath.Join(dir, "sub/c"), []byte("x"), 0o644))
	got = append(got, poll(t, fs, id, "write sub/c")...)
	want := []ev{"create a", "write a", "rename a", "create b", "remove b", "create sub", "create settled", "create sub/c", "write sub/c"}
	if !slices.Equal(got, want) {
		t.Errorf("polled %q, want %q", got, want)
	}
	r, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil || len(r.Msg.GetEvents()) != 0 {
		t.Errorf("GetWatcherEvents again: %v, %v; want no events", r, err)
	}
	if _, err := fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetWatcherEvents after RemoveWatcher: %v, want not found", err)
	}
	waitIdle(t, svc)
}

// TestWatcherBufferFull: a polled watcher that holds its limit of unread
// events stops: the next poll returns what it holds, the one after that
// ResourceExhausted, and its inotify instance is already free.
func TestWatcherBufferFull(t *testing.T) {
	l := defaultWatchLimits
	l.buffered = 5
	svc, fs := newWatchTest(t, l)
	ctx := context.Background()
	dir := t.TempDir()
	cr, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	id := cr.Msg.GetWatcherId()
	for i := range 10 {
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), nil, 0o644))
	}
	waitFor(t, "the watcher to stop and free its inotify instance", func() bool { return inotifyFDs(t) == 0 })
	r, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil {
		t.Fatal(err)
	}
	var got []ev
	for _, e := range r.Msg.GetEvents() {
		got = append(got, evOf(e))
	}
	if want := []ev{"create 0", "create 1", "create 2", "create 3", "create 4"}; !slices.Equal(got, want) {
		t.Errorf("first poll %q, want the oldest %q", got, want)
	}
	for range 2 {
		_, err = fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "more than 5 events") {
			t.Errorf("poll after the buffer filled: %v, want resource_exhausted naming the limit", err)
		}
	}
	if _, err := fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, svc)
}

// TestWatcherLimits: the watcher count and the directory budget refuse
// with ResourceExhausted, and a refused request holds nothing.
func TestWatcherLimits(t *testing.T) {
	t.Run("watchers", func(t *testing.T) {
		l := defaultWatchLimits
		l.watchers = 2
		svc, fs := newWatchTest(t, l)
		ctx := context.Background()
		dir := t.TempDir()
		w1, err := watchDir(t, fs, &pb.WatchDirRequest{Path: dir})
		if err != nil {
			t.Fatal(err)
		}
		cr, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := watchDir(t, fs, &pb.WatchDirRequest{Path: dir}); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Errorf("third watcher (stream): %v, want resource_exhausted", err)
		}
		if _, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir})); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Errorf("third watcher (polled): %v, want resource_exhausted", err)
		}
		w1.cancel() // a stopped stream gives its slot back
		waitFor(t, "the stream's slot back", func() bool {
			_, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir}))
			return err == nil
		})
		_, _ = fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: cr.Msg.GetWatcherId()}))
		svc.Close()
		waitIdle(t, svc)
	})
	t.Run("directories", func(t *testing.T) {
		l := defaultWatchLimits
		l.dirs = 3
		svc, fs := newWatchTest(t, l)
		big := t.TempDir()
		must(t, os.MkdirAll(filepath.Join(big, "a/b/c"), 0o755))
		_, err := watchDir(t, fs, &pb.WatchDirRequest{Path: big, Recursive: true})
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "3 directories") {
			t.Errorf("recursive watch of 4 directories with a budget of 3: %v, want resource_exhausted naming the limit", err)
		}
		waitIdle(t, svc) // the refused watch gave back the directories it had taken
		small := t.TempDir()
		must(t, os.Mkdir(filepath.Join(small, "a"), 0o755))
		w, err := watchDir(t, fs, &pb.WatchDirRequest{Path: small, Recursive: true})
		if err != nil {
			t.Fatal(err)
		}
		must(t, os.MkdirAll(filepath.Join(small, "a/b/c"), 0o755))
		select {
		case err := <-w.ended:
			if connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Errorf("stream whose tree outgrew the budget ended with %v, want resource_exhausted", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the stream whose tree outgrew the budget did not end")
		}
		waitIdle(t, svc)
	})
}

// TestWatcherIdle: a polled watcher nobody polls is removed after the idle
// timeout, freeing its inotify instance; one that is polled stays.
func TestWatcherIdle(t *testing.T) {
	l := defaultWatchLimits
	l.idle = 300 * time.Millisecond
	svc, fs := newWatchTest(t, l)
	ctx := context.Background()
	dir := t.TempDir()
	idle, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	busy, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	for range 8 { // 800 ms, polled every 100 ms
		time.Sleep(100 * time.Millisecond)
		if _, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: busy.Msg.GetWatcherId()})); err != nil {
			t.Fatalf("the polled watcher: %v", err)
		}
	}
	_, err = fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: idle.Msg.GetWatcherId()}))
	if connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "not polled for 300ms") {
		t.Errorf("unpolled watcher after its idle timeout: %v, want not found saying why", err)
	}
	if n := inotifyFDs(t); n != 1 {
		t.Errorf("%d inotify instances open, want 1 (the polled watcher's)", n)
	}
	svc.Close()
	waitIdle(t, svc)
}

// TestWatchNoLeaks ends watchers every way they can end and checks that
// each inotify fd and goroutine is gone, and that the slots and the
// directory budget are all given back.
func TestWatchNoLeaks(t *testing.T) {
	svc, fs := newWatchTest(t, defaultWatchLimits)
	ctx := context.Background()
	baseFDs, baseG := inotifyFDs(t), watchGoroutines()
	if baseFDs != 0 || baseG != 0 {
		t.Fatalf("before: %d inotify fds, %d watcher goroutines", baseFDs, baseG)
	}
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "a/b"), 0o755))
	for round := range 3 {
		// Streams the client stops, one whose client reads nothing, one
		// whose directory is removed, polled watchers removed, abandoned,
		// and left to Close.
		var streams []*watching
		for range 3 {
			w, err := watchDir(t, fs, &pb.WatchDirRequest{Path: dir, Recursive: true})
			must(t, err)
			streams = append(streams, w)
		}
		// A client that reads nothing after the start event.
		sctx, stopSilent := context.WithCancel(ctx)
		silent, err := fs.WatchDir(sctx, connect.NewRequest(&pb.WatchDirRequest{Path: dir, Recursive: true}))
		must(t, err)
		if !silent.Receive() {
			t.Fatal(silent.Err())
		}
		doomed := filepath.Join(dir, fmt.Sprint("doomed", round))
		must(t, os.Mkdir(doomed, 0o755))
		wd, err := watchDir(t, fs, &pb.WatchDirRequest{Path: doomed})
		must(t, err)
		for i := range 2000 {
			must(t, os.WriteFile(filepath.Join(dir, "a/b", fmt.Sprint(i)), nil, 0o644))
		}
		must(t, os.Remove(doomed))
		<-wd.ended
		var ids []string
		for range 3 {
			cr, err := fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir, Recursive: true}))
			must(t, err)
			ids = append(ids, cr.Msg.GetWatcherId())
		}
		if n := inotifyFDs(t); n != 7 {
			t.Errorf("round %d: %d inotify fds with 7 watchers", round, n)
		}
		for i := range 100 { // events the polled watchers hold when they end
			must(t, os.WriteFile(filepath.Join(dir, "a", fmt.Sprint(i)), nil, 0o644))
		}
		for _, w := range streams {
			w.cancel()
		}
		stopSilent()
		silent.Close()
		_, err = fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: ids[0]}))
		must(t, err)
		// ids[1] is abandoned: its idle timer fires now (TestWatcherIdle
		// times a real one). ids[2] is polled, then removed (or, in the
		// last round, left to Close).
		svc.watch.mu.Lock()
		svc.watch.polled[ids[1]].idle.Reset(time.Millisecond)
		svc.watch.mu.Unlock()
		_, err = fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: ids[2]}))
		must(t, err)
		waitFor(t, "the abandoned watcher's removal", func() bool { // a poll would reset its timer
			svc.watch.mu.Lock()
			defer svc.watch.mu.Unlock()
			return svc.watch.polled[ids[1]] == nil
		})
		if _, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: ids[1]})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("abandoned watcher: %v, want not found", err)
		}
		if round == 2 {
			svc.Close()
		} else {
			_, err = fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: ids[2]}))
			must(t, err)
		}
		waitIdle(t, svc)
	}
}

// waitIdle waits until svc holds no watcher, no watched directory, no
// inotify fd and no watcher goroutine.
func waitIdle(t *testing.T, svc *Service) {
	t.Helper()
	var fds, gs, active int
	var dirs int64
	ok := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		svc.watch.mu.Lock()
		active = svc.watch.active + len(svc.watch.polled)
		svc.watch.mu.Unlock()
		fds, gs, dirs = inotifyFDs(t), watchGoroutines(), svc.watch.budget.used.Load()
		if fds == 0 && gs == 0 && active == 0 && dirs == 0 {
			ok = true
			break
		}
	}
	if !ok {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("leak: %d inotify fds, %d watcher goroutines, %d watchers, %d watched directories remain\n%s", fds, gs, active, dirs, buf)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// inotifyFDs counts the process's open inotify instances.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, de := range des {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", de.Name())); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// watchGoroutines counts goroutines in the watchers' code: readers, and
// WatchDir handlers.
func watchGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "filesystem.(*dirWatcher).run") || strings.Contains(g, "filesystem.(*Service).WatchDir") {
			n++
		}
	}
	return n
}
