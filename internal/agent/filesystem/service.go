// Package filesystem is the agent's file service: Connect RPC handlers for
// envd's filesystem.Filesystem (Stat, ListDir, MakeDir, Move, Remove, and
// the directory watchers: WatchDir and CreateWatcher / GetWatcherEvents /
// RemoveWatcher, on inotify), wire-compatible with E2B's envd so the E2B
// data plane is a plain forward, plus envd's REST /files upload and
// download. The file API acts as root on the sandbox's own file system:
// paths are cleaned and made absolute (from the user's home) but not
// confined. Only the agent server imports it.
package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agent/account"
	pb "github.com/cubicle-dev/cubicle/proto/filesystem"
	"github.com/cubicle-dev/cubicle/proto/filesystem/filesystemconnect"
)

// Options configure a Service.
type Options struct {
	// DefaultUser is the user of requests that name none; "" means root.
	DefaultUser string
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Service implements filesystemconnect.FilesystemHandler and, through
// Files, the /files endpoint. Close stops its polled watchers.
type Service struct {
	filesystemconnect.UnimplementedFilesystemHandler
	opts  Options
	log   *slog.Logger
	watch *watchers
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// New returns a file service.
func New(opts Options) *Service {
	if opts.DefaultUser == "" {
		opts.DefaultUser = account.Root
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Service{opts: opts, log: opts.Logger, watch: newWatchers(defaultWatchLimits)}
}

// user resolves name (from a query parameter or Basic auth), or the
// default user when name is "".
func (s *Service) user(name string) (*account.Account, error) {
	if name == "" {
		name = s.opts.DefaultUser
	}
	return account.Lookup(name)
}

func (s *Service) rpcUser(h interface{ Get(string) string }) (*account.Account, error) {
	name, err := account.UserFromBasicAuth(h.Get("Authorization"))
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	a, err := s.user(name)
	if err != nil {
		return nil, rpcError(err)
	}
	return a, nil
}

// path resolves a request path for the request's user.
func (s *Service) path(h interface{ Get(string) string }, p string) (string, *account.Account, error) {
	acct, err := s.rpcUser(h)
	if err != nil {
		return "", nil, err
	}
	abs, err := Resolve(p, acct.Home)
	if err != nil {
		return "", nil, rpcError(err)
	}
	return abs, acct, nil
}

// Stat describes a file, directory or symlink (not following it).
func (s *Service) Stat(_ context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	p, _, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := entry(p, &names{})
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

// ListDir lists a directory (following a symlink to it) down to depth
// levels; depth 0 means 1, the directory's own entries.
func (s *Service) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	p, _, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, rpcError(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, rpcError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", p))
	}
	depth := int(max(req.Msg.GetDepth(), 1))
	var out []*pb.EntryInfo
	n := &names{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		des, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, de := range des {
			full := filepath.Join(dir, de.Name())
			fi, err := de.Info()
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, entryOf(full, fi, n))
			if de.IsDir() && level < depth {
				if err := walk(full, level+1); err != nil && !errors.Is(err, fs.ErrPermission) {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(dir, 1); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.ListDirResponse{Entries: out}), nil
}

// MakeDir creates a directory and its parents, owned by the request's
// user. An existing directory is AlreadyExists, as in envd.
func (s *Service) MakeDir(_ context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	p, acct, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s exists and is not a directory", p))
	}
	if err := mkdirAll(p, acct); err != nil {
		return nil, rpcError(err)
	}
	e, err := entry(p, &names{})
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating the destination's parent
// directories.
func (s *Service) Move(_ context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	src, acct, err := s.path(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := Resolve(req.Msg.GetDestination(), acct.Home)
	if err != nil {
		return nil, rpcError(err)
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, rpcError(err)
	}
	if err := mkdirAll(filepath.Dir(dst), acct); err != nil {
		return nil, rpcError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, rpcError(err)
	}
	e, err := entry(dst, &names{})
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

// Remove removes a file or a whole directory tree. A missing path is not
// an error (envd uses os.RemoveAll).
func (s *Service) Remove(_ context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	p, _, err := s.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}
