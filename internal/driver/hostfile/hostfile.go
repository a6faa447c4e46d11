// Package hostfile reads the small host files the backends keep per box:
// pid files written by runtimes and VMMs, and logs whose last lines explain
// a failed start; and what a paused box's files take, and their syncing. Drivers import it; nothing else needs to.
package hostfile

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReadPid reads a pid file: one positive decimal number.
func ReadPid(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %s: %q", path, data)
	}
	return pid, nil
}

// Tail returns the last n lines of path (looking at most at its last 64 KiB)
// headed by the file's name, or "" when there are none; for error messages.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > 64<<10 {
		if _, err := f.Seek(fi.Size()-64<<10, io.SeekStart); err != nil {
			return ""
		}
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return filepath.Base(path) + ":\n" + strings.Join(lines, "\n")
}

// DiskBytes is what the files under dir take on disk (sparse files count
// what they hold, not their length): a paused box's size.
func DiskBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// Sync fsyncs a file or directory.
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
