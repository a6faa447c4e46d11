package api

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCleanPath(t *testing.T) {
	for _, c := range []struct {
		in, want string // want "" = rejected
	}{
		{"/", "/"},
		{"/root/a.txt", "/root/a.txt"},
		{"/root//a.txt", "/root/a.txt"},
		{"/root/./a.txt", "/root/a.txt"},
		{"/root/dir/", "/root/dir"},
		{"/a/..b/c..", "/a/..b/c.."},
		{"/with space/ü", "/with space/ü"},
		{"", ""},
		{"relative/a", ""},
		{"./a", ""},
		{"../etc/passwd", ""},
		{"/../etc/passwd", ""},
		{"/root/../../etc/passwd", ""},
		{"/root/a/..", ""},
		{"/root/a/../b", ""},
		{"/a\x00b", ""},
		{"/\xff", ""},
		{"/" + strings.Repeat("a", 5000), ""},
	} {
		got, err := cleanPath(c.in)
		if c.want == "" {
			if err == nil {
				t.Errorf("cleanPath(%q) = %q, want an error", c.in, got)
			} else if he := classify(err); he.status != 400 {
				t.Errorf("cleanPath(%q) error maps to %d", c.in, he.status)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("cleanPath(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestFilesRoundTrip(t *testing.T) {
	e := newTestEnv(t, Config{})
	base := "/v1/sandboxes/" + runningID + "/files"
	content := []byte("hello\x00world\xff")

	w := e.do("PUT", base+"?path="+url.QueryEscape("/root//dir/a.bin"), bytes.NewReader(content))
	got := decode[struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
	}](t, w, 200)
	if got.Path != "/root/dir/a.bin" || got.Size != int64(len(content)) {
		t.Errorf("put: %+v", got)
	}

	w = e.do("GET", base+"?path=/root/dir/a.bin", nil)
	if w.Code != 200 || !bytes.Equal(w.Body.Bytes(), content) {
		t.Errorf("get: %d %q", w.Code, w.Body.String())
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("Content-Type %q", ct)
	}

	list := decode[struct {
		Entries []fileEntry `json:"entries"`
	}](t, e.do("GET", base+"/list?path=/root/dir", nil), 200)
	want := []fileEntry{{Name: "a.bin", Path: "/root/dir/a.bin", Type: "file", Size: int64(len(content)), Mode: 0o644,
		ModifiedAt: "2025-01-02T03:04:05Z"}}
	if d := cmp.Diff(want, list.Entries); d != "" {
		t.Errorf("list (-want +got):\n%s", d)
	}
	w = e.do("GET", base+"/list?path=/", nil)
	if !strings.Contains(w.Body.String(), `"entries":[]`) {
		t.Errorf("empty list: %s", w.Body.String())
	}
	wantError(t, e.do("GET", base+"/list?path=/nonexistent", nil), 404, codeNotFound)

	w = e.do("DELETE", base+"?path=/root/dir/a.bin", nil)
	if w.Code != http.StatusNoContent {
		t.Errorf("delete: %d %s", w.Code, w.Body.String())
	}
	wantError(t, e.do("GET", base+"?path=/root/dir/a.bin", nil), 404, codeNotFound)
	wantError(t, e.do("DELETE", base+"?path=/root/dir/a.bin", nil), 404, codeNotFound)
}

func TestFilesBadInput(t *testing.T) {
	e := newTestEnv(t, Config{MaxUploadBytes: 100})
	base := "/v1/sandboxes/" + runningID + "/files"
	for _, c := range []struct {
		method, target string
	}{
		{"GET", base + "?path=../etc/passwd"},
		{"GET", base + "?path=/root/../../etc/passwd"},
		{"GET", base + "?path=" + url.QueryEscape("/../etc/shadow")},
		{"PUT", base + "?path=/tmp/../../x"},
		{"DELETE", base + "?path=/a/../.."},
		{"GET", base + "/list?path=/tmp/.."},
		{"GET", base + "?path=relative"},
		{"GET", base},
		{"GET", base + "?path=/a&path=/b"},
		{"GET", base + "?path=%00"},
		{"DELETE", base + "?path=/"},
		{"PUT", base + "?path=/"},
	} {
		wantError(t, e.do(c.method, c.target, strings.NewReader("x")), 400, codeInvalid)
	}

	// Too large, with and without a Content-Length; nothing is written.
	wantError(t, e.do("PUT", base+"?path=/big", bytes.NewReader(make([]byte, 101))), 413, codePayloadTooLarge)
	wantError(t, e.do("PUT", base+"?path=/big", io.MultiReader(bytes.NewReader(make([]byte, 150)))), 413, codePayloadTooLarge)
	if _, ok := e.agent.files["/big"]; ok {
		t.Error("an oversize upload was stored")
	}
	// Exactly the limit is fine.
	if w := e.do("PUT", base+"?path=/ok", bytes.NewReader(make([]byte, 100))); w.Code != 200 {
		t.Errorf("upload at the limit: %d %s", w.Code, w.Body.String())
	}
}
