package rfb

import (
	"encoding/binary"
	"fmt"
)

// DefaultMaxCutText is the largest ClientCutText payload, in bytes, that a
// Filter lets through when FilterOptions.MaxCutText is not set.
const DefaultMaxCutText = 1 << 20

// Limits on variable-length client messages. A viewer that exceeds them is
// either broken or probing the server, and both end the connection. noVNC
// announces about twenty encodings and at most 64-byte fence payloads, the
// maximum the fence extension allows.
const (
	maxEncodings    = 1024
	maxFencePayload = 64
)

// Client-to-server message types: RFC 6143 §7.5 and the community-registered
// extensions noVNC sends.
const (
	msgSetPixelFormat           = 0
	msgSetEncodings             = 2
	msgFramebufferUpdateRequest = 3
	msgKeyEvent                 = 4
	msgPointerEvent             = 5
	msgClientCutText            = 6
	msgEnableContinuousUpdates  = 150
	msgClientFence              = 248
	msgXvp                      = 250
	msgSetDesktopSize           = 251
	msgQEMU                     = 255

	// qemuExtendedKeyEvent is the only QEMU sub-type a viewer may send; the
	// audio sub-type (1) has a grammar of its own that nothing here needs.
	qemuExtendedKeyEvent = 0
)

// maxHeader is the longest fixed part of anything a client sends: the
// SetPixelFormat message. Variable-length payloads are streamed, not
// buffered, so this is all the Filter ever holds back.
const maxHeader = 20

// FilterOptions configures a Filter.
type FilterOptions struct {
	// ViewOnly drops every message that acts on the desktop: key and pointer
	// events, clipboard, desktop resize, xvp power requests and QEMU extended
	// key events. Everything else still passes so the viewer can watch.
	ViewOnly bool
	// MaxCutText caps a ClientCutText payload in bytes; a longer one is a
	// violation. Zero or less means DefaultMaxCutText.
	MaxCutText int
}

// filterState is where the client is in the connection: the Filter has to
// track the handshake because its bytes have no message-type framing.
type filterState uint8

const (
	stateVersion  filterState = iota // 12-byte ProtocolVersion
	stateSecurity                    // one-byte security type (3.7 and 3.8)
	stateInit                        // one-byte ClientInit shared flag
	stateMessages                    // typed client messages until the end
)

// Filter checks the byte stream a viewer sends to the VNC server and decides
// what of it reaches the server. Create it with NewFilter, one per
// connection, and pass it every byte the viewer sends, in order. A Filter is
// not safe for concurrent use; one goroutine (the proxy's client-to-server
// copy loop) owns it.
type Filter struct {
	viewOnly bool
	maxCut   int64
	state    filterState

	// hdr gathers a header that arrived split over Feed calls; nhdr bytes
	// of it are filled. A header that arrives whole is read in place.
	hdr  [maxHeader]byte
	nhdr int

	// body counts the bytes of the current message's payload still to
	// come; skip says whether they are dropped instead of forwarded.
	body int64
	skip bool

	// copying is false while a chunk passes unchanged and Feed can hand
	// back the caller's bytes instead of a copy in out.
	copying bool
	out     []byte
	off     int64 // bytes consumed before the current unit, for errors
	dropped int
	err     error
}

// NewFilter returns a Filter for a new connection, expecting the client's
// ProtocolVersion as its first bytes.
func NewFilter(opts FilterOptions) *Filter {
	maxCut := int64(opts.MaxCutText)
	if maxCut <= 0 {
		maxCut = DefaultMaxCutText
	}
	return &Filter{viewOnly: opts.ViewOnly, maxCut: maxCut}
}

// Feed consumes the next bytes the client sent, in any chunking, and returns
// the bytes to forward to the server now. The result may be empty, for
// instance while a header is incomplete; it may be p, or a prefix of it, or
// an internal buffer that is valid until the next call. A payload is
// forwarded as it arrives once its header has been checked; a header is
// forwarded only whole and checked.
//
// A non-nil error wraps ErrProtocol and means the stream broke the protocol
// or a limit; the caller must close the connection, and every later call
// returns the same error. No bytes of the chunk that held the violation are
// forwarded.
func (f *Filter) Feed(p []byte) (out []byte, err error) {
	if f.err != nil {
		return nil, f.err
	}
	// In control mode, once the handshake is over, a valid chunk is
	// forwarded byte for byte: return it rather than a copy. Not when it
	// starts by finishing a header held back from the last chunk, whose
	// first bytes are not in it; a header it leaves unfinished is held
	// back by cutting it off the end.
	in := p
	f.copying = f.viewOnly || f.state != stateMessages || f.nhdr > 0
	f.out = f.out[:0]
	for len(p) > 0 {
		if f.body > 0 {
			n := len(p)
			if int64(n) > f.body {
				n = int(f.body)
			}
			if f.copying && !f.skip {
				f.out = append(f.out, p[:n]...)
			}
			p = p[n:]
			f.body -= int64(n)
			f.off += int64(n)
			continue
		}
		n, err := f.step(p)
		if err != nil {
			f.err = err
			f.out = f.out[:0]
			return nil, err
		}
		p = p[n:]
	}
	if !f.copying {
		return in[:len(in)-f.nhdr], nil
	}
	return f.out, nil
}

// Dropped reports how many input messages the Filter has dropped because it
// is view-only.
func (f *Filter) Dropped() int { return f.dropped }

// step takes bytes of p towards the next header and, once the header is
// whole, checks and accepts it. It returns how many bytes of p it took.
func (f *Filter) step(p []byte) (int, error) {
	if f.nhdr == 0 {
		// The common case on a busy connection: the whole header is in
		// p, so read it in place instead of copying it aside.
		need, body, input, err := f.header(p)
		if err != nil {
			return 0, err
		}
		if len(p) >= need {
			f.accept(p[:need], body, input)
			return need, nil
		}
	}
	taken := 0
	for {
		if f.nhdr == 0 {
			f.hdr[0] = p[0]
			f.nhdr, taken = 1, 1
		}
		h := f.hdr[:f.nhdr]
		need, body, input, err := f.header(h)
		if err != nil {
			return taken, err
		}
		if len(h) >= need {
			f.nhdr = 0
			f.accept(h[:need], body, input)
			return taken, nil
		}
		if taken == len(p) {
			return taken, nil
		}
		n := copy(f.hdr[f.nhdr:need], p[taken:])
		f.nhdr += n
		taken += n
	}
}

// header inspects the start of the next unit, h, which holds at least one
// byte. It returns the length of the unit's header, which may grow as more
// of h is known (a length field comes after the type). Once h holds the
// whole header, it also returns the length of the payload that follows and
// whether the message acts on the desktop, or an error if the header breaks
// the protocol. Errors are reported as early as the bytes allow, so a bad
// type byte closes the connection without waiting for more.
func (f *Filter) header(h []byte) (need int, body int64, input bool, err error) {
	switch f.state {
	case stateVersion:
		if len(h) < 12 {
			return 12, 0, false, nil
		}
		if _, err := clientVersion(h[:12]); err != nil {
			return 0, 0, false, err
		}
		return 12, 0, false, nil
	case stateSecurity:
		// Only None: the daemon's token is the authentication, the
		// server runs without a password, and any other type would start
		// an exchange this Filter cannot frame.
		if h[0] != securityNone {
			return 0, 0, false, fmt.Errorf("client chose security type %d, only None (1) is allowed: %w", h[0], ErrProtocol)
		}
		return 1, 0, false, nil
	case stateInit:
		return 1, 0, false, nil
	}
	return f.message(h)
}

// message is header for the typed client messages.
func (f *Filter) message(h []byte) (need int, body int64, input bool, err error) {
	switch t := h[0]; t {
	case msgSetPixelFormat:
		if len(h) < 20 {
			return 20, 0, false, nil
		}
		// RFC 6143 §7.4 allows only these; a server that trusts the
		// value computes buffer sizes from it.
		if bpp := h[4]; bpp != 8 && bpp != 16 && bpp != 32 {
			return 0, 0, false, f.violation(t, "bits-per-pixel %d", bpp)
		}
		return 20, 0, false, nil
	case msgSetEncodings:
		if len(h) < 4 {
			return 4, 0, false, nil
		}
		n := binary.BigEndian.Uint16(h[2:])
		if n > maxEncodings {
			return 0, 0, false, f.violation(t, "%d encodings, at most %d allowed", n, maxEncodings)
		}
		return 4, 4 * int64(n), false, nil
	case msgFramebufferUpdateRequest, msgEnableContinuousUpdates:
		return 10, 0, false, nil
	case msgKeyEvent:
		return 8, 0, true, nil
	case msgPointerEvent:
		return 6, 0, true, nil
	case msgClientCutText:
		if len(h) < 8 {
			return 8, 0, false, nil
		}
		// The extended clipboard marks its messages with a negative
		// length whose absolute value is the payload size.
		n := int64(int32(binary.BigEndian.Uint32(h[4:])))
		if n < 0 {
			n = -n
		}
		if n > f.maxCut {
			return 0, 0, false, f.violation(t, "%d bytes of clipboard, at most %d allowed", n, f.maxCut)
		}
		return 8, n, true, nil
	case msgClientFence:
		if len(h) < 9 {
			return 9, 0, false, nil
		}
		if n := h[8]; n > maxFencePayload {
			return 0, 0, false, f.violation(t, "fence payload of %d bytes, at most %d allowed", n, maxFencePayload)
		}
		return 9, int64(h[8]), false, nil
	case msgXvp:
		return 4, 0, true, nil
	case msgSetDesktopSize:
		if len(h) < 8 {
			return 8, 0, false, nil
		}
		return 8, 16 * int64(h[6]), true, nil
	case msgQEMU:
		if len(h) < 2 {
			return 2, 0, false, nil
		}
		if h[1] != qemuExtendedKeyEvent {
			return 0, 0, false, f.violation(t, "QEMU sub-type %d", h[1])
		}
		return 12, 0, true, nil
	default:
		// Without knowing the type we cannot know the length, so the
		// rest of the stream cannot be framed: closing is the only safe
		// answer.
		return 0, 0, false, f.violation(t, "unknown message type")
	}
}

// violation builds the error for a client message of type t that breaks
// the protocol, with the stream offset at which the message started.
func (f *Filter) violation(t byte, format string, args ...any) error {
	return fmt.Errorf("client message type %d at byte %d: %s: %w", t, f.off, fmt.Sprintf(format, args...), ErrProtocol)
}

// accept acts on a whole, checked header h: it forwards or drops it, sets up
// the payload that follows and moves the handshake along.
func (f *Filter) accept(h []byte, body int64, input bool) {
	f.off += int64(len(h))
	switch f.state {
	case stateVersion:
		f.out = append(f.out, h...)
		if v, _ := clientVersion(h); v == 3 {
			// In 3.3 the server picks the security type and, as ours
			// runs without a password, the client answers nothing.
			f.state = stateInit
		} else {
			f.state = stateSecurity
		}
	case stateSecurity:
		f.out = append(f.out, h...)
		f.state = stateInit
	case stateInit:
		// Always shared: an exclusive viewer would make the server
		// disconnect everyone else watching the sandbox.
		f.out = append(f.out, 1)
		f.state = stateMessages
	default:
		f.body = body
		f.skip = input && f.viewOnly
		if f.skip {
			f.dropped++
		} else if f.copying {
			f.out = append(f.out, h...)
		}
	}
}

// securityNone is the RFB security type without authentication.
const securityNone = 1

// clientVersion checks a client's 12-byte ProtocolVersion and returns its
// minor version. Only the three versions of RFC 6143 pass. Apple's
// "RFB 003.889" is refused: Apple viewers send it only to Apple servers,
// where it leads to Apple's own security types, which are refused anyway.
func clientVersion(h []byte) (int, error) {
	switch string(h) {
	case "RFB 003.003\n":
		return 3, nil
	case "RFB 003.007\n":
		return 7, nil
	case "RFB 003.008\n":
		return 8, nil
	}
	return 0, fmt.Errorf("client ProtocolVersion %q, want RFB 003.003, 003.007 or 003.008: %w", h, ErrProtocol)
}
