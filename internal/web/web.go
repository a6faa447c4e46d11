package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
)

//go:embed static
var staticFS embed.FS

// Web serves the pages and static files of the browser frontend. Its methods
// are safe for concurrent use.
type Web struct {
	novncDir  string
	files     map[string]staticFile // embedded non-HTML files by name
	viewer    []byte
	dashboard []byte
	errorPage *template.Template
}

// staticFile is one embedded file, ready to serve.
type staticFile struct {
	body        []byte
	contentType string
	etag        string
}

// New returns the frontend. novncDir is the directory of the installed noVNC
// package (the one holding core/rfb.js); it may be empty or missing, in which
// case the live view cannot load and NoVNCError says why.
func New(novncDir string) *Web {
	w := &Web{novncDir: novncDir, files: map[string]staticFile{}}
	// The embedded tree is fixed at build time, so a failure here is a
	// broken build, not something a caller could handle.
	err := fs.WalkDir(staticFS, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := staticFS.ReadFile(p)
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(p, "static/")
		switch {
		case name == "viewer.html":
			w.viewer = body
		case name == "dashboard.html":
			w.dashboard = body
		case name == "error.html":
			w.errorPage, err = template.New(name).Parse(string(body))
		case path.Ext(name) == ".html":
			// Pages are served only through their Serve methods, which add
			// the security headers; no HTML is reachable under /static/.
		default:
			sum := sha256.Sum256(body)
			w.files[name] = staticFile{
				body:        body,
				contentType: contentType(name),
				etag:        `"` + hex.EncodeToString(sum[:12]) + `"`,
			}
		}
		return err
	})
	if err == nil && (w.viewer == nil || w.dashboard == nil || w.errorPage == nil) {
		err = fmt.Errorf("a page is missing")
	}
	if err != nil {
		panic(fmt.Sprintf("web: embedded static files: %v", err))
	}
	return w
}

// ServeViewer writes the live-view page. The caller has already checked the
// view link's token; the page itself asks for the link's status again (GET
// of the same URL with Accept: application/json) before it connects.
func (w *Web) ServeViewer(rw http.ResponseWriter, r *http.Request) {
	writePage(rw, r, http.StatusOK, w.viewer)
}

// ServeDashboard writes the dashboard page. It needs no API key: the page
// asks for one and sends it with each API call it makes.
func (w *Web) ServeDashboard(rw http.ResponseWriter, r *http.Request) {
	writePage(rw, r, http.StatusOK, w.dashboard)
}

// ServeError writes an HTML error page with the given status, in the style of
// the other pages. title and message are shown as text (HTML-escaped), so
// they may hold anything; keep them meant for users.
func (w *Web) ServeError(rw http.ResponseWriter, r *http.Request, status int, title, message string) {
	if title == "" {
		title = http.StatusText(status)
	}
	var buf bytes.Buffer
	err := w.errorPage.Execute(&buf, struct {
		Status         int
		StatusText     string
		Title, Message string
	}{status, http.StatusText(status), title, message})
	if err != nil {
		// Only a broken template gets here, and it is embedded and parsed
		// at New; the user still gets the status and the message.
		setPageHeaders(rw.Header(), r.Host)
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		rw.WriteHeader(status)
		fmt.Fprintf(rw, "%s\n%s\n", title, message)
		return
	}
	writePage(rw, r, status, buf.Bytes())
}

// writePage writes one HTML document with the security headers every page
// carries.
func writePage(rw http.ResponseWriter, r *http.Request, status int, body []byte) {
	h := rw.Header()
	setPageHeaders(h, r.Host)
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	rw.WriteHeader(status)
	if r.Method != http.MethodHead {
		// A failed write means the client went away; there is no one to tell.
		_, _ = rw.Write(body)
	}
}

// setPageHeaders sets the headers of every HTML answer. host is the request's
// Host, used to name the WebSocket origin explicitly (see contentSecurityPolicy).
func setPageHeaders(h http.Header, host string) {
	h.Set("Content-Security-Policy", contentSecurityPolicy(host))
	// The view URL carries its token: never leak it to another site, and
	// never keep the page (or an error about it) in a shared cache.
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	// frame-ancestors says the same to browsers that know CSP 2.
	h.Set("X-Frame-Options", "DENY")
}

// contentSecurityPolicy returns the pages' policy. CSP 3 lets connect-src
// 'self' match ws: and wss: URLs of the page's own host and port, and
// current Chromium does (the live view connects under 'self' alone), but
// browsers released before that rule blocked the WebSocket. Naming
// ws://host and wss://host as well costs nothing and keeps those working.
// The Host header comes from the client, so it is used only when it is a
// plain host[:port]; otherwise 'self' alone remains.
func contentSecurityPolicy(host string) string {
	connect := "'self'"
	if validHost(host) {
		connect += " ws://" + host + " wss://" + host
	}
	return "default-src 'none'; script-src 'self'; style-src 'self'; " +
		"img-src 'self' blob: data:; connect-src " + connect + "; " +
		"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
}

// validHost reports whether host is a DNS name, an IPv4 address or a
// bracketed IPv6 address, each with an optional port: exactly what a CSP
// host-source may hold, and nothing (such as ';', ',', quotes or spaces)
// that could change the policy's meaning.
func validHost(host string) bool {
	if host == "" || len(host) > 255 {
		return false
	}
	if strings.HasPrefix(host, "[") {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return false
		}
		addr, rest := host[1:end], host[end+1:]
		if addr == "" || strings.Trim(addr, "0123456789abcdefABCDEF:.") != "" {
			return false
		}
		return rest == "" || strings.HasPrefix(rest, ":") && validPort(rest[1:])
	}
	name := host
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		if !validPort(host[i+1:]) {
			return false
		}
		name = host[:i]
	}
	if name == "" {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-") {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// validPort reports whether p is a decimal port number.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n <= 65535 && p[0] != '+' && p[0] != '-'
}
