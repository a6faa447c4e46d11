package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FileInfo is the answer to Upload.
type FileInfo struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// File types (FileEntry.Type).
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
)

// FileEntry is one entry of a directory listing.
type FileEntry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Type is one of the FileType constants.
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	Mode       FileMode  `json:"mode"`
	ModifiedAt time.Time `json:"modified_at"`
}

// UnmarshalJSON decodes a FileEntry, taking an empty modified_at for the
// zero time.
func (e *FileEntry) UnmarshalJSON(b []byte) error {
	type plain FileEntry
	var w struct {
		*plain
		ModifiedAt optTime `json:"modified_at"`
	}
	w.plain = (*plain)(e)
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	e.ModifiedAt = time.Time(w.ModifiedAt)
	return nil
}

// FileMode is a file's Unix mode as the daemon reports it. It decodes from a
// JSON number or an octal string such as "0644".
type FileMode uint32

// Perm returns the permission bits.
func (m FileMode) Perm() uint32 { return uint32(m) & 0o7777 }

// String returns the permission bits in octal, e.g. "0644".
func (m FileMode) String() string { return fmt.Sprintf("%04o", m.Perm()) }

// UnmarshalJSON accepts a number or an octal string.
func (m *FileMode) UnmarshalJSON(b []byte) error {
	var n uint32
	if err := json.Unmarshal(b, &n); err == nil {
		*m = FileMode(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("file mode: %w", err)
	}
	if s == "" {
		*m = 0
		return nil
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	if err != nil {
		return fmt.Errorf("file mode %q: %w", s, err)
	}
	*m = FileMode(v)
	return nil
}

func fileQuery(path string) url.Values { return url.Values{"path": {path}} }

// Upload writes the bytes of r to path (absolute, inside the sandbox),
// creating parent directories, and returns the file's path and size.
//
// Upload is retried like other idempotent calls only when its body can be
// re-read: r is an io.Seeker (an *os.File, *bytes.Reader or
// *strings.Reader; it is rewound to its current offset for each attempt) or
// a *bytes.Buffer (which Upload drains at once). Any other reader is sent
// once. Upload does not close r.
func (c *Client) Upload(ctx context.Context, id, path string, r io.Reader) (FileInfo, error) {
	if err := checkID(id); err != nil {
		return FileInfo{}, err
	}
	body, n, retry, err := uploadBody(r)
	if err != nil {
		return FileInfo{}, fmt.Errorf("upload %s: %w", path, err)
	}
	var out FileInfo
	err = c.doJSON(ctx, &request{
		method: http.MethodPut, path: sandboxPath(id, "files"), query: fileQuery(path),
		body: body, contentLen: n, contentType: "application/octet-stream", retry: retry,
	}, &out)
	return out, err
}

// uploadBody returns a per-attempt body for r, its length if known, and
// whether it can be re-sent.
func uploadBody(r io.Reader) (func() (io.Reader, error), int64, bool, error) {
	switch v := r.(type) {
	case nil:
		return func() (io.Reader, error) { return http.NoBody, nil }, 0, true, nil
	case *bytes.Buffer:
		b := v.Next(v.Len())
		return func() (io.Reader, error) { return bytes.NewReader(b), nil }, int64(len(b)), true, nil
	case io.ReadSeeker:
		start, err := v.Seek(0, io.SeekCurrent)
		if err != nil {
			return onceBody(r), 0, false, nil // e.g. a pipe: not seekable after all
		}
		end, err := v.Seek(0, io.SeekEnd)
		if err != nil {
			return nil, 0, false, err
		}
		if _, err := v.Seek(start, io.SeekStart); err != nil {
			return nil, 0, false, err
		}
		size := end - start
		var prev *attemptBody
		return func() (io.Reader, error) {
			// The transport may still be reading the previous attempt's
			// body; wait until it lets go before rewinding.
			if prev != nil {
				<-prev.done
			}
			if _, err := v.Seek(start, io.SeekStart); err != nil {
				return nil, err
			}
			prev = &attemptBody{Reader: io.LimitReader(v, size), done: make(chan struct{})}
			return prev, nil
		}, size, true, nil
	default:
		return onceBody(r), 0, false, nil
	}
}

// onceBody sends r as is, hiding any Close method: the caller owns r.
func onceBody(r io.Reader) func() (io.Reader, error) {
	return func() (io.Reader, error) { return struct{ io.Reader }{r}, nil }
}

// attemptBody is one attempt's view of a seekable upload; the transport
// closes it when done with it, which also keeps it from closing the caller's
// reader.
type attemptBody struct {
	io.Reader
	once sync.Once
	done chan struct{}
}

func (b *attemptBody) Close() error {
	b.once.Do(func() { close(b.done) })
	return nil
}

// Download returns the contents of path (absolute, inside the sandbox). The
// caller must close the reader. A missing file yields an error for which
// IsNotFound is true.
func (c *Client) Download(ctx context.Context, id, path string) (io.ReadCloser, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	r := &request{method: http.MethodGet, path: sandboxPath(id, "files"), query: fileQuery(path), accept: "application/octet-stream", retry: true}
	ctx, cancel := c.withTimeout(ctx, r)
	resp, err := c.send(ctx, r)
	if err != nil {
		cancel()
		return nil, err
	}
	return &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}, nil
}

// ListFiles lists the directory path.
func (c *Client) ListFiles(ctx context.Context, id, path string) ([]FileEntry, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var out struct {
		Entries []FileEntry `json:"entries"`
	}
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: sandboxPath(id, "files", "list"), query: fileQuery(path), retry: true}, &out)
	return out.Entries, err
}

// RemoveFile deletes path inside the sandbox.
func (c *Client) RemoveFile(ctx context.Context, id, path string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return c.doJSON(ctx, &request{method: http.MethodDelete, path: sandboxPath(id, "files"), query: fileQuery(path), retry: true}, nil)
}
