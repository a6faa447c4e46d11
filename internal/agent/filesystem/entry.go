package filesystem

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cubicle-dev/cubicle/internal/agent/account"
	pb "github.com/cubicle-dev/cubicle/proto/filesystem"
)

// ErrInvalidPath means a path is empty or holds a NUL byte.
var ErrInvalidPath = errors.New("invalid path")

// Resolve turns a request path into a clean absolute path: absolute paths
// are kept, "~" and "~/x" and relative paths are taken from home.
func Resolve(p, home string) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("%w %q", ErrInvalidPath, p)
	}
	switch {
	case p == "~":
		p = home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(home, p)
	}
	return filepath.Clean(p), nil
}

// names caches uid/gid → name lookups for one request.
type names struct {
	users, groups map[uint32]string
}

func (n *names) user(id uint32) string {
	if n.users == nil {
		n.users = map[uint32]string{}
	}
	if s, ok := n.users[id]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(id), 10)
	if u, err := user.LookupId(s); err == nil {
		s = u.Username
	}
	n.users[id] = s
	return s
}

func (n *names) group(id uint32) string {
	if n.groups == nil {
		n.groups = map[uint32]string{}
	}
	if s, ok := n.groups[id]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(id), 10)
	if g, err := user.LookupGroupId(s); err == nil {
		s = g.Name
	}
	n.groups[id] = s
	return s
}

// entry describes path (not following a final symlink).
func entry(path string, n *names) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return entryOf(path, fi, n), nil
}

func entryOf(path string, fi fs.FileInfo, n *names) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name:         fi.Name(),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if path == "/" {
		e.Name = "/"
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			target, _ = os.Readlink(path) // dangling: report the raw target
		}
		e.SymlinkTarget = &target
	case fi.IsDir():
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
	default:
		e.Type = pb.FileType_FILE_TYPE_FILE
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = n.user(st.Uid)
		e.Group = n.group(st.Gid)
	}
	return e
}

// rpcError maps a file-system error to a Connect error.
func rpcError(err error) error {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, ErrInvalidPath), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, account.ErrUnknownUser):
		return connect.NewError(connect.CodePermissionDenied, err)
	default:
		return connect.NewError(connect.CodeInternal, err)
	}
}

// mkdirAll creates dir and its missing parents, giving each directory it
// creates to acct (root's mkdir -p would leave them owned by root).
func mkdirAll(dir string, acct *account.Account) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(parent, acct); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	chown(dir, acct)
	return nil
}

// chown gives path to acct. Failure is ignored: an agent not running as
// root (tests) cannot chown, and the file is still usable.
func chown(path string, acct *account.Account) {
	if acct == nil || os.Geteuid() != 0 {
		return
	}
	_ = os.Lchown(path, int(acct.UID), int(acct.GID))
}
