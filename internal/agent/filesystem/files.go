package filesystem

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/cubicle-dev/cubicle/internal/agent/account"
)

// SizeHeader carries the number of bytes an upload wrote.
const SizeHeader = "X-Cubicle-Size"

// WrittenEntry is one element of the upload response, envd's EntryInfo
// REST shape.
type WrittenEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// httpError is the REST error body, the shape E2B's API uses everywhere.
type httpError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, code int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(httpError{Code: code, Message: fmt.Sprintf(format, args...)})
}

// statusOf maps a file-system error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrInvalidPath), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR):
		return http.StatusBadRequest
	case errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden
	case errors.Is(err, syscall.ENOSPC):
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}

// Files returns the handler of envd's /files endpoint: GET downloads,
// POST uploads. The user comes from the "username" query parameter, else
// Basic auth, else the default user; it owns created files and is the base
// of relative paths.
func (s *Service) Files() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("username")
		if name == "" {
			var err error
			if name, err = account.UserFromBasicAuth(r.Header.Get("Authorization")); err != nil {
				writeError(w, http.StatusUnauthorized, "%v", err)
				return
			}
		}
		acct, err := s.user(name)
		if err != nil {
			if errors.Is(err, account.ErrUnknownUser) {
				writeError(w, http.StatusBadRequest, "%v", err)
			} else {
				writeError(w, http.StatusInternalServerError, "%v", err)
			}
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			s.download(w, r, acct)
		case http.MethodPost, http.MethodPut:
			s.upload(w, r, acct)
		default:
			w.Header().Set("Allow", "GET, HEAD, POST")
			writeError(w, http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
		}
	})
}

func (s *Service) download(w http.ResponseWriter, r *http.Request, acct *account.Account) {
	p, err := Resolve(r.URL.Query().Get("path"), acct.Home)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		writeError(w, statusOf(err), "path %s: %v", p, unwrapPath(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "stat %s: %v", p, err)
		return
	}
	if fi.IsDir() {
		writeError(w, http.StatusBadRequest, "path %s is a directory", p)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": fi.Name()}))
	if fi.Mode().IsRegular() {
		http.ServeContent(w, r, "", fi.ModTime(), f) // Content-Length, ranges
		return
	}
	_, _ = io.Copy(w, f) // a device or FIFO: stream it
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func (s *Service) upload(w http.ResponseWriter, r *http.Request, acct *account.Account) {
	query := r.URL.Query().Get("path")
	var body io.Reader = r.Body
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "gzip body: %v", err)
			return
		}
		defer zr.Close()
		body = zr
	}
	var written []WrittenEntry
	var total int64
	put := func(raw string, src io.Reader) bool {
		p, err := Resolve(raw, acct.Home)
		if err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return false
		}
		n, err := WriteFile(p, src, acct)
		total += n
		if err != nil {
			writeError(w, statusOf(err), "write %s: %v", p, unwrapPath(err))
			return false
		}
		written = append(written, WrittenEntry{Path: p, Name: filepath.Base(p), Type: "file"})
		return true
	}

	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		mr, err := r.MultipartReader()
		if err != nil {
			writeError(w, http.StatusBadRequest, "multipart: %v", err)
			return
		}
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, "multipart: %v", err)
				return
			}
			if part.FormName() != "file" {
				_ = part.Close()
				continue
			}
			target := query
			if target == "" {
				target = rawFilename(part.Header.Get("Content-Disposition"))
			}
			if target == "" {
				writeError(w, http.StatusBadRequest, "multipart part has no filename and no ?path= is given")
				return
			}
			ok := put(target, part)
			_ = part.Close()
			if !ok {
				return
			}
		}
		if len(written) == 0 {
			writeError(w, http.StatusBadRequest, "multipart body has no \"file\" part")
			return
		}
	} else if !put(query, body) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(SizeHeader, strconv.FormatInt(total, 10))
	_ = json.NewEncoder(w).Encode(written)
}

// rawFilename is the filename parameter of a Content-Disposition header,
// unmodified: mime/multipart's Part.FileName keeps only the base name, but
// E2B's SDK sends the whole destination path there.
func rawFilename(cd string) string {
	_, params, err := mime.ParseMediaType(cd)
	if err != nil {
		return ""
	}
	return params["filename"]
}

// uploadTempMark marks WriteFile's temporary files, which watchers hide.
const uploadTempMark = ".cubicle-"

// WriteFile atomically replaces (or creates) the file at path with the
// contents of r: it writes a temporary file next to it, syncs it and renames
// it into place, so readers never see a half-written file. Missing parent
// directories are created. The file keeps the mode of the file it replaces
// (0644 when new) and belongs to acct. It returns the bytes written.
func WriteFile(path string, r io.Reader, acct *account.Account) (int64, error) {
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return 0, &fs.PathError{Op: "write", Path: path, Err: syscall.EISDIR}
		}
		if fi.Mode().IsRegular() {
			mode = fi.Mode().Perm()
		}
	}
	dir := filepath.Dir(path)
	if err := mkdirAll(dir, acct); err != nil {
		return 0, err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+uploadTempMark+"*")
	if err != nil {
		return 0, err
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	n, err := io.Copy(tmp, r)
	if err != nil {
		return n, err
	}
	if err := tmp.Chmod(mode); err != nil {
		return n, err
	}
	chown(tmp.Name(), acct)
	if err := tmp.Sync(); err != nil {
		return n, err
	}
	if err := tmp.Close(); err != nil {
		return n, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return n, err
	}
	done = true
	return n, nil
}
