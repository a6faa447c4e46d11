package web

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strings"
	"time"
)

// staticPrefix is where Static answers.
const staticPrefix = "/static/"

// novncEntry is the module the viewer imports; its presence is what makes a
// directory "noVNC installed".
const novncEntry = "core/rfb.js"

// novncCacheControl lets browsers keep noVNC's files for an hour: they change
// only when the daemon is rebuilt, and the viewer imports some fifty of them.
const novncCacheControl = "public, max-age=3600"

// installHint is how an operator installs noVNC.
const installHint = "install it with `make deps` (or `npm ci --prefix web`)"

// NoVNCError reports why the live view cannot load its VNC client, or nil
// when noVNC is installed. The answer is current: it looks at the directory
// each time.
func (w *Web) NoVNCError() error {
	root, err := w.openNoVNC()
	if err != nil {
		return err
	}
	root.Close()
	return nil
}

// openNoVNC opens the noVNC directory after checking that it holds noVNC.
func (w *Web) openNoVNC() (*os.Root, error) {
	if w.novncDir == "" {
		return nil, fmt.Errorf("noVNC is not installed (no noVNC directory is configured); %s", installHint)
	}
	root, err := os.OpenRoot(w.novncDir)
	if err == nil {
		var fi os.FileInfo
		if fi, err = root.Stat(novncEntry); err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
		if err != nil {
			root.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("noVNC is not installed (%s: %w); %s",
			path.Join(w.novncDir, novncEntry), err, installHint)
	}
	return root, nil
}

// Static returns the handler of GET /static/...: the embedded scripts and
// styles of the pages, and under /static/novnc/ the core/ and vendor/ files
// of the installed noVNC. It expects the full request path (mount it at
// "/static/" without stripping the prefix). It lists no directories, serves
// no HTML (pages go through ServeViewer, ServeDashboard and ServeError) and
// refuses any path with an empty, "." or ".." segment, a hidden name or a
// backslash, whatever its encoding.
func (w *Web) Static() http.Handler {
	return http.HandlerFunc(w.serveStatic)
}

func (w *Web) serveStatic(rw http.ResponseWriter, r *http.Request) {
	h := rw.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(rw, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, staticPrefix)
	if !ok || !cleanPath(name) {
		http.NotFound(rw, r)
		return
	}
	if rest, ok := strings.CutPrefix(name, "novnc/"); ok {
		w.serveNoVNC(rw, r, rest)
		return
	}
	f, ok := w.files[name]
	if !ok {
		http.NotFound(rw, r)
		return
	}
	// no-cache, not no-store: the browser keeps the file but asks each
	// time, so a new daemon build is picked up at once and an unchanged
	// file costs a 304.
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", f.etag)
	h.Set("Content-Type", f.contentType)
	http.ServeContent(rw, r, name, time.Time{}, bytes.NewReader(f.body))
}

// serveNoVNC serves name, a clean path relative to the noVNC directory.
func (w *Web) serveNoVNC(rw http.ResponseWriter, r *http.Request, name string) {
	root, err := w.openNoVNC()
	if err != nil {
		rw.Header().Set("Cache-Control", "no-store")
		http.Error(rw, "The live view's VNC client (noVNC) is not installed on this daemon: "+
			installHint+" and reload the page.", http.StatusServiceUnavailable)
		return
	}
	defer root.Close()
	// Only noVNC's modules: nothing it ships (HTML, SVG) can be served as a
	// document outside the pages' security policy.
	top, _, _ := strings.Cut(name, "/")
	if (top != "core" && top != "vendor") || top == name || path.Ext(name) != ".js" {
		http.NotFound(rw, r)
		return
	}
	// os.Root confines the lookup to the directory even through symlinks,
	// on top of cleanPath's refusal of "..": a link pointing out fails here.
	f, err := root.Open(name)
	if err != nil {
		http.NotFound(rw, r)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.NotFound(rw, r)
		return
	}
	rw.Header().Set("Cache-Control", novncCacheControl)
	rw.Header().Set("Content-Type", contentType(name))
	http.ServeContent(rw, r, name, fi.ModTime(), f)
}

// cleanPath reports whether name (a slash-separated path below /static/) is
// one Static may look up: no empty, "." or ".." segments, no leading or
// trailing slash, no hidden names, no backslashes or NULs. Request paths
// arrive percent-decoded, so "%2e%2e" and "..%2f" are caught here as "..".
func cleanPath(name string) bool {
	if !fs.ValidPath(name) || name == "." || strings.ContainsAny(name, "\\\x00") {
		return false
	}
	for _, seg := range strings.Split(name, "/") {
		if strings.HasPrefix(seg, ".") {
			return false
		}
	}
	return true
}

// contentType is the Content-Type of a served file. It is a fixed table, not
// mime.TypeByExtension, whose answers depend on the host's mime.types (some
// map .js to application/x-javascript).
func contentType(name string) string {
	switch path.Ext(name) {
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".html":
		return "text/html; charset=utf-8"
	case ".json", ".map":
		return "application/json"
	case ".svg":
		return "image/svg+xml"
	case ".png":
		return "image/png"
	case ".ico":
		return "image/x-icon"
	case ".wasm":
		return "application/wasm"
	case ".txt", ".md":
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}
