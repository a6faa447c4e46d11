package filesystem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/needs"
	pb "github.com/cubicle-dev/cubicle/proto/filesystem"
	"github.com/cubicle-dev/cubicle/proto/filesystem/filesystemconnect"
)

func newTest(t *testing.T) (*agentclient.Client, string) {
	t.Helper()
	svc := New(Options{})
	mux := http.NewServeMux()
	mux.Handle(filesystemconnect.NewFilesystemHandler(svc))
	mux.Handle("/files", svc.Files())
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ts.Listener.Addr().String())
	}, "tok")
	t.Cleanup(c.Close)
	return c, t.TempDir()
}

func TestFileRPCs(t *testing.T) {
	c, dir := newTest(t)
	ctx := context.Background()
	fs := c.Filesystem

	// MakeDir with parents, then again: AlreadyExists.
	mk, err := fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: filepath.Join(dir, "a/b/c")}))
	if err != nil {
		t.Fatal(err)
	}
	if e := mk.Msg.GetEntry(); e.GetType() != pb.FileType_FILE_TYPE_DIRECTORY || e.GetName() != "c" || e.GetPermissions() != "drwxr-xr-x" {
		t.Errorf("MakeDir entry = %v", e)
	}
	if _, err := fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: filepath.Join(dir, "a/b/c")})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("MakeDir twice: %v, want already exists", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a/f.txt"), []byte("hello"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f.txt", filepath.Join(dir, "a/link")); err != nil {
		t.Fatal(err)
	}

	st, err := fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: filepath.Join(dir, "a/f.txt")}))
	if err != nil {
		t.Fatal(err)
	}
	e := st.Msg.GetEntry()
	if e.GetType() != pb.FileType_FILE_TYPE_FILE || e.GetSize() != 5 || e.GetMode() != 0o640 || e.GetPermissions() != "-rw-r-----" ||
		e.GetOwner() == "" || e.GetGroup() == "" || e.GetModifiedTime() == nil || e.GetPath() != filepath.Join(dir, "a/f.txt") {
		t.Errorf("Stat = %v", e)
	}
	st, err = fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: filepath.Join(dir, "a/link")}))
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Msg.GetEntry(); e.GetType() != pb.FileType_FILE_TYPE_SYMLINK || e.GetSymlinkTarget() != filepath.Join(dir, "a/f.txt") {
		t.Errorf("Stat symlink = %v", e)
	}
	if _, err := fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: filepath.Join(dir, "missing")})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Stat missing: %v", err)
	}
	if _, err := fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: ""})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("Stat empty: %v", err)
	}

	for _, tt := range []struct {
		depth uint32
		want  []string
	}{
		{0, []string{"a/b", "a/f.txt", "a/link"}},
		{1, []string{"a/b", "a/f.txt", "a/link"}},
		{2, []string{"a/b", "a/b/c", "a/f.txt", "a/link"}},
	} {
		ls, err := fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: filepath.Join(dir, "a"), Depth: tt.depth}))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range ls.Msg.GetEntries() {
			rel, _ := filepath.Rel(dir, e.GetPath())
			got = append(got, rel)
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("ListDir depth %d = %v, want %v", tt.depth, got, tt.want)
		}
	}
	if _, err := fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: filepath.Join(dir, "a/f.txt")})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("ListDir on a file: %v", err)
	}

	mv, err := fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: filepath.Join(dir, "a/f.txt"), Destination: filepath.Join(dir, "x/y/g.txt")}))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.GetEntry().GetName() != "g.txt" {
		t.Errorf("Move entry = %v", mv.Msg.GetEntry())
	}
	if _, err := fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: filepath.Join(dir, "nope"), Destination: filepath.Join(dir, "n2")})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Move missing: %v", err)
	}

	if _, err := fs.Remove(ctx, connect.NewRequest(&pb.RemoveRequest{Path: filepath.Join(dir, "a")})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a still exists: %v", err)
	}
	if _, err := fs.Remove(ctx, connect.NewRequest(&pb.RemoveRequest{Path: filepath.Join(dir, "a")})); err != nil {
		t.Errorf("Remove missing: %v", err)
	}
}

// TestOwnership checks that ?username= owns the file and the directories
// the upload creates.
func TestOwnership(t *testing.T) {
	needs.Root(t)
	c, dir := newTest(t)
	p := filepath.Join(dir, "own/sub/f")
	req, _ := http.NewRequest(http.MethodPost, "http://agent/files?username=nobody&path="+p, strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, q := range []string{p, filepath.Dir(p), filepath.Join(dir, "own")} {
		fi, err := os.Stat(q)
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
			t.Errorf("%s owned by %d, want nobody", q, uid)
		}
	}
	if fi, _ := os.Stat(dir); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("existing parent changed owner")
	}
}

func TestUploadDownload(t *testing.T) {
	c, dir := newTest(t)
	ctx := context.Background()
	payload := bytes.Repeat([]byte("0123456789"), 100_000)
	p := filepath.Join(dir, "new/dir/file.bin")

	n, err := c.Upload(ctx, p, bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len(payload)) {
		t.Errorf("Upload = %d bytes, want %d", n, len(payload))
	}
	body, size, err := c.Download(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(body)
	body.Close()
	if !bytes.Equal(got, payload) || size != int64(len(payload)) {
		t.Errorf("Download: %d bytes (size %d), want %d", len(got), size, len(payload))
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode = %v, want 0644", fi.Mode())
	}
	// Overwrite keeps no temp files around.
	if _, err := c.Upload(ctx, p, strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 1 {
		t.Errorf("dir holds %d entries, want 1", len(ents))
	}
	body, size, err = c.Download(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	body.Close()
	if size != 0 {
		t.Errorf("empty file size = %d", size)
	}

	var se *agentclient.StatusError
	_, _, err = c.Download(ctx, filepath.Join(dir, "missing"))
	if !errors.As(err, &se) || se.Code != http.StatusNotFound {
		t.Fatalf("Download missing: %v, want 404", err)
	}
	// The client reads the message out of the agent's {"code", "message"}.
	if !strings.HasSuffix(se.Message, "/missing: no such file or directory") {
		t.Errorf("404 message = %q", se.Message)
	}
	_, _, err = c.Download(ctx, dir)
	if !errors.As(err, &se) || se.Code != http.StatusBadRequest {
		t.Errorf("Download dir: %v, want 400", err)
	}
	if _, err := c.Upload(ctx, dir, strings.NewReader("x")); !errors.As(err, &se) || se.Code != http.StatusBadRequest {
		t.Errorf("Upload onto a dir: %v, want 400", err)
	}
	if _, err := c.Upload(ctx, "", strings.NewReader("x")); !errors.As(err, &se) || se.Code != http.StatusBadRequest {
		t.Errorf("Upload empty path: %v, want 400", err)
	}
}

// TestMultipart uploads the way E2B's SDK does: field "file" whose filename
// is the whole destination path, several files in one request.
func TestMultipart(t *testing.T) {
	c, dir := newTest(t)
	tests := []struct {
		name  string
		query string
		files map[string]string // filename → content
		want  map[string]string // path → content
	}{
		{"filename is the path", "", map[string]string{dir + "/m/one.txt": "1", dir + "/m/two.txt": "22"},
			map[string]string{dir + "/m/one.txt": "1", dir + "/m/two.txt": "22"}},
		{"query path wins", dir + "/q.txt", map[string]string{"ignored.txt": "qq"}, map[string]string{dir + "/q.txt": "qq"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			mw := multipart.NewWriter(&buf)
			names := slices.Sorted(func(yield func(string) bool) {
				for k := range tt.files {
					if !yield(k) {
						return
					}
				}
			})
			total := 0
			for _, name := range names {
				w, err := mw.CreateFormFile("file", name)
				if err != nil {
					t.Fatal(err)
				}
				io.WriteString(w, tt.files[name])
				total += len(tt.files[name])
			}
			mw.Close()
			url := "http://agent/files"
			if tt.query != "" {
				url += "?path=" + tt.query
			}
			req, _ := http.NewRequest(http.MethodPost, url, &buf)
			req.Header.Set("Content-Type", mw.FormDataContentType())
			resp, err := c.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got []WrittenEntry
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
				t.Fatalf("status %d, decode %v", resp.StatusCode, err)
			}
			if len(got) != len(tt.want) || got[0].Type != "file" {
				t.Errorf("response = %+v", got)
			}
			if resp.Header.Get(SizeHeader) != strings.TrimSpace(itoa(total)) {
				t.Errorf("size header = %q, want %d", resp.Header.Get(SizeHeader), total)
			}
			for p, want := range tt.want {
				b, err := os.ReadFile(p)
				if err != nil || string(b) != want {
					t.Errorf("%s = %q, %v; want %q", p, b, err, want)
				}
			}
		})
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestResolve(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{"/a/b/../c", "/a/c", false},
		{"rel/x", "/home/u/rel/x", false},
		{"~", "/home/u", false},
		{"~/d", "/home/u/d", false},
		{"../../etc", "/etc", false},
		{"", "", true},
		{"a\x00b", "", true},
	}
	for _, tt := range tests {
		got, err := Resolve(tt.in, "/home/u")
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func FuzzResolve(f *testing.F) {
	for _, s := range []string{"/a", "rel", "~", "~/x", "../..", "a//b/./c", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := Resolve(p, "/home/u")
		if err != nil {
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("Resolve(%q) = %q: not clean and absolute", p, got)
		}
	})
}

func TestRawFilename(t *testing.T) {
	if got := rawFilename(`form-data; name="file"; filename="/home/user/a b.txt"`); got != "/home/user/a b.txt" {
		t.Errorf("rawFilename = %q", got)
	}
}
