package process

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/agent/account"
)

// DefaultPath is the PATH children get when the agent itself has none
// (a container's PID 1 may start with an empty environment).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// envList is an environment being built: later Set calls override earlier
// ones but keep the first position, so the result is stable.
type envList struct {
	keys []string
	vals map[string]string
}

func (e *envList) set(k, v string) {
	if e.vals == nil {
		e.vals = make(map[string]string)
	}
	if _, ok := e.vals[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.vals[k] = v
}

func (e *envList) has(k string) bool { _, ok := e.vals[k]; return ok }

func (e *envList) list() []string {
	out := make([]string, 0, len(e.keys))
	for _, k := range e.keys {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

// userKeys are variables that describe the target user; the agent's own
// values (the container runtime sets HOME=/root) must not override them.
var userKeys = map[string]bool{"HOME": true, "USER": true, "LOGNAME": true}

// BuildEnv returns a child's environment in envd's order: PATH, the user's
// HOME/USER/LOGNAME, the sandbox defaults (minus the user variables), DISPLAY
// when the defaults lack it, then extra (e.g. TERM for a PTY) and finally the
// request's own variables, each overriding what came before.
func BuildEnv(acct *account.Account, defaults []string, display string, extra, request map[string]string) []string {
	var e envList
	e.set("PATH", DefaultPath)
	for _, kv := range acct.Env() {
		k, v, _ := strings.Cut(kv, "=")
		e.set(k, v)
	}
	for _, kv := range defaults {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || userKeys[k] {
			continue
		}
		e.set(k, v)
	}
	if display != "" && !e.has("DISPLAY") {
		e.set("DISPLAY", display)
	}
	for k, v := range extra {
		if !e.has(k) {
			e.set(k, v)
		}
	}
	for k, v := range request {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			continue
		}
		e.set(k, v)
	}
	return e.list()
}

func getenv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// ErrNotFound means an executable was not found in PATH.
var ErrNotFound = errors.New("executable file not found in $PATH")

// LookPath finds file the way a shell would with the child's PATH (not the
// agent's): names with a slash are taken as is, relative to dir.
func LookPath(file, path, dir string) (string, error) {
	if strings.Contains(file, "/") {
		if !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		if err := executable(file); err != nil {
			return "", err
		}
		return file, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, file)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", ErrNotFound
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fs.ErrPermission
	}
	return nil
}
