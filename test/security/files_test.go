package security

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// A file-API escape is a request through a sandbox's file API (the native
// one or E2B's envd /files and Filesystem RPCs) that reads, writes,
// deletes or lists a file of the host. The test plants canaries on the
// host, each with random contents, where an escape would land: in the
// host's /tmp, next to the sandbox's bind-mounted run directory, and
// beside its rootfs (what ".." above the sandbox's root would reach if the
// path were resolved on the host). At the path where each request resolves
// inside the sandbox it plants a decoy with other random contents, and
// symlinks in the sandbox to / (absolute and relative), to /proc/1/root
// and to the canary's path itself. Then every request that names a canary
// must resolve inside the sandbox (answer the decoy, write or delete the
// decoy) or be refused with a 4xx; no answer may contain a canary's
// contents or a host-only file's name, and every canary and host-only
// file must be unchanged at the end.

// links is the sandbox directory of the test's symlinks. It is on the
// sandbox's root filesystem (not a tmpfs like /tmp), so that the links are
// also files on the host, in the overlay under the sandbox's state
// directory: what a daemon resolving paths on the host would follow.
const links = "/var/tmp/cubicle-links"

// canary is a host file and where requests aimed at it resolve in the sandbox.
type canary struct {
	name    string
	host    string // the host file
	content []byte // its random contents
	inside  string // the sandbox path the requests resolve to, with a decoy
	// paths are request paths aimed at the host file that must resolve
	// inside the sandbox: plain paths and paths through symlinks.
	paths []string
	// refusable are request paths that may instead be refused with a 4xx:
	// paths with ".." (the native API refuses those) and paths through
	// /proc, whose links gVisor resolves its own way.
	refusable []string
	mtime     time.Time
}

// door is one file API of a sandbox.
type door struct {
	name string
	id   string // the sandbox it acts on
	// read, write, remove and list send one request each and return the
	// status and body of the answer.
	read   func(path string) (int, []byte)
	write  func(path string, data []byte) (int, []byte)
	remove func(path string) (int, []byte)
	list   func(path string) (int, []byte, []string)
}

func randomText(t *testing.T, what string) []byte {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return []byte(what + " " + hex.EncodeToString(b))
}

// nativeDoor is the native API's file routes.
func (e *env) nativeDoor(id string) door {
	q := func(p string) string { return "?path=" + url.QueryEscape(p) }
	base := "/v1/sandboxes/" + id + "/files"
	return door{
		name: "native API", id: id,
		read: func(p string) (int, []byte) {
			a := e.raw("GET", base+q(p), nil, "X-API-Key", e.key)
			return a.code, a.body
		},
		write: func(p string, data []byte) (int, []byte) {
			a := e.raw("PUT", base+q(p), data, "X-API-Key", e.key, "Content-Type", "application/octet-stream")
			return a.code, a.body
		},
		remove: func(p string) (int, []byte) {
			a := e.raw("DELETE", base+q(p), nil, "X-API-Key", e.key)
			return a.code, a.body
		},
		list: func(p string) (int, []byte, []string) {
			a := e.raw("GET", base+"/list"+q(p), nil, "X-API-Key", e.key)
			var out struct{ Entries []struct{ Name string } }
			_ = json.Unmarshal(a.body, &out)
			var names []string
			for _, en := range out.Entries {
				names = append(names, en.Name)
			}
			return a.code, a.body, names
		},
	}
}

// e2bDoor is E2B's data plane (envd's /files and Filesystem RPCs) on the
// sandbox made through E2B's API, as root.
func (e *env) e2bDoor() door {
	hdr := []string{"E2b-Sandbox-Id", e.other, "E2b-Sandbox-Port", "49983", "X-Access-Token", e.token,
		"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("root:"))}
	q := func(p string) string { return "?username=root&path=" + url.QueryEscape(p) }
	rpc := func(method string, body any) answer {
		b, _ := json.Marshal(body)
		return e.raw("POST", "/filesystem.Filesystem/"+method, b, append(hdr, "Content-Type", "application/json")...)
	}
	return door{
		name: "E2B envd", id: e.other,
		read: func(p string) (int, []byte) {
			a := e.raw("GET", "/files"+q(p), nil, hdr...)
			return a.code, a.body
		},
		write: func(p string, data []byte) (int, []byte) {
			a := e.raw("POST", "/files"+q(p), data, append(hdr, "Content-Type", "application/octet-stream")...)
			return a.code, a.body
		},
		remove: func(p string) (int, []byte) {
			a := rpc("Remove", map[string]string{"path": p})
			return a.code, a.body
		},
		list: func(p string) (int, []byte, []string) {
			a := rpc("ListDir", map[string]any{"path": p, "depth": 1})
			var out struct{ Entries []struct{ Name string } }
			_ = json.Unmarshal(a.body, &out)
			var names []string
			for _, en := range out.Entries {
				names = append(names, en.Name)
			}
			return a.code, a.body, names
		},
	}
}

// raw sends one request with a byte body; headers are name, value pairs.
func (e *env) raw(method, path string, body []byte, headers ...string) answer {
	e.t.Helper()
	req, err := http.NewRequest(method, e.d.URL+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return answer{code: resp.StatusCode, body: b, hdr: resp.Header}
}

// sh runs a shell command in sandbox id as root and returns its stdout.
func (e *env) sh(t *testing.T, id, cmd string) string {
	t.Helper()
	res, err := e.c.Exec(t.Context(), id, client.ExecRequest{Command: cmd, User: "root"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("in %s: %s: %+v %v", id, cmd, res, err)
	}
	return res.Stdout
}

// shQuote quotes s for sh.
func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// canaries plants the host canaries aimed at sandbox id (whose host-side
// state directory is sbDir) and their decoys inside it, and makes the
// sandbox's symlinks.
func (e *env) canaries(t *testing.T, id, sbDir string) []*canary {
	t.Helper()
	tag := hex.EncodeToString(randomText(t, "")[1:5])
	hostDir := filepath.Join(os.TempDir(), "cubicle-security-canary-"+tag)
	beside := filepath.Join(sbDir, "canary-"+tag)                   // a sibling of run/, mounted at /run/cubicle
	aboveRoot := filepath.Join(sbDir, "bundle", "canary-root-"+tag) // a sibling of bundle/rootfs
	hostFile := filepath.Join(hostDir, "secret")
	base, rootBase := filepath.Base(beside), filepath.Base(aboveRoot)
	cs := []*canary{
		// (gVisor 20221219 ends a path walk at a link to "/": for the
		// sandbox's own processes too, links/root/x is "a directory".)
		{name: "in the host's /tmp", host: hostFile, inside: hostFile,
			paths: []string{hostFile, links + "/root" + hostFile, links + "/up" + hostFile, links + "/direct"},
			refusable: []string{"/../../../../" + hostFile, links + "/root/../../" + hostFile,
				"/proc/1/root" + hostFile, "/proc/self/root" + hostFile, links + "/p1" + hostFile}},
		// links/runparent is /run/cubicle/..: resolved on the host,
		// that is the sandbox's state directory.
		{name: "beside the run directory", host: beside, inside: "/run/" + base,
			paths:     []string{"/run/" + base, links + "/runparent/" + base},
			refusable: []string{"/run/cubicle/../" + base, "/run/cubicle/../../run/" + base}},
		// links/aboveroot is ../../../..: resolved on the host from
		// rootfs/var/tmp/cubicle-links, that is the rootfs's parent.
		{name: "beside the rootfs", host: aboveRoot, inside: "/" + rootBase,
			paths:     []string{"/" + rootBase, links + "/aboveroot/" + rootBase, links + "/root/" + rootBase},
			refusable: []string{"/../" + rootBase, links + "/root/../" + rootBase, links + "/up/../" + rootBase}},
	}
	if fi, err := os.Stat(filepath.Join(sbDir, "run")); err != nil || !fi.IsDir() {
		t.Fatalf("the sandbox's host directory %s has no run/ (%v): the OCI driver's layout changed, update this test", sbDir, err)
	}
	if err := os.MkdirAll(hostDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	// A host-only file beside the /tmp canary: the sandbox has none there,
	// so no listing may name it and no read may find it.
	if err := os.WriteFile(filepath.Join(hostDir, "host-only-"+tag), randomText(t, "host only"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		c.content = randomText(t, "host canary "+c.name)
		if err := os.WriteFile(c.host, c.content, 0o600); err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(c.host)
		c.mtime = fi.ModTime()
	}
	e.links(t, id, hostFile)
	return cs
}

// links makes the sandbox's symlinks: to / absolutely and relatively (from
// up, as many .. as it takes and more), to /proc/1/root, to the /tmp
// canary's own path, and the two described in canaries.
func (e *env) links(t *testing.T, id, hostFile string) {
	t.Helper()
	e.sh(t, id, linksCmd(hostFile))
}

func linksCmd(hostFile string) string {
	return "(mkdir -p " + links + " && cd " + links + " && rm -rf root up p1 direct runparent aboveroot && ln -s / root && ln -s ../../../../../.. up && ln -s /proc/1/root p1 && ln -s " +
		shQuote(hostFile) + " direct && ln -s /run/cubicle/.. runparent && ln -s ../../../.. aboveroot)"
}

// plantDecoy (re)writes the decoy of c in sandbox id and returns its contents.
func (e *env) plantDecoy(t *testing.T, id string, c *canary) string {
	t.Helper()
	decoy, cmd := decoyCmd(t, c)
	e.sh(t, id, cmd)
	return decoy
}

// decoyCmd returns a new decoy for c and the shell command that plants it.
func decoyCmd(t *testing.T, c *canary) (string, string) {
	decoy := string(randomText(t, "sandbox decoy"))
	return decoy, "mkdir -p " + shQuote(filepath.Dir(c.inside)) + " && printf %s " + shQuote(decoy) + " > " + shQuote(c.inside)
}

// sees reports, for each path, whether sandbox id's own processes (root,
// one exec) read the decoy there: how the sandbox itself resolves it.
func (e *env) sees(t *testing.T, id string, paths []string, decoy string) map[string]bool {
	t.Helper()
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, `if [ "$(cat %s 2>/dev/null)" = %s ]; then echo 1; else echo 0; fi; `, shQuote(p), shQuote(decoy))
	}
	out := strings.Fields(e.sh(t, id, b.String()))
	if len(out) != len(paths) {
		t.Fatalf("sees: %d answers for %d paths", len(out), len(paths))
	}
	m := map[string]bool{}
	for i, p := range paths {
		m[p] = out[i] == "1"
	}
	return m
}

// inspectAndReset returns the contents, as the sandbox itself reads them
// (empty when it cannot), of p, of p cleaned lexically (as envd and the
// agent clean it, before any link is followed: links/root/.. is links), and
// of c.inside; then it removes the lexical path's file, remakes the links
// (hostFile is the /tmp canary) and a new decoy for c, all in one exec.
func (e *env) inspectAndReset(t *testing.T, id, p, hostFile string, c *canary) (atPath, lexical, inside, decoy string) {
	t.Helper()
	decoy, plant := decoyCmd(t, c)
	hexOf := func(p string) string {
		return "(cat " + shQuote(p) + " 2>/dev/null | od -An -v -tx1 | tr -d ' \\n'); echo x; "
	}
	clean := path.Clean(p)
	cleanup := ""
	if clean != p && clean != c.inside {
		cleanup = "rm -f " + shQuote(clean) + "; "
	}
	out := strings.Fields(e.sh(t, id, hexOf(p)+hexOf(clean)+hexOf(c.inside)+cleanup+linksCmd(hostFile)+" && "+plant))
	if len(out) != 3 {
		t.Fatalf("inspect %s: %q", p, out)
	}
	var got [3]string
	for i := range got {
		b, _ := hex.DecodeString(strings.TrimSuffix(out[i], "x"))
		got[i] = string(b)
	}
	return got[0], got[1], got[2], decoy
}

// fileEscapes runs every escape attempt through d against cs. The oracle
// is the sandbox itself: a request must act where the sandbox's own
// processes resolve its path, or be refused (4xx) where they cannot
// resolve it, or where the path has ".." (the native API refuses those)
// or goes through /proc (the agent is PID 1 and may read /proc/1/root,
// which other processes may not). Never a host file.
func (e *env) fileEscapes(t *testing.T, d door, cs []*canary, n tally) {
	leaks := func(what string, body []byte) {
		t.Helper()
		for _, c := range cs {
			if bytes.Contains(body, c.content) {
				t.Errorf("%s: %s: the answer holds the host canary %q", d.name, what, c.name)
			}
		}
	}
	unchanged := func(what string) {
		t.Helper()
		for _, c := range cs {
			if b, err := os.ReadFile(c.host); err != nil || !bytes.Equal(b, c.content) {
				t.Errorf("%s: %s changed the host canary %q: now %q (%v)", d.name, what, c.name, b, err)
			}
		}
	}
	refused := func(code int) bool { return code >= 400 && code < 500 }
	for _, c := range cs {
		all := append(slices.Clone(c.paths), c.refusable...)
		decoy := e.plantDecoy(t, d.id, c)
		sees := e.sees(t, d.id, all, decoy)
		if !sees[c.paths[0]] {
			t.Fatalf("%s: the sandbox's own processes do not read the decoy at %s: the test is wrong", d.name, c.paths[0])
		}
		mayRefuse := func(p string) bool { return !sees[p] || slices.Contains(c.refusable, p) }
		for _, p := range all {
			n["file API escape: read"]++
			code, body := d.read(p)
			leaks("read "+p, body)
			switch {
			case code == http.StatusOK && string(body) == decoy:
				// Resolved inside the sandbox.
			case refused(code) && mayRefuse(p):
			default:
				t.Errorf("%s: read %s (aimed at the canary %s): %d %.200q; want the sandbox's own %s (which its processes read there: %v)",
					d.name, p, c.name, code, body, c.inside, sees[p])
			}
		}
		for _, p := range all {
			n["file API escape: write"]++
			data := string(randomText(t, "written through "+p))
			code, body := d.write(p, []byte(data))
			leaks("write "+p, body)
			unchanged("write " + p)
			// A write through a link may replace the link or follow it:
			// inside the sandbox either way.
			atPath, lexical, inside, next := e.inspectAndReset(t, d.id, p, cs[0].host, c)
			switch {
			case code == http.StatusOK && (atPath == data || lexical == data || inside == data):
			case refused(code) && mayRefuse(p) && inside == decoy:
			default:
				t.Errorf("%s: write %s (aimed at the canary %s): %d %.200q; the sandbox then reads %q there, %q at %s and %q at %s; want the write to land in the sandbox",
					d.name, p, c.name, code, body, atPath, lexical, path.Clean(p), inside, c.inside)
			}
			decoy = next
		}
		for _, p := range all {
			if p == links+"/direct" {
				continue // deleting a link deletes the link
			}
			n["file API escape: delete"]++
			code, body := d.remove(p)
			leaks("delete "+p, body)
			unchanged("delete " + p)
			_, _, inside, next := e.inspectAndReset(t, d.id, c.inside, cs[0].host, c)
			switch {
			case code < 300 && inside == "":
			case code < 300 && (!sees[p] || path.Clean(p) != p) && inside == decoy:
				// Nothing there for the sandbox (or nothing at the path
				// cleaned lexically, which is what was deleted).
			case refused(code) && mayRefuse(p) && inside == decoy:
			default:
				t.Errorf("%s: delete %s (aimed at the canary %s): %d %.200q, and the sandbox then reads %q at %s; want it deleted there",
					d.name, p, c.name, code, body, inside, c.inside)
			}
			decoy = next
		}
	}
	// Listing the /tmp canary's directory, plainly and through the links,
	// names what the sandbox's processes find there, never a host file.
	// (A link to "/" ends gVisor's walk for some calls and not for others:
	// find lists / through links/root/tmp/x, the agent's ListDir the
	// directory itself. Either is the sandbox's.)
	host := cs[0]
	dir := filepath.Dir(host.inside)
	listing := func(p string) []string {
		// (find, not ls: ls cannot stat files under this machine's old gVisor.)
		out := strings.Fields(e.sh(t, d.id, "find "+shQuote(p+"/")+" -mindepth 1 -maxdepth 1 -printf '%f\\n' 2>/dev/null || echo '(cannot list)'"))
		slices.Sort(out)
		return out
	}
	plain := listing(dir)
	for _, p := range []string{dir, links + "/root" + dir, links + "/up" + dir} {
		n["file API escape: list"]++
		want := listing(p)
		code, body, names := d.list(p)
		leaks("list "+p, body)
		slices.Sort(names)
		switch {
		case code == http.StatusOK && (slices.Equal(names, want) || slices.Equal(names, plain)):
		case refused(code) && slices.Equal(want, []string{"(cannot", "list)"}):
		default:
			t.Errorf("%s: list %s: %d %v, want what the sandbox's processes find there: %v (or at %s: %v)", d.name, p, code, names, want, dir, plain)
		}
		for _, name := range names {
			if strings.HasPrefix(name, "host-only-") {
				t.Errorf("%s: list %s names the host-only file %s", d.name, p, name)
			}
		}
	}
	// The host-only file is not there for the sandbox, whichever way it asks.
	hostOnly, _ := filepath.Glob(filepath.Join(filepath.Dir(host.host), "host-only-*"))
	for _, h := range hostOnly {
		secret, _ := os.ReadFile(h)
		for _, p := range []string{h, links + "/root" + h, links + "/up" + h} {
			n["file API escape: read"]++
			code, body := d.read(p)
			if !refused(code) || (p == h && code != http.StatusNotFound) || bytes.Contains(body, secret) {
				t.Errorf("%s: read %s (a file only the host has): %d %.200q, want a refusal (404 for the plain path)", d.name, p, code, body)
			}
		}
	}
}

// checkCanaries fails t unless every canary and host-only file is as planted.
func checkCanaries(t *testing.T, cs []*canary) {
	t.Helper()
	for _, c := range cs {
		b, err := os.ReadFile(c.host)
		fi, serr := os.Stat(c.host)
		switch {
		case err != nil || serr != nil:
			t.Errorf("the host canary %s (%s) is gone: %v", c.name, c.host, err)
		case !bytes.Equal(b, c.content) || !fi.ModTime().Equal(c.mtime):
			t.Errorf("the host canary %s (%s) was changed: now %q, modified %v (was %v)", c.name, c.host, b, fi.ModTime(), c.mtime)
		}
	}
	hostOnly, _ := filepath.Glob(filepath.Join(filepath.Dir(cs[0].host), "host-only-*"))
	if len(hostOnly) != 1 {
		t.Errorf("host-only files beside the /tmp canary: %v, want the one planted", hostOnly)
	}
	entries, _ := os.ReadDir(filepath.Dir(cs[0].host))
	if len(entries) != 2 {
		var names []string
		for _, en := range entries {
			names = append(names, en.Name())
		}
		t.Errorf("the host's canary directory holds %v, want only secret and host-only-*: something was written on the host", names)
	}
}

// sandboxStateDir is the host directory of sandbox id (the OCI driver's).
func (e *env) sandboxStateDir(t *testing.T, id string) string {
	t.Helper()
	dir := filepath.Join(e.dataDir, "oci", "gvisor", id)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("no state directory for sandbox %s: %v", id, err)
	}
	return dir
}
