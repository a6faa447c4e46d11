// Package account resolves the sandbox user an agent request acts as: the
// HTTP Basic "Authorization: Basic base64(user:)" header E2B's SDK sends to
// pick a user, and that user's uid, gid, groups and home from the sandbox's
// own /etc/passwd and /etc/group (os/user in pure-Go mode, so the agent stays
// CGO_ENABLED=0). Only the agent's packages import it.
package account

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Root is the default user of the agent, as in envd.
const Root = "root"

// ErrUnknownUser means the named user does not exist in the sandbox.
var ErrUnknownUser = errors.New("unknown user")

// Account is a resolved sandbox user.
type Account struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, including GID
	Home   string
}

// Lookup resolves name. Numeric names are not accepted: E2B always sends
// user names.
func Lookup(name string) (*Account, error) {
	if name == "" {
		name = Root
	}
	u, err := user.Lookup(name)
	if err != nil {
		var unk user.UnknownUserError
		if errors.As(err, &unk) {
			return nil, fmt.Errorf("%w %q", ErrUnknownUser, name)
		}
		return nil, fmt.Errorf("look up user %q: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: bad uid %q", name, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: bad gid %q", name, u.Gid)
	}
	a := &Account{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if a.Home == "" {
		a.Home = "/"
	}
	ids, err := u.GroupIds()
	if err != nil {
		ids = nil // no /etc/group is not fatal: the primary group still applies
	}
	a.Groups = append(a.Groups, a.GID)
	for _, s := range ids {
		g, err := strconv.ParseUint(s, 10, 32)
		if err == nil && uint32(g) != a.GID {
			a.Groups = append(a.Groups, uint32(g))
		}
	}
	return a, nil
}

// Credential is the credential to start a child as this account, or nil
// when the child should simply inherit the agent's own identity (it is
// already this user; setting groups would need privileges we may lack).
func (a *Account) Credential() *syscall.Credential {
	if a.UID == uint32(os.Getuid()) && a.GID == uint32(os.Getgid()) {
		return nil
	}
	return &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: a.Groups}
}

// KeepDumpable makes the agent dumpable again once it has started a child
// as another user (call it after the ForkExec returns: the child has
// exec'd by then). Go forks with CLONE_VM|CLONE_VFORK, so until its exec
// the child shares the agent's memory, and its setuid lowers that
// memory's dumpability (Linux's commit_creds and gVisor's both do). An
// undumpable agent is one whose /proc/1/* even root in the sandbox cannot
// open: /proc/1/fd/1, the console E2B's sandbox logs are read from,
// among them.
func KeepDumpable() { _ = unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0) }

// Env is the user part of a child's environment: HOME, USER and LOGNAME.
func (a *Account) Env() []string {
	return []string{"HOME=" + a.Home, "USER=" + a.Name, "LOGNAME=" + a.Name}
}

// UserFromBasicAuth returns the user name of an "Authorization: Basic ..."
// header value; the password part is ignored (E2B sends "user:"). An empty
// header yields "", nil. Anything else that is not well-formed Basic auth
// is an error.
func UserFromBasicAuth(header string) (string, error) {
	if header == "" {
		return "", nil
	}
	scheme, rest, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", errors.New("authorization: not Basic")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return "", fmt.Errorf("authorization: %w", err)
	}
	name, _, _ := strings.Cut(string(raw), ":")
	if !validName(name) {
		return "", fmt.Errorf("authorization: invalid user name %q", name)
	}
	return name, nil
}

// validName accepts the portable POSIX user-name set plus what Debian's
// adduser allows; notably no NUL, '/', ':' or whitespace.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '_' || c == '-' || c == '.' || (c == '$' && i == len(s)-1):
		default:
			return false
		}
	}
	return true
}
