package rfb

import (
	"encoding/binary"
	"fmt"
	"image"
)

// ReadMessage reads one server message. A FramebufferUpdate is walked
// rectangle by rectangle: Raw and CopyRect rectangles are applied to the
// framebuffer when the pixel format is 32-bit true colour, ZRLE ones are
// skipped, and DesktopSize and ExtendedDesktopSize resize the framebuffer.
// Any other encoding is an error, since its length cannot be known; announce
// only the Encoding constants with SetEncodings. On an error the returned
// Message describes what was read before it, and the connection is no
// longer usable.
func (c *Client) ReadMessage() (Message, error) {
	c.n = 0
	var m Message
	b, err := c.read(1)
	if err != nil {
		return m, fmt.Errorf("read server message type: %w", err)
	}
	m.Type = b[0]
	switch m.Type {
	case MsgFramebufferUpdate:
		err = c.readUpdate(&m)
	case MsgSetColourMapEntries:
		err = c.readColourMap()
	case MsgBell, MsgEndOfContinuousUpdates:
	case MsgServerCutText:
		m.Text, err = c.readCutText()
	case MsgServerFence:
		err = c.readFence()
	default:
		err = fmt.Errorf("unknown server message type %d: %w", m.Type, ErrProtocol)
	}
	m.Bytes = c.n
	return m, err
}

// readUpdate reads the rest of a FramebufferUpdate.
func (c *Client) readUpdate(m *Message) error {
	b, err := c.read(3)
	if err != nil {
		return fmt.Errorf("read FramebufferUpdate header: %w", err)
	}
	n := int(binary.BigEndian.Uint16(b[1:]))
	// The format cannot change inside an update; take it once.
	pf := c.Format()
	for i := 0; i < n; i++ {
		last, err := c.readRect(m, pf)
		if err != nil {
			return fmt.Errorf("read FramebufferUpdate rectangle %d of %d: %w", i, n, err)
		}
		if last {
			return nil
		}
	}
	return nil
}

// readRect reads one rectangle of an update and reports whether it was the
// LastRect marker.
func (c *Client) readRect(m *Message, pf PixelFormat) (last bool, err error) {
	b, err := c.read(12)
	if err != nil {
		return false, err
	}
	x := int(binary.BigEndian.Uint16(b[0:]))
	y := int(binary.BigEndian.Uint16(b[2:]))
	w := int(binary.BigEndian.Uint16(b[4:]))
	h := int(binary.BigEndian.Uint16(b[6:]))
	enc := int32(binary.BigEndian.Uint32(b[8:]))
	if w > MaxRectSide || h > MaxRectSide {
		return false, fmt.Errorf("%dx%d rectangle, at most %d a side: %w", w, h, MaxRectSide, ErrProtocol)
	}
	if enc == EncodingLastRect {
		return true, nil
	}
	m.Rects++
	bpp := pf.bytesPerPixel()

	switch enc {
	case EncodingRaw, EncodingCopyRect, EncodingZRLE:
		if err := c.inside(x, y, w, h); err != nil {
			return false, fmt.Errorf("encoding %d: %w", enc, err)
		}
	}
	switch enc {
	case EncodingRaw:
		if !pf.decodable() {
			m.Skipped++
			return false, c.skip(int64(w) * int64(h) * int64(bpp))
		}
		return false, c.readRaw(pf, x, y, w, h)
	case EncodingCopyRect:
		b, err := c.read(4)
		if err != nil {
			return false, err
		}
		sx := int(binary.BigEndian.Uint16(b[0:]))
		sy := int(binary.BigEndian.Uint16(b[2:]))
		if !pf.decodable() {
			m.Skipped++
			return false, nil
		}
		if err := c.inside(sx, sy, w, h); err != nil {
			return false, fmt.Errorf("CopyRect source: %w", err)
		}
		c.copyRect(sx, sy, x, y, w, h)
		return false, nil
	case EncodingZRLE:
		b, err := c.read(4)
		if err != nil {
			return false, err
		}
		m.Skipped++
		return false, c.skip(int64(binary.BigEndian.Uint32(b)))
	case EncodingDesktopSize:
		return false, c.resize(w, h)
	case EncodingExtendedDesktopSize:
		b, err := c.read(4)
		if err != nil {
			return false, err
		}
		if err := c.skip(16 * int64(b[0])); err != nil {
			return false, err
		}
		// A refused resize (y, the status, non-zero) repeats the current
		// size, so resizing is right either way.
		return false, c.resize(w, h)
	case EncodingCursor:
		// The cursor image in the pixel format, then a 1-bit mask whose
		// rows are padded to whole bytes.
		return false, c.skip(int64(w)*int64(h)*int64(bpp) + int64((w+7)/8)*int64(h))
	case EncodingPointerPos:
		return false, nil
	}
	return false, fmt.Errorf("unknown encoding %d: %w", enc, ErrProtocol)
}

// inside reports a rectangle that does not lie within the framebuffer.
func (c *Client) inside(x, y, w, h int) error {
	if b := c.fb.Rect; x+w > b.Dx() || y+h > b.Dy() {
		return fmt.Errorf("rectangle %dx%d at %d,%d outside the %dx%d framebuffer: %w", w, h, x, y, b.Dx(), b.Dy(), ErrProtocol)
	}
	return nil
}

// readRaw reads a Raw rectangle of a 32-bit true-colour format into the
// framebuffer, row by row so that the read buffer stays one row long.
func (c *Client) readRaw(pf PixelFormat, x, y, w, h int) error {
	for j := 0; j < h; j++ {
		row, err := c.read(4 * w)
		if err != nil {
			return err
		}
		dst := c.fb.Pix[c.fb.PixOffset(x, y+j):]
		for i := 0; i < w; i++ {
			d := dst[4*i : 4*i+4 : 4*i+4]
			d[0], d[1], d[2] = pf.rgba(row[4*i:])
			d[3] = 0xff
		}
	}
	return nil
}

// copyRect copies a w×h area from sx, sy to x, y within the framebuffer.
// The areas may overlap: rows go bottom-up when moving down, and copy
// handles the overlap within a row.
func (c *Client) copyRect(sx, sy, x, y, w, h int) {
	fb := c.fb
	row := func(j int) {
		copy(fb.Pix[fb.PixOffset(x, y+j):][:4*w], fb.Pix[fb.PixOffset(sx, sy+j):][:4*w])
	}
	if sy < y {
		for j := h - 1; j >= 0; j-- {
			row(j)
		}
		return
	}
	for j := 0; j < h; j++ {
		row(j)
	}
}

// resize gives the framebuffer a new size, keeping it if the size is the
// same. It reuses the old memory when it is large enough and otherwise at
// least doubles it, so a server that keeps resizing cannot make the Client
// allocate more than twice MaxFramebufferBytes in total.
func (c *Client) resize(w, h int) error {
	if w > MaxRectSide || h > MaxRectSide || 4*w*h > MaxFramebufferBytes {
		return fmt.Errorf("%dx%d framebuffer, at most %d bytes allowed: %w", w, h, MaxFramebufferBytes, ErrProtocol)
	}
	if c.fb.Rect.Dx() == w && c.fb.Rect.Dy() == h {
		return nil
	}
	need := 4 * w * h
	pix := c.fb.Pix
	if cap(pix) < need {
		pix = make([]byte, need, min(max(need, 2*cap(pix)), MaxFramebufferBytes))
	}
	pix = pix[:need]
	// Opaque black, as a screen is before anything is drawn.
	for i := 0; i < len(pix); i += 4 {
		pix[i], pix[i+1], pix[i+2], pix[i+3] = 0, 0, 0, 0xff
	}
	c.fb = &image.RGBA{Pix: pix, Stride: 4 * w, Rect: image.Rect(0, 0, w, h)}
	return nil
}

// readColourMap skips a SetColourMapEntries: the Client decodes only
// true-colour pixels.
func (c *Client) readColourMap() error {
	b, err := c.read(5)
	if err != nil {
		return fmt.Errorf("read SetColourMapEntries: %w", err)
	}
	if err := c.skip(6 * int64(binary.BigEndian.Uint16(b[3:]))); err != nil {
		return fmt.Errorf("read SetColourMapEntries: %w", err)
	}
	return nil
}

// readCutText reads a ServerCutText and returns its text in the classic
// form, or "" for the extended-clipboard form, whose negative length marks
// a binary payload the Client does not parse.
func (c *Client) readCutText() (string, error) {
	b, err := c.read(7)
	if err != nil {
		return "", fmt.Errorf("read ServerCutText: %w", err)
	}
	n := int64(int32(binary.BigEndian.Uint32(b[3:])))
	extended := n < 0
	if extended {
		n = -n
	}
	if n > maxServerCut {
		return "", fmt.Errorf("read ServerCutText: %d bytes, at most %d allowed: %w", n, maxServerCut, ErrProtocol)
	}
	if extended {
		if err := c.skip(n); err != nil {
			return "", fmt.Errorf("read ServerCutText: %w", err)
		}
		return "", nil
	}
	// Read through the bufio.Reader in pieces rather than allocating the
	// announced length up front, so that a short stream costs little.
	buf := make([]byte, 0, min(n, 4<<10))
	for int64(len(buf)) < n {
		b, err := c.read(int(min(n-int64(len(buf)), 4<<10)))
		if err != nil {
			return "", fmt.Errorf("read ServerCutText: %w", err)
		}
		buf = append(buf, b...)
	}
	return string(buf), nil
}

// readFence skips a ServerFence. The Client never sends a fence, so it
// need not answer one.
func (c *Client) readFence() error {
	b, err := c.read(8)
	if err != nil {
		return fmt.Errorf("read ServerFence: %w", err)
	}
	if n := b[7]; n > maxFencePayload {
		return fmt.Errorf("read ServerFence: payload of %d bytes, at most %d allowed: %w", n, maxFencePayload, ErrProtocol)
	}
	if err := c.skip(int64(b[7])); err != nil {
		return fmt.Errorf("read ServerFence: %w", err)
	}
	return nil
}
