package web

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const secret = "TOP-SECRET-OUTSIDE-NOVNC"

// fakeNoVNC lays out a directory shaped like the npm package, next to a
// secret file that no request may reach, and returns the package directory.
func fakeNoVNC(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "novnc")
	files := map[string]string{
		"core/rfb.js":                "export default class RFB {}\n",
		"core/util/events.js":        "export const x = 1;\n",
		"core/.hidden.js":            "hidden\n",
		"vendor/pako/lib/zlib/a.js":  "export const a = 1;\n",
		"vendor/pako/README.md":      "pako\n",
		"docs/API.md":                "# API\n",
		"package.json":               `{"name": "@novnc/novnc"}`,
		"../secret.txt":              secret,
		"../other/core/rfb.js":       secret,
		"../other/vendor/outside.js": secret,
	}
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Symlinks that point out of the package must not be followed out.
	for link, target := range map[string]string{
		"core/escape.js":  filepath.Join(base, "secret.txt"),
		"core/passwd.js":  "/etc/passwd",
		"core/rel.js":     "../../secret.txt",
		"vendor/outside":  filepath.Join(base, "other", "vendor"),
		"core/inside.js":  "rfb.js", // inside: fine to follow
		"core/util/up.js": "../rfb.js",
	} {
		if err := os.Symlink(target, filepath.Join(dir, filepath.FromSlash(link))); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func get(t *testing.T, h http.Handler, method, target string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestStatic(t *testing.T) {
	h := New(fakeNoVNC(t)).Static()
	const (
		js    = "text/javascript; charset=utf-8"
		css   = "text/css; charset=utf-8"
		ours  = "no-cache"
		novnc = "public, max-age=3600"
	)
	tests := []struct {
		target    string
		status    int
		ctype     string
		cache     string
		bodyStart string
	}{
		{"/static/viewer.js", 200, js, ours, "//"},
		{"/static/dashboard.js", 200, js, ours, "//"},
		{"/static/style.css", 200, css, ours, "/*"},
		{"/static/novnc/core/rfb.js", 200, js, novnc, "export default class RFB"},
		{"/static/novnc/core/util/events.js", 200, js, novnc, "export const x"},
		{"/static/novnc/vendor/pako/lib/zlib/a.js", 200, js, novnc, "export const a"},
		{"/static/novnc/core/inside.js", 200, js, novnc, "export default class RFB"},
		{"/static/novnc/core/util/up.js", 200, js, novnc, "export default class RFB"},

		// Pages only through their Serve methods.
		{"/static/viewer.html", 404, "", "", ""},
		{"/static/dashboard.html", 404, "", "", ""},
		{"/static/error.html", 404, "", "", ""},
		// Not files, or not ours.
		{"/static/", 404, "", "", ""},
		{"/static", 404, "", "", ""},
		{"/", 404, "", "", ""},
		{"/static/nope.js", 404, "", "", ""},
		{"/static/novnc/", 404, "", "", ""},
		{"/static/novnc/core", 404, "", "", ""},
		{"/static/novnc/core/", 404, "", "", ""},
		{"/static/novnc/core/util", 404, "", "", ""},
		{"/static/novnc/docs/API.md", 404, "", "", ""},
		{"/static/novnc/package.json", 404, "", "", ""},
		{"/static/novnc/vendor/pako/README.md", 404, "", "", ""}, // only .js modules are served
		{"/static/novnc/core/.hidden.js", 404, "", "", ""},
		{"/static/novnc//core/rfb.js", 404, "", "", ""},
		{"/static/novnc/./core/rfb.js", 404, "", "", ""},
		{"/static/novnc/core/./rfb.js", 404, "", "", ""},

		// Traversal, plain and encoded.
		{"/static/novnc/../../etc/passwd", 404, "", "", ""},
		{"/static/novnc/../secret.txt", 404, "", "", ""},
		{"/static/novnc/core/../../secret.txt", 404, "", "", ""},
		{"/static/novnc/core/../../other/core/rfb.js", 404, "", "", ""},
		{"/static/../web.go", 404, "", "", ""},
		{"/static/novnc/%2e%2e/%2e%2e/etc/passwd", 404, "", "", ""},
		{"/static/novnc/%2E%2E/secret.txt", 404, "", "", ""},
		{"/static/novnc/core/..%2f..%2fsecret.txt", 404, "", "", ""},
		{"/static/novnc/core%2f..%2f..%2fsecret.txt", 404, "", "", ""},
		{"/static/novnc/core/%252e%252e/%252e%252e/secret.txt", 404, "", "", ""},
		{"/static/novnc/core/..%5c..%5csecret.txt", 404, "", "", ""},
		{`/static/novnc/core/..\..\secret.txt`, 404, "", "", ""},
		{"/static/novnc/core/rfb.js%00.png", 404, "", "", ""},
		{"/static/novnc/%2fetc/passwd", 404, "", "", ""},
		// Symlinks out of the package.
		{"/static/novnc/core/escape.js", 404, "", "", ""},
		{"/static/novnc/core/passwd.js", 404, "", "", ""},
		{"/static/novnc/core/rel.js", 404, "", "", ""},
		{"/static/novnc/vendor/outside/outside.js", 404, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			w := get(t, h, "GET", tt.target)
			body := w.Body.String()
			if w.Code != tt.status {
				t.Fatalf("status = %d, want %d (body %q)", w.Code, tt.status, body)
			}
			if strings.Contains(body, secret) || strings.Contains(body, "root:") {
				t.Fatalf("served a file from outside: %q", body)
			}
			if got := w.Header().Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
			}
			if tt.status != 200 {
				return
			}
			if got := w.Header().Get("Content-Type"); got != tt.ctype {
				t.Errorf("Content-Type = %q, want %q", got, tt.ctype)
			}
			if got := w.Header().Get("Cache-Control"); got != tt.cache {
				t.Errorf("Cache-Control = %q, want %q", got, tt.cache)
			}
			if !strings.HasPrefix(body, tt.bodyStart) {
				t.Errorf("body starts %q, want %q", body[:min(len(body), 40)], tt.bodyStart)
			}
		})
	}
}

func TestStaticConditionalAndMethods(t *testing.T) {
	h := New(fakeNoVNC(t)).Static()

	w := get(t, h, "GET", "/static/viewer.js")
	etag := w.Header().Get("ETag")
	if !regexp.MustCompile(`^"[0-9a-f]+"$`).MatchString(etag) {
		t.Fatalf("ETag = %q, want a quoted hex digest", etag)
	}
	if w := get(t, h, "GET", "/static/viewer.js", "If-None-Match", etag); w.Code != http.StatusNotModified {
		t.Errorf("If-None-Match with the ETag: status = %d, want 304", w.Code)
	}
	if w := get(t, h, "GET", "/static/viewer.js", "If-None-Match", `"other"`); w.Code != http.StatusOK {
		t.Errorf("If-None-Match with another ETag: status = %d, want 200", w.Code)
	}
	if got, other := etag, get(t, h, "GET", "/static/style.css").Header().Get("ETag"); got == other {
		t.Errorf("viewer.js and style.css share ETag %q", got)
	}

	w = get(t, h, "GET", "/static/novnc/core/rfb.js")
	lm := w.Header().Get("Last-Modified")
	if lm == "" {
		t.Fatal("noVNC file without Last-Modified")
	}
	if w := get(t, h, "GET", "/static/novnc/core/rfb.js", "If-Modified-Since", lm); w.Code != http.StatusNotModified {
		t.Errorf("If-Modified-Since: status = %d, want 304", w.Code)
	}

	if w := get(t, h, "HEAD", "/static/viewer.js"); w.Code != 200 || w.Body.Len() != 0 {
		t.Errorf("HEAD: status %d, %d body bytes; want 200 and none", w.Code, w.Body.Len())
	}
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		w := get(t, h, m, "/static/viewer.js")
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: status %d, Allow %q; want 405 and GET, HEAD", m, w.Code, w.Header().Get("Allow"))
		}
	}
}

func TestNoVNCMissing(t *testing.T) {
	noEntry := t.TempDir()
	if err := os.MkdirAll(filepath.Join(noEntry, "core"), 0o755); err != nil {
		t.Fatal(err)
	}
	entryIsDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(entryIsDir, "core", "rfb.js"), 0o755); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{
		"empty setting": "",
		"no directory":  filepath.Join(t.TempDir(), "missing"),
		"empty dir":     t.TempDir(),
		"no rfb.js":     noEntry,
		"rfb.js is dir": entryIsDir,
	}
	for name, dir := range dirs {
		t.Run(name, func(t *testing.T) {
			web := New(dir)
			err := web.NoVNCError()
			if err == nil || !strings.Contains(err.Error(), "make deps") || !strings.Contains(err.Error(), "npm ci --prefix web") {
				t.Errorf("NoVNCError() = %v, want an error naming make deps and npm ci --prefix web", err)
			}
			for _, target := range []string{"/static/novnc/core/rfb.js", "/static/novnc/vendor/pako/x.js", "/static/novnc/other"} {
				w := get(t, web.Static(), "GET", target)
				if w.Code != http.StatusServiceUnavailable {
					t.Errorf("%s: status = %d, want 503", target, w.Code)
				}
				if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
					t.Errorf("%s: Content-Type = %q, want text/plain", target, ct)
				}
				if body := w.Body.String(); !strings.Contains(body, "not installed") || !strings.Contains(body, "make deps") {
					t.Errorf("%s: body = %q, want the install hint", target, body)
				}
			}
			// Our own files do not depend on noVNC.
			if w := get(t, web.Static(), "GET", "/static/viewer.js"); w.Code != 200 {
				t.Errorf("viewer.js without noVNC: status = %d, want 200", w.Code)
			}
		})
	}

	t.Run("installed later", func(t *testing.T) {
		dir := t.TempDir()
		web := New(dir)
		if web.NoVNCError() == nil {
			t.Fatal("NoVNCError() = nil before install")
		}
		if err := os.MkdirAll(filepath.Join(dir, "core"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "core", "rfb.js"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := web.NoVNCError(); err != nil {
			t.Errorf("NoVNCError() after install = %v, want nil", err)
		}
		if w := get(t, web.Static(), "GET", "/static/novnc/core/rfb.js"); w.Code != 200 {
			t.Errorf("rfb.js after install: status = %d, want 200", w.Code)
		}
	})
}

// wantPageHeaders checks the headers every HTML answer must carry.
func wantPageHeaders(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	h := w.Header()
	for name, want := range map[string]string{
		"Content-Type":           "text/html; charset=utf-8",
		"Referrer-Policy":        "no-referrer",
		"X-Content-Type-Options": "nosniff",
		"Cache-Control":          "no-store",
		"X-Frame-Options":        "DENY",
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	csp := h.Get("Content-Security-Policy")
	for _, d := range []string{
		"default-src 'none'", "script-src 'self'", "style-src 'self'",
		"img-src 'self' blob: data:", "connect-src 'self'", "frame-ancestors 'none'",
		"base-uri 'none'", "form-action 'self'",
	} {
		if !strings.Contains(csp, d) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, d)
		}
	}
	if strings.Contains(csp, "unsafe") {
		t.Errorf("Content-Security-Policy %q allows something unsafe", csp)
	}
}

var (
	scriptElem = regexp.MustCompile(`(?is)<script([^>]*)>(.*?)</script>`)
	tag        = regexp.MustCompile(`(?i)<[a-z][^>]*>`)
	attrValue  = regexp.MustCompile(`"[^"]*"|'[^']*'`)
	inlineAttr = regexp.MustCompile(`(?i)\sstyle=|\son[a-z]+=`)
	scriptURL  = regexp.MustCompile(`(?i)(?:href|src|action)=["']?\s*javascript:`)
)

// inlineCode returns the first thing in page that the CSP would block:
// a script element without src or with a body, a style element, a style
// or event-handler attribute, a javascript: URL. "" if there is none.
func inlineCode(page string) string {
	for _, m := range scriptElem.FindAllStringSubmatch(page, -1) {
		if !strings.Contains(m[1], " src=") || strings.TrimSpace(m[2]) != "" {
			return m[0]
		}
	}
	for _, t := range tag.FindAllString(page, -1) {
		names := attrValue.ReplaceAllString(t, `""`)
		if strings.HasPrefix(strings.ToLower(t), "<style") || inlineAttr.MatchString(names) || scriptURL.MatchString(t) {
			return t
		}
	}
	return ""
}

func TestPages(t *testing.T) {
	web := New(fakeNoVNC(t))
	tests := []struct {
		name  string
		serve http.HandlerFunc
		want  []string
	}{
		{"viewer", web.ServeViewer, []string{
			`<script type="module" src="/static/viewer.js"></script>`,
			`id="screen"`, `href="/static/style.css"`,
		}},
		{"dashboard", web.ServeDashboard, []string{
			`<script type="module" src="/static/dashboard.js"></script>`,
			`<form id="signin"`, `id="api-key"`, `method="post"`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/anything?token=abc", nil)
			w := httptest.NewRecorder()
			tt.serve(w, r)
			if w.Code != 200 {
				t.Fatalf("status = %d, want 200", w.Code)
			}
			wantPageHeaders(t, w)
			body := w.Body.String()
			for _, s := range tt.want {
				if !strings.Contains(body, s) {
					t.Errorf("page lacks %q", s)
				}
			}
			if m := inlineCode(body); m != "" {
				t.Errorf("page has inline code or style the CSP would block: %q", m)
			}

			r = httptest.NewRequest("HEAD", "/", nil)
			w = httptest.NewRecorder()
			tt.serve(w, r)
			if w.Code != 200 || w.Body.Len() != 0 {
				t.Errorf("HEAD: status %d, %d body bytes; want 200 and none", w.Code, w.Body.Len())
			}
		})
	}
}

// TestReferences checks that every /static/ URL our pages and scripts name
// is served, so a renamed file cannot break a page unnoticed.
func TestReferences(t *testing.T) {
	web := New(fakeNoVNC(t))
	ref := regexp.MustCompile(`["'](/static/[^"'?#]+)["']`)
	seen := 0
	for _, name := range []string{"viewer.html", "dashboard.html", "error.html", "viewer.js", "dashboard.js"} {
		b, err := staticFS.ReadFile(path.Join("static", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ref.FindAllStringSubmatch(string(b), -1) {
			seen++
			if w := get(t, web.Static(), "GET", m[1]); w.Code != 200 {
				t.Errorf("%s names %s, which answers %d", name, m[1], w.Code)
			}
		}
	}
	if seen == 0 {
		t.Fatal("found no /static/ references")
	}
	viewer, _ := staticFS.ReadFile("static/viewer.js")
	if !strings.Contains(string(viewer), "'/static/novnc/"+novncEntry+"'") {
		t.Errorf("viewer.js does not import %s", novncEntry)
	}
}

func TestServeError(t *testing.T) {
	web := New("")
	tests := []struct {
		status         int
		title, message string
		want, notWant  []string
	}{
		{
			status: http.StatusUnauthorized, title: "This view link has expired",
			message: "Ask for a new one.",
			want:    []string{"<h1>This view link has expired</h1>", "Ask for a new one.", "401 Unauthorized", `data-state="ended"`},
		},
		{
			status:  http.StatusForbidden,
			title:   `<script>alert("t")</script>`,
			message: `<img src=x onerror=alert(1)> & "quoted" 'single'`,
			want: []string{
				"&lt;script&gt;alert(&#34;t&#34;)&lt;/script&gt;",
				"&lt;img src=x onerror=alert(1)&gt; &amp; &#34;quoted&#34; &#39;single&#39;",
			},
			notWant: []string{"<script>alert", "<img src=x"},
		},
		{
			status: http.StatusNotFound, title: "", message: "",
			want:    []string{"<h1>Not Found</h1>", "404 Not Found"},
			notWant: []string{`class="detail"`},
		},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.status), func(t *testing.T) {
			r := httptest.NewRequest("GET", "/view/abc?token=secret", nil)
			w := httptest.NewRecorder()
			web.ServeError(w, r, tt.status, tt.title, tt.message)
			if w.Code != tt.status {
				t.Errorf("status = %d, want %d", w.Code, tt.status)
			}
			wantPageHeaders(t, w)
			body := w.Body.String()
			for _, s := range tt.want {
				if !strings.Contains(body, s) {
					t.Errorf("page lacks %q:\n%s", s, body)
				}
			}
			for _, s := range tt.notWant {
				if strings.Contains(body, s) {
					t.Errorf("page has %q:\n%s", s, body)
				}
			}
			if m := inlineCode(body); m != "" {
				t.Errorf("page has inline code or style the CSP would block: %q", m)
			}
		})
	}
}

func TestContentSecurityPolicy(t *testing.T) {
	const base = "default-src 'none'; script-src 'self'; style-src 'self'; " +
		"img-src 'self' blob: data:; connect-src 'self'; " +
		"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
	withWS := func(host string) string {
		return strings.Replace(base, "connect-src 'self'", "connect-src 'self' ws://"+host+" wss://"+host, 1)
	}
	tests := []struct {
		host, want string
	}{
		{"127.0.0.1:7171", withWS("127.0.0.1:7171")},
		{"localhost", withWS("localhost")},
		{"cubicle.example.org:443", withWS("cubicle.example.org:443")},
		{"[::1]:7171", withWS("[::1]:7171")},
		{"[fe80::1]", withWS("[fe80::1]")},
		{"", base},
		{"evil; script-src *", base},
		{"a.example;script-src", base},
		{"host:7171; img-src *", base},
		{"host,other", base},
		{"host 'unsafe-inline'", base},
		{"host:", base},
		{"host:0", base},
		{"host:65536", base},
		{"host:+80", base},
		{":80", base},
		{"[::1", base},
		{"[::1]x", base},
		{"[::1]:", base},
		{"[]:80", base},
		{"[::1;]", base},
		{"-bad.example", base},
		{"a..b", base},
		{"*.example.org", base},
		{"user@host", base},
	}
	for _, tt := range tests {
		if got := contentSecurityPolicy(tt.host); got != tt.want {
			t.Errorf("contentSecurityPolicy(%q)\n got %q\nwant %q", tt.host, got, tt.want)
		}
	}
}

func TestCleanPath(t *testing.T) {
	tests := map[string]bool{
		"viewer.js":           true,
		"novnc/core/rfb.js":   true,
		"novnc/core/a-b_c.js": true,
		"":                    false,
		".":                   false,
		"..":                  false,
		"/etc/passwd":         false,
		"a/../b":              false,
		"a/./b":               false,
		"a//b":                false,
		"a/":                  false,
		".git/config":         false,
		"a/.env":              false,
		`a\..\b`:              false,
		"a\x00b":              false,
	}
	for name, want := range tests {
		if got := cleanPath(name); got != want {
			t.Errorf("cleanPath(%q) = %v, want %v", name, got, want)
		}
	}
}

func FuzzContentSecurityPolicy(f *testing.F) {
	for _, s := range []string{"127.0.0.1:7171", "[::1]:80", "a;b", "x y", "host:", "\x00", "é.example"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		csp := contentSecurityPolicy(host)
		directives := strings.Split(csp, "; ")
		if len(directives) != 8 {
			t.Fatalf("host %q made %d directives: %q", host, len(directives), csp)
		}
		for _, d := range directives {
			if strings.HasPrefix(d, "connect-src ") {
				if n := len(strings.Fields(d)); n != 2 && n != 4 {
					t.Fatalf("host %q made connect directive %q", host, d)
				}
			}
		}
		for _, c := range csp {
			if c < 0x20 || c > 0x7e || c == ',' {
				t.Fatalf("host %q put %q into the policy %q", host, c, csp)
			}
		}
	})
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"novnc/core/rfb.js", "../x", "a/%2e%2e/b", `a\b`, "a//b", ".x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if !cleanPath(name) {
			return
		}
		if path.Clean(name) != name || strings.HasPrefix(name, "/") || strings.HasPrefix(name, ".") {
			t.Fatalf("cleanPath accepted %q", name)
		}
		for _, seg := range strings.Split(name, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("cleanPath accepted %q", name)
			}
		}
	})
}
