// Package web is the daemon's browser frontend: the live-view page a view
// link opens (GET /view/{id}), the dashboard (GET /), the HTML error page
// shown for a bad or dead view link, and the static files those pages load
// (GET /static/...). It knows nothing about sandboxes, tokens or API keys:
// internal/api decides who may see what and calls in here to write the
// answer. Only internal/api, cmd/cubicled and tests should import it.
//
// Choices made here, and why:
//   - No framework and no build step. The pages are a few hundred lines of
//     plain HTML, CSS and ES-module JavaScript embedded with go:embed, so the
//     daemon binary carries its own UI and there is no bundler to keep alive.
//   - noVNC is not vendored. It is an npm package (@novnc/novnc, pinned in
//     web/package.json) installed at build time into
//     web/node_modules/@novnc/novnc; New is told that directory and serves
//     only its core/ and vendor/ subtrees under /static/novnc/. Without it
//     those URLs answer 503 with the command that installs it, and
//     NoVNCError says the same so the daemon can log it at start. The
//     directory is looked at on every request (through os.Root, which also
//     keeps symlinks from leading out of it), so installing noVNC needs no
//     restart.
//   - Every page is same-origin only and sends a strict
//     Content-Security-Policy: no inline script or style, no third-party
//     anything. A view URL carries its token in the query, so pages also
//     send Referrer-Policy: no-referrer and Cache-Control: no-store, and
//     cannot be framed (a framed live view in control mode would be a
//     clickjacking tool).
//   - The dashboard keeps the API key in sessionStorage only: it dies with
//     the tab and never travels in a URL.
//
// The pages rely on these API answers (see shared/API.md): GET /v1/info,
// GET /v1/sandboxes, GET /v1/sandboxes/{id}/screenshot, GET .../metrics
// (a card's CPU and memory), POST .../view,
// POST .../timeout, DELETE /v1/sandboxes/{id}, GET .../vnc (WebSocket), and
// GET /view/{id}?token= with "Accept: application/json", which answers the
// view link's status: {"sandbox_id", "state", "view_only", "expires_at",
// "sandbox_expires_at"} or an API error body.
package web
