package api

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/proto/filesystem"
)

// maxPathBytes bounds a file path (Linux PATH_MAX).
const maxPathBytes = 4096

// cleanPath validates a path inside a sandbox and returns it cleaned. It
// must be absolute, valid UTF-8 without NUL and must not contain a ".."
// component: such paths are rejected rather than resolved, so that a
// request can never be read as an escape attempt that happened to work.
func cleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", invalidf("path is required")
	case len(p) > maxPathBytes:
		return "", invalidf("path is longer than %d bytes", maxPathBytes)
	case strings.IndexByte(p, 0) >= 0:
		return "", invalidf("path contains a NUL byte")
	case !utf8.ValidString(p):
		return "", invalidf("path is not valid UTF-8")
	case !strings.HasPrefix(p, "/"):
		return "", invalidf("path must be absolute")
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." {
			return "", invalidf(`path must not contain ".." components`)
		}
	}
	return path.Clean(p), nil
}

// queryPath returns the validated ?path= of r.
func queryPath(r *http.Request) (string, error) {
	vs := r.URL.Query()["path"]
	if len(vs) > 1 {
		return "", invalidf("path given %d times", len(vs))
	}
	if len(vs) == 0 {
		return cleanPath("")
	}
	return cleanPath(vs[0])
}

// countingReader counts the bytes read through it and remembers whether
// the size limit cut the body off.
type countingReader struct {
	r       io.Reader
	n       int64
	tooBig  bool
	readErr error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			c.tooBig = true
		}
		c.readErr = err
	}
	return n, err
}

func (s *server) putFile(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if p == "/" {
		s.writeError(w, r, invalidf("path must name a file"))
		return
	}
	limit := s.cfg.MaxUploadBytes
	if r.ContentLength > limit {
		s.writeError(w, r, &http.MaxBytesError{Limit: limit})
		return
	}
	ac, err := s.mgr.Agent(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body := &countingReader{r: http.MaxBytesReader(w, r.Body, limit)}
	n, err := ac.Upload(r.Context(), p, body)
	switch {
	case body.tooBig:
		s.writeError(w, r, &http.MaxBytesError{Limit: limit})
		return
	case err != nil && body.readErr != nil:
		// The client's body broke off; the agent's error only echoes that.
		s.writeError(w, r, invalidf("could not read the request body"))
		return
	case err != nil:
		s.writeError(w, r, err)
		return
	}
	if n == 0 {
		n = body.n
	}
	writeJSON(w, http.StatusOK, struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
	}{p, n})
}

func (s *server) getFile(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ac, err := s.mgr.Agent(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rc, size, err := ac.Download(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	if name := path.Base(p); name != "/" {
		h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	}
	if size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// The status is sent; all that is left is to cut the body short.
		s.log.WarnContext(r.Context(), "file download broke off", "sandbox", id, "err", err)
	}
}

func (s *server) deleteFile(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if p == "/" {
		s.writeError(w, r, invalidf("refusing to remove /"))
		return
	}
	ac, err := s.mgr.Agent(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, err := ac.Filesystem.Remove(r.Context(), connect.NewRequest(&filesystem.RemoveRequest{Path: p})); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fileEntry is one entry of GET .../files/list.
type fileEntry struct {
	Name          string `json:"name"`
	Path          string `json:"path"`
	Type          string `json:"type"`
	Size          int64  `json:"size"`
	Mode          uint32 `json:"mode"`
	ModifiedAt    string `json:"modified_at,omitempty"`
	SymlinkTarget string `json:"symlink_target,omitempty"`
}

// fileTypes names the agent's file types; others are "other".
var fileTypes = map[filesystem.FileType]string{
	filesystem.FileType_FILE_TYPE_FILE:      "file",
	filesystem.FileType_FILE_TYPE_DIRECTORY: "dir",
	filesystem.FileType_FILE_TYPE_SYMLINK:   "symlink",
}

func (s *server) listFiles(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := queryPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ac, err := s.mgr.Agent(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	resp, err := ac.Filesystem.ListDir(r.Context(), connect.NewRequest(&filesystem.ListDirRequest{Path: p, Depth: 1}))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	entries := make([]fileEntry, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		typ, ok := fileTypes[e.GetType()]
		if !ok {
			typ = "other"
		}
		fe := fileEntry{
			Name: e.GetName(), Path: e.GetPath(), Type: typ,
			Size: e.GetSize(), Mode: e.GetMode(), SymlinkTarget: e.GetSymlinkTarget(),
		}
		if t := e.GetModifiedTime(); t != nil {
			fe.ModifiedAt = t.AsTime().UTC().Format(time.RFC3339)
		}
		entries = append(entries, fe)
	}
	writeJSON(w, http.StatusOK, struct {
		Entries []fileEntry `json:"entries"`
	}{entries})
}
