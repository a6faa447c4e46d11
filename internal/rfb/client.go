package rfb

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"image"
	"io"
	"slices"
	"sync"
)

// Server-to-client message types (RFC 6143 §7.6 and the community
// extensions), as reported in Message.Type.
const (
	MsgFramebufferUpdate      = 0
	MsgSetColourMapEntries    = 1
	MsgBell                   = 2
	MsgServerCutText          = 3
	MsgEndOfContinuousUpdates = 150
	MsgServerFence            = 248
)

// Encodings and pseudo-encodings the Client understands, for SetEncodings.
// A server sends only what the client announced, so announcing only these
// keeps every update readable.
const (
	EncodingRaw                 int32 = 0
	EncodingCopyRect            int32 = 1
	EncodingZRLE                int32 = 16
	EncodingDesktopSize         int32 = -223
	EncodingLastRect            int32 = -224
	EncodingPointerPos          int32 = -232
	EncodingCursor              int32 = -239
	EncodingExtendedDesktopSize int32 = -308
)

// Bounds on what a server may make the Client hold. They are far above
// any real desktop and keep a broken or hostile server (or a fuzzer) from
// making the Client allocate without limit.
const (
	// MaxRectSide is the largest width or height of any rectangle.
	MaxRectSide = 16384
	// MaxFramebufferBytes is the largest framebuffer the Client keeps.
	MaxFramebufferBytes = 64 << 20

	maxNameLen   = 64 << 10 // desktop names and failure reasons
	maxServerCut = DefaultMaxCutText
)

// ServerInit is what the server tells the client about its desktop at the
// end of the handshake.
type ServerInit struct {
	Width, Height uint16
	Format        PixelFormat // the server's native pixel format
	Name          string      // desktop name
}

// Message describes one server message read by Client.ReadMessage.
type Message struct {
	Type uint8 // one of the Msg constants
	// Rects counts the rectangles of a FramebufferUpdate, pseudo-encodings
	// included, the LastRect marker not.
	Rects int
	// Skipped counts the pixel rectangles whose data was read but not
	// applied to the framebuffer: every ZRLE rectangle, and Raw and
	// CopyRect ones when the pixel format is not 32-bit true colour.
	Skipped int
	// Bytes is the size of the message on the wire, its type byte included.
	Bytes int64
	// Text is the clipboard of a ServerCutText in its classic form
	// (ISO 8859-1); it is empty for the extended-clipboard form.
	Text string
}

// Client is a minimal RFB viewer for tests and benchmarks. Call Handshake
// first. After that, one goroutine may call ReadMessage while others send
// messages: the send methods are safe for concurrent use.
type Client struct {
	r *bufio.Reader
	w io.Writer

	wmu  sync.Mutex // serialises sends and guards wbuf
	wbuf []byte

	fmu    sync.Mutex // guards format, which SetPixelFormat changes
	format PixelFormat

	// Used only by the reading goroutine.
	rbuf []byte
	n    int64 // bytes read of the current message
	fb   *image.RGBA
}

// NewClient returns a Client that speaks RFB over rw, typically a net.Conn
// or one end of a net.Pipe. The Client buffers its reads.
func NewClient(rw io.ReadWriter) *Client {
	return &Client{
		r:    bufio.NewReaderSize(rw, 64<<10),
		w:    rw,
		rbuf: make([]byte, 64),
		fb:   image.NewRGBA(image.Rectangle{}),
	}
}

// Handshake runs the client side of the RFB handshake: it answers the
// server's ProtocolVersion with the highest version both speak (3.8 for
// x11vnc), chooses security type None, sends ClientInit with the given
// shared flag and reads ServerInit. It fails if the server does not offer
// None or reports a failure, with the server's reason when there is one.
// The Client takes the server's pixel format until SetPixelFormat.
func (c *Client) Handshake(shared bool) (ServerInit, error) {
	b, err := c.read(12)
	if err != nil {
		return ServerInit{}, fmt.Errorf("read server ProtocolVersion: %w", err)
	}
	minor, err := serverVersion(b)
	if err != nil {
		return ServerInit{}, err
	}
	// RFC 6143 §7.1.1: the client answers with a version no higher than
	// the server's; 3.4 to 3.6 are spoken as 3.3, and newer or vendor
	// versions (Apple's 3.889) as 3.8.
	switch {
	case minor >= 8:
		minor = 8
	case minor < 7:
		minor = 3
	}
	if err := c.send(fmt.Appendf(nil, "RFB 003.%03d\n", minor)); err != nil {
		return ServerInit{}, fmt.Errorf("send ProtocolVersion: %w", err)
	}
	if err := c.security(minor); err != nil {
		return ServerInit{}, err
	}
	if err := c.send([]byte{boolByte(shared)}); err != nil {
		return ServerInit{}, fmt.Errorf("send ClientInit: %w", err)
	}

	b, err = c.read(4 + pixelFormatLen + 4)
	if err != nil {
		return ServerInit{}, fmt.Errorf("read ServerInit: %w", err)
	}
	si := ServerInit{
		Width:  binary.BigEndian.Uint16(b[0:]),
		Height: binary.BigEndian.Uint16(b[2:]),
		Format: parsePixelFormat(b[4:]),
	}
	nameLen := binary.BigEndian.Uint32(b[4+pixelFormatLen:])
	if err := si.Format.check(); err != nil {
		return ServerInit{}, fmt.Errorf("read ServerInit: %w", err)
	}
	if si.Name, err = c.readString(nameLen); err != nil {
		return ServerInit{}, fmt.Errorf("read ServerInit desktop name: %w", err)
	}
	if err := c.resize(int(si.Width), int(si.Height)); err != nil {
		return ServerInit{}, fmt.Errorf("read ServerInit: %w", err)
	}
	c.fmu.Lock()
	c.format = si.Format
	c.fmu.Unlock()
	return si, nil
}

// serverVersion parses a server's 12-byte ProtocolVersion and returns its
// minor version; only major version 3 exists.
func serverVersion(b []byte) (int, error) {
	minor := 0
	ok := string(b[:8]) == "RFB 003." && b[11] == '\n'
	for _, d := range b[8:11] {
		ok = ok && d >= '0' && d <= '9'
		minor = minor*10 + int(d-'0')
	}
	if !ok || minor < 3 {
		return 0, fmt.Errorf("server ProtocolVersion %q: %w", b, ErrProtocol)
	}
	return minor, nil
}

// security negotiates security type None in the given protocol version.
func (c *Client) security(minor int) error {
	if minor == 3 {
		// 3.3: the server decides and the client only learns the result.
		b, err := c.read(4)
		if err != nil {
			return fmt.Errorf("read security type: %w", err)
		}
		switch t := binary.BigEndian.Uint32(b); t {
		case securityNone:
			return nil
		case 0:
			return c.failure("server refused the connection")
		default:
			return fmt.Errorf("server requires security type %d, the client supports only None (1): %w", t, ErrProtocol)
		}
	}

	b, err := c.read(1)
	if err != nil {
		return fmt.Errorf("read security types: %w", err)
	}
	if b[0] == 0 {
		return c.failure("server refused the connection")
	}
	types, err := c.read(int(b[0]))
	if err != nil {
		return fmt.Errorf("read security types: %w", err)
	}
	if !slices.Contains(types, securityNone) {
		return fmt.Errorf("server offers security types %v, the client supports only None (1): %w", types, ErrProtocol)
	}
	if err := c.send([]byte{securityNone}); err != nil {
		return fmt.Errorf("send security type: %w", err)
	}
	if minor < 8 {
		// 3.7 sends a SecurityResult only after authentication, and
		// None has none.
		return nil
	}
	b, err = c.read(4)
	if err != nil {
		return fmt.Errorf("read SecurityResult: %w", err)
	}
	if binary.BigEndian.Uint32(b) != 0 {
		return c.failure("security handshake failed")
	}
	return nil
}

// failure reads the reason string a server sends before it closes a
// failed handshake and returns it as an error.
func (c *Client) failure(what string) error {
	b, err := c.read(4)
	if err != nil {
		return fmt.Errorf("%s, reading its reason: %w", what, err)
	}
	reason, err := c.readString(binary.BigEndian.Uint32(b))
	if err != nil {
		return fmt.Errorf("%s, reading its reason: %w", what, err)
	}
	return fmt.Errorf("%s: %q", what, reason)
}

// readString reads a length-prefixed string whose length n was already
// read, refusing lengths no server needs.
func (c *Client) readString(n uint32) (string, error) {
	if n > maxNameLen {
		return "", fmt.Errorf("string of %d bytes, at most %d allowed: %w", n, maxNameLen, ErrProtocol)
	}
	b, err := c.read(int(n))
	return string(b), err
}

// Format returns the pixel format the Client reads updates in.
func (c *Client) Format() PixelFormat {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	return c.format
}

// Framebuffer returns the Client's picture of the desktop. The image is
// owned by the Client and changes as updates are read; a resize may reuse
// its memory. Copy it to keep it, and read it only from the goroutine that
// calls ReadMessage.
func (c *Client) Framebuffer() *image.RGBA { return c.fb }

// SetPixelFormat asks the server for pixels in format pf and reads later
// updates in it. Send it before requesting updates: an update already on
// its way is in the old format and would be misread.
func (c *Client) SetPixelFormat(pf PixelFormat) error {
	if err := pf.check(); err != nil {
		return fmt.Errorf("send SetPixelFormat: %w", err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = append(c.wbuf[:0], msgSetPixelFormat, 0, 0, 0)
	c.wbuf = pf.appendTo(c.wbuf)
	if err := c.sendLocked(c.wbuf); err != nil {
		return fmt.Errorf("send SetPixelFormat: %w", err)
	}
	c.fmu.Lock()
	c.format = pf
	c.fmu.Unlock()
	return nil
}

// SetEncodings tells the server which encodings the Client accepts, most
// preferred first.
func (c *Client) SetEncodings(encodings ...int32) error {
	if len(encodings) > maxEncodings {
		return fmt.Errorf("send SetEncodings: %d encodings, at most %d allowed: %w", len(encodings), maxEncodings, ErrProtocol)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = append(c.wbuf[:0], msgSetEncodings, 0)
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, uint16(len(encodings)))
	for _, e := range encodings {
		c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, uint32(e))
	}
	if err := c.sendLocked(c.wbuf); err != nil {
		return fmt.Errorf("send SetEncodings: %w", err)
	}
	return nil
}

// RequestUpdate asks for the given area of the framebuffer: all of it, or
// with incremental only what changed since the last update.
func (c *Client) RequestUpdate(incremental bool, x, y, w, h uint16) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = append(c.wbuf[:0], msgFramebufferUpdateRequest, boolByte(incremental))
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, x)
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, y)
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, w)
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, h)
	if err := c.sendLocked(c.wbuf); err != nil {
		return fmt.Errorf("send FramebufferUpdateRequest: %w", err)
	}
	return nil
}

// Pointer moves the pointer to x, y with the buttons in mask pressed (bit 0
// is the left button, bits 3 and 4 the wheel).
func (c *Client) Pointer(mask uint8, x, y uint16) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = append(c.wbuf[:0], msgPointerEvent, mask)
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, x)
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, y)
	if err := c.sendLocked(c.wbuf); err != nil {
		return fmt.Errorf("send PointerEvent: %w", err)
	}
	return nil
}

// Key presses (down) or releases the key with the given X keysym.
func (c *Client) Key(down bool, keysym uint32) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = append(c.wbuf[:0], msgKeyEvent, boolByte(down), 0, 0)
	c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, keysym)
	if err := c.sendLocked(c.wbuf); err != nil {
		return fmt.Errorf("send KeyEvent: %w", err)
	}
	return nil
}

// CutText sets the server's clipboard in the classic form, whose text is
// ISO 8859-1: the bytes of s are sent as they are.
func (c *Client) CutText(s string) error {
	if len(s) > DefaultMaxCutText {
		return fmt.Errorf("send ClientCutText: %d bytes, at most %d allowed: %w", len(s), DefaultMaxCutText, ErrProtocol)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = append(c.wbuf[:0], msgClientCutText, 0, 0, 0)
	c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, uint32(len(s)))
	c.wbuf = append(c.wbuf, s...)
	if err := c.sendLocked(c.wbuf); err != nil {
		return fmt.Errorf("send ClientCutText: %w", err)
	}
	return nil
}

// send writes one whole message, so that concurrent senders never
// interleave their bytes.
func (c *Client) send(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.sendLocked(b)
}

func (c *Client) sendLocked(b []byte) error {
	_, err := c.w.Write(b)
	return err
}

// read reads exactly n bytes into the Client's read buffer and returns
// them; they are valid until the next read.
func (c *Client) read(n int) ([]byte, error) {
	if n > cap(c.rbuf) {
		c.rbuf = make([]byte, n)
	}
	b := c.rbuf[:n]
	m, err := io.ReadFull(c.r, b)
	c.n += int64(m)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// skip reads and discards n bytes without buffering them whole.
func (c *Client) skip(n int64) error {
	for n > 0 {
		chunk := min(n, 1<<30)
		m, err := c.r.Discard(int(chunk))
		c.n += int64(m)
		n -= int64(m)
		if err != nil {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}
