// Package rfb speaks just enough of the Remote Framebuffer protocol (RFB,
// RFC 6143, plus the community extensions noVNC and x11vnc use) for the
// daemon's desktop proxy and for the tests and benchmarks around it.
//
// A Filter checks every byte a viewer sends towards the sandbox's VNC server:
// the proxy cannot trust the browser, and a VNC server parses client messages
// with far less care than an Internet-facing service should, so anything the
// Filter cannot frame exactly closes the connection. It also enforces the
// shared flag and, for view-only viewers, drops every message that would act
// on the desktop.
//
// A Client is a small RFB viewer for tests and benchmarks: it performs the
// handshake, sends input, walks framebuffer updates and keeps a framebuffer
// that tests compare with screenshots. It is not a full viewer: it decodes
// only Raw and CopyRect rectangles.
//
// The package imports only the standard library; any package may import it.
package rfb

import "errors"

// ErrProtocol is wrapped by every error that reports bytes which break the
// protocol, as opposed to errors of the underlying connection. The proxy
// closes the connection on it and need not log it as a fault of its own.
var ErrProtocol = errors.New("rfb protocol violation")
