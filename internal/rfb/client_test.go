package rfb

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"io"
	"net"
	"strings"
	"testing"
)

// defaultFormatWire is DefaultFormat as RFC 6143 §7.4 lays it out, written
// by hand so the encoder is checked, not trusted.
var defaultFormatWire = []byte{32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}

// serverHello is what x11vnc -nopw sends up to and including ServerInit:
// version 3.8, security None, a w×h desktop in format pf.
func serverHello(w, h uint16, pf []byte, name string) []byte {
	return cat([]byte("RFB 003.008\n"), []byte{1, 1}, be32(0),
		be16(w), be16(h), pf, be32(uint32(len(name))), []byte(name))
}

// le32Pixel is a pixel of DefaultFormat on the wire: 0x00RRGGBB,
// little-endian.
func le32Pixel(c color.RGBA) []byte { return []byte{c.B, c.G, c.R, 0} }

// rect is a rectangle header.
func rect(x, y, w, h uint16, enc int32) []byte {
	return cat(be16(x), be16(y), be16(w), be16(h), be32(uint32(enc)))
}

// fakeServer plays the server side of a net.Pipe: the test scripts it from
// its own goroutine while the Client runs in the test's.
type fakeServer struct {
	conn net.Conn
	errc chan error
}

func newFakeServer(t *testing.T, script func(s *fakeServer) error) (*Client, *fakeServer) {
	t.Helper()
	cc, sc := net.Pipe()
	s := &fakeServer{conn: sc, errc: make(chan error, 1)}
	go func() {
		s.errc <- script(s)
		sc.Close()
	}()
	t.Cleanup(func() {
		cc.Close()
		if err := <-s.errc; err != nil {
			t.Errorf("fake server: %v", err)
		}
	})
	return NewClient(cc), s
}

func (s *fakeServer) write(b ...[]byte) error {
	_, err := s.conn.Write(cat(b...))
	return err
}

// expect reads len(want) bytes and checks they are want.
func (s *fakeServer) expect(what string, want []byte) error {
	got := make([]byte, len(want))
	if _, err := io.ReadFull(s.conn, got); err != nil {
		return errors.New("read " + what + ": " + err.Error())
	}
	if !bytes.Equal(got, want) {
		return errors.New(what + ": got " + string(hexBytes(got)) + ", want " + string(hexBytes(want)))
	}
	return nil
}

func hexBytes(b []byte) []byte {
	const digits = "0123456789abcdef"
	var out []byte
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15], ' ')
	}
	return out
}

func TestClientUpdate(t *testing.T) {
	red := color.RGBA{0xff, 0, 0, 0xff}
	green := color.RGBA{0, 0xff, 0, 0xff}
	blue := color.RGBA{0, 0, 0xff, 0xff}
	grey := color.RGBA{0x12, 0x34, 0x56, 0xff}
	black := color.RGBA{0, 0, 0, 0xff}
	raw := [][]color.RGBA{{red, green, blue, grey}, {grey, blue, green, red}}

	var rawBytes []byte
	for _, row := range raw {
		for _, c := range row {
			rawBytes = append(rawBytes, le32Pixel(c)...)
		}
	}
	update := cat(
		[]byte{MsgFramebufferUpdate, 0}, be16(0xffff), // up to LastRect
		rect(0, 0, 32, 16, EncodingDesktopSize),
		rect(1, 2, 4, 2, EncodingRaw), rawBytes,
		rect(20, 10, 4, 2, EncodingCopyRect), be16(1), be16(2),
		rect(0, 0, 32, 16, EncodingZRLE), be32(10), bytes.Repeat([]byte{0xee}, 10),
		rect(1, 1, 9, 3, EncodingCursor), make([]byte, 9*3*4+2*3),
		rect(5, 6, 0, 0, EncodingPointerPos),
		rect(0, 0, 0, 0, EncodingLastRect),
	)

	c, _ := newFakeServer(t, func(s *fakeServer) error {
		if err := s.write([]byte("RFB 003.008\n")); err != nil {
			return err
		}
		if err := s.expect("ProtocolVersion", []byte("RFB 003.008\n")); err != nil {
			return err
		}
		if err := s.write([]byte{2, 2, 1}); err != nil { // VNC auth or None
			return err
		}
		if err := s.expect("security type", []byte{1}); err != nil {
			return err
		}
		if err := s.write(be32(0)); err != nil {
			return err
		}
		if err := s.expect("ClientInit", []byte{1}); err != nil {
			return err
		}
		if err := s.write(be16(64), be16(48), defaultFormatWire, be32(6), []byte("test:0")); err != nil {
			return err
		}
		if err := s.expect("SetPixelFormat", cat([]byte{0, 0, 0, 0}, defaultFormatWire)); err != nil {
			return err
		}
		if err := s.expect("SetEncodings", cat([]byte{2, 0}, be16(3), be32(16), be32(0), be32(uint32(0xffffff21)))); err != nil {
			return err
		}
		if err := s.expect("FramebufferUpdateRequest", cat([]byte{3, 0}, be16(0), be16(0), be16(64), be16(48))); err != nil {
			return err
		}
		return s.write(update)
	})

	si, err := c.Handshake(true)
	if err != nil {
		t.Fatalf("Handshake: %v", err)
	}
	if want := (ServerInit{Width: 64, Height: 48, Format: DefaultFormat, Name: "test:0"}); si != want {
		t.Errorf("Handshake = %+v, want %+v", si, want)
	}
	if got := c.Framebuffer().Bounds(); got != image.Rect(0, 0, 64, 48) {
		t.Errorf("framebuffer after ServerInit is %v, want 64x48", got)
	}
	if err := c.SetPixelFormat(DefaultFormat); err != nil {
		t.Fatal(err)
	}
	if err := c.SetEncodings(EncodingZRLE, EncodingRaw, EncodingDesktopSize); err != nil {
		t.Fatal(err)
	}
	if err := c.RequestUpdate(false, 0, 0, 64, 48); err != nil {
		t.Fatal(err)
	}
	m, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("ReadMessage: %v", err)
	}
	want := Message{Type: MsgFramebufferUpdate, Rects: 6, Skipped: 1, Bytes: int64(len(update))}
	if m != want {
		t.Errorf("ReadMessage = %+v, want %+v", m, want)
	}

	fb := c.Framebuffer()
	if got := fb.Bounds(); got != image.Rect(0, 0, 32, 16) {
		t.Fatalf("framebuffer after DesktopSize is %v, want 32x16", got)
	}
	wantAt := func(x, y int) color.RGBA {
		switch {
		case x >= 1 && x < 5 && y >= 2 && y < 4:
			return raw[y-2][x-1]
		case x >= 20 && x < 24 && y >= 10 && y < 12:
			// Copied from 1,2: the Raw rectangle.
			return raw[y-10][x-20]
		}
		return black
	}
	for y := range 16 {
		for x := range 32 {
			if got, want := fb.RGBAAt(x, y), wantAt(x, y); got != want {
				t.Errorf("pixel %d,%d = %v, want %v", x, y, got, want)
			}
		}
	}
}

// testHandshake runs a Client through serverHello on an in-memory stream and
// returns it with what it wrote.
func testHandshake(t *testing.T, w, h uint16, pf []byte, rest []byte) (*Client, *bytes.Buffer) {
	t.Helper()
	var sent bytes.Buffer
	c := NewClient(struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(cat(serverHello(w, h, pf, "x"), rest)), &sent})
	if _, err := c.Handshake(false); err != nil {
		t.Fatalf("Handshake: %v", err)
	}
	return c, &sent
}

func TestClientCopyRectOverlap(t *testing.T) {
	// A 4x4 Raw picture whose every pixel differs, then copies of it onto
	// itself shifted in each direction, checked against a naive copy
	// through a snapshot.
	var raw []byte
	for i := range 16 {
		raw = append(raw, byte(i), byte(16*i), byte(255-i), 0)
	}
	shifts := [][2]int{{1, 1}, {-1, -1}, {1, -1}, {-1, 1}, {0, 1}, {1, 0}, {0, -1}, {-1, 0}}
	var msgs []byte
	for _, d := range shifts {
		// Copy the 2x2 area at 1,1 by d.
		msgs = cat(msgs, []byte{0, 0}, be16(1),
			rect(uint16(1+d[0]), uint16(1+d[1]), 2, 2, EncodingCopyRect), be16(1), be16(1))
	}
	c, _ := testHandshake(t, 4, 4, defaultFormatWire, cat([]byte{0, 0}, be16(1), rect(0, 0, 4, 4, EncodingRaw), raw, msgs))
	if _, err := c.ReadMessage(); err != nil {
		t.Fatal(err)
	}
	for _, d := range shifts {
		before := image.NewRGBA(c.Framebuffer().Rect)
		copy(before.Pix, c.Framebuffer().Pix)
		if _, err := c.ReadMessage(); err != nil {
			t.Fatalf("shift %v: %v", d, err)
		}
		for y := range 4 {
			for x := range 4 {
				want := before.RGBAAt(x, y)
				if sx, sy := x-d[0], y-d[1]; x >= 1+d[0] && x < 3+d[0] && y >= 1+d[1] && y < 3+d[1] {
					want = before.RGBAAt(sx, sy)
				}
				if got := c.Framebuffer().RGBAAt(x, y); got != want {
					t.Errorf("shift %v: pixel %d,%d = %v, want %v", d, x, y, got, want)
				}
			}
		}
	}
}

func TestClientPixelFormats(t *testing.T) {
	c := color.RGBA{0x12, 0x34, 0x56, 0xff}
	tests := []struct {
		name  string
		wire  []byte // the format as the server announces it
		pixel []byte // c in that format
		want  color.RGBA
	}{
		{"default", defaultFormatWire, []byte{0x56, 0x34, 0x12, 0}, c},
		{"big-endian", []byte{32, 24, 1, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}, []byte{0, 0x12, 0x34, 0x56}, c},
		{"BGR", []byte{32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 0, 8, 16, 0, 0, 0}, []byte{0x12, 0x34, 0x56, 0}, c},
		{"BGR big-endian high bits", []byte{32, 24, 1, 1, 0, 255, 0, 255, 0, 255, 8, 16, 24, 0, 0, 0}, []byte{0x56, 0x34, 0x12, 0}, c},
		// 10 bits a channel: 0x3ff is full intensity, 0x200 about half, 0x100 a quarter.
		{"30-bit", []byte{32, 30, 0, 1, 0x03, 0xff, 0x03, 0xff, 0x03, 0xff, 20, 10, 0, 0, 0, 0},
			be32le(0x3ff<<20 | 0x200<<10 | 0x100), color.RGBA{0xff, 0x7f, 0x3f, 0xff}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, _ := testHandshake(t, 1, 1, tt.wire, cat([]byte{0, 0}, be16(1), rect(0, 0, 1, 1, EncodingRaw), tt.pixel))
			m, err := cl.ReadMessage()
			if err != nil {
				t.Fatal(err)
			}
			if m.Skipped != 0 {
				t.Errorf("Skipped = %d, want 0", m.Skipped)
			}
			if got := cl.Framebuffer().RGBAAt(0, 0); got != tt.want {
				t.Errorf("pixel = %v, want %v", got, tt.want)
			}
		})
	}
}

func be32le(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }

// A 16-bit format is read, sized right and skipped.
func TestClientSkipsOtherFormats(t *testing.T) {
	rgb565 := []byte{16, 16, 0, 1, 0, 31, 0, 63, 0, 31, 11, 5, 0, 0, 0, 0}
	rest := cat([]byte{0, 0}, be16(3),
		rect(0, 0, 2, 2, EncodingRaw), make([]byte, 2*2*2),
		rect(0, 0, 1, 1, EncodingCopyRect), be16(1), be16(1),
		rect(0, 0, 3, 2, EncodingCursor), make([]byte, 3*2*2+1*2),
		[]byte{MsgBell})
	c, _ := testHandshake(t, 2, 2, rgb565, rest)
	m, err := c.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	if want := (Message{Type: MsgFramebufferUpdate, Rects: 3, Skipped: 2, Bytes: int64(len(rest) - 1)}); m != want {
		t.Errorf("ReadMessage = %+v, want %+v", m, want)
	}
	if m, err := c.ReadMessage(); err != nil || m.Type != MsgBell {
		t.Errorf("ReadMessage after the update = %+v, %v; want a Bell", m, err)
	}
}

func TestClientOtherMessages(t *testing.T) {
	screen := cat(be32(7), be16(0), be16(0), be16(40), be16(30), be32(0))
	tests := []struct {
		name string
		in   []byte
		want Message
		size image.Rectangle // framebuffer after the message
	}{
		{"Bell", []byte{2}, Message{Type: MsgBell, Bytes: 1}, image.Rect(0, 0, 8, 8)},
		{"SetColourMapEntries", cat([]byte{1, 0}, be16(0), be16(2), make([]byte, 12)), Message{Type: MsgSetColourMapEntries, Bytes: 18}, image.Rect(0, 0, 8, 8)},
		{"ServerCutText", cat([]byte{3, 0, 0, 0}, be32(5), []byte("hallo")), Message{Type: MsgServerCutText, Bytes: 13, Text: "hallo"}, image.Rect(0, 0, 8, 8)},
		{"ServerCutText extended", cat([]byte{3, 0, 0, 0}, neg32(4), be32(0x01000001)), Message{Type: MsgServerCutText, Bytes: 12}, image.Rect(0, 0, 8, 8)},
		{"EndOfContinuousUpdates", []byte{150}, Message{Type: MsgEndOfContinuousUpdates, Bytes: 1}, image.Rect(0, 0, 8, 8)},
		{"ServerFence", cat([]byte{248, 0, 0, 0}, be32(0x80000001), []byte{2, 'h', 'i'}), Message{Type: MsgServerFence, Bytes: 11}, image.Rect(0, 0, 8, 8)},
		{"ExtendedDesktopSize", cat([]byte{0, 0}, be16(1), rect(0, 0, 40, 30, EncodingExtendedDesktopSize), []byte{1, 0, 0, 0}, screen),
			Message{Type: MsgFramebufferUpdate, Rects: 1, Bytes: 4 + 12 + 4 + 16}, image.Rect(0, 0, 40, 30)},
		{"empty update", cat([]byte{0, 0}, be16(0)), Message{Type: MsgFramebufferUpdate, Bytes: 4}, image.Rect(0, 0, 8, 8)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := testHandshake(t, 8, 8, defaultFormatWire, tt.in)
			m, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("ReadMessage: %v", err)
			}
			if m != tt.want {
				t.Errorf("ReadMessage = %+v, want %+v", m, tt.want)
			}
			if got := c.Framebuffer().Rect; got != tt.size {
				t.Errorf("framebuffer %v, want %v", got, tt.size)
			}
			if _, err := c.ReadMessage(); !errors.Is(err, io.EOF) {
				t.Errorf("ReadMessage at the end = %v, want EOF: the message was not read whole", err)
			}
		})
	}
}

func TestClientBadMessages(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{"unknown type", []byte{4}},
		{"unknown encoding", cat([]byte{0, 0}, be16(1), rect(0, 0, 1, 1, 5))},
		{"Raw outside", cat([]byte{0, 0}, be16(1), rect(7, 0, 2, 1, EncodingRaw), make([]byte, 8))},
		{"CopyRect source outside", cat([]byte{0, 0}, be16(1), rect(0, 0, 2, 2, EncodingCopyRect), be16(7), be16(0))},
		{"ZRLE outside", cat([]byte{0, 0}, be16(1), rect(0, 8, 1, 1, EncodingZRLE), be32(0))},
		{"rectangle too large", cat([]byte{0, 0}, be16(1), rect(0, 0, MaxRectSide+1, 1, EncodingCursor))},
		{"framebuffer too large", cat([]byte{0, 0}, be16(1), rect(0, 0, 16384, 1025, EncodingDesktopSize))},
		{"cut text too long", cat([]byte{3, 0, 0, 0}, be32(DefaultMaxCutText+1))},
		{"fence payload 65", cat([]byte{248, 0, 0, 0}, be32(0), []byte{65})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := testHandshake(t, 8, 8, defaultFormatWire, tt.in)
			if _, err := c.ReadMessage(); !errors.Is(err, ErrProtocol) {
				t.Errorf("ReadMessage = %v, want an error wrapping ErrProtocol", err)
			}
		})
	}
}

func TestClientHandshake(t *testing.T) {
	init := cat(be16(8), be16(8), defaultFormatWire, be32(1), []byte("x"))
	tests := []struct {
		name    string
		server  []byte
		sent    []byte // what the client must have written
		wantErr string // part of the error, "" for success
	}{
		{"3.8", cat([]byte("RFB 003.008\n"), []byte{1, 1}, be32(0), init), cat([]byte("RFB 003.008\n"), []byte{1, 0}), ""},
		{"3.889", cat([]byte("RFB 003.889\n"), []byte{2, 30, 1}, be32(0), init), cat([]byte("RFB 003.008\n"), []byte{1, 0}), ""},
		{"3.7 without SecurityResult", cat([]byte("RFB 003.007\n"), []byte{1, 1}, init), cat([]byte("RFB 003.007\n"), []byte{1, 0}), ""},
		{"3.3", cat([]byte("RFB 003.003\n"), be32(1), init), cat([]byte("RFB 003.003\n"), []byte{0}), ""},
		{"3.5 spoken as 3.3", cat([]byte("RFB 003.005\n"), be32(1), init), cat([]byte("RFB 003.003\n"), []byte{0}), ""},
		{"None not offered", cat([]byte("RFB 003.008\n"), []byte{2, 2, 16}), []byte("RFB 003.008\n"), "supports only None"},
		{"refused with reason", cat([]byte("RFB 003.008\n"), []byte{0}, be32(9), []byte("too many!")), []byte("RFB 003.008\n"), "too many!"},
		{"SecurityResult failed", cat([]byte("RFB 003.008\n"), []byte{1, 1}, be32(1), be32(4), []byte("nope")), cat([]byte("RFB 003.008\n"), []byte{1}), "nope"},
		{"3.3 VNC auth", cat([]byte("RFB 003.003\n"), be32(2)), []byte("RFB 003.003\n"), "security type 2"},
		{"3.3 refused", cat([]byte("RFB 003.003\n"), be32(0), be32(3), []byte("bye")), []byte("RFB 003.003\n"), "bye"},
		{"not RFB", []byte("SSH-2.0-Open"), nil, "ProtocolVersion"},
		{"version 2", []byte("RFB 002.000\n"), nil, "ProtocolVersion"},
		{"short", []byte("RFB 003.0"), nil, "EOF"},
		{"24-bit pixels", cat([]byte("RFB 003.008\n"), []byte{1, 1}, be32(0), be16(8), be16(8), []byte{24, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}, be32(0)), cat([]byte("RFB 003.008\n"), []byte{1, 0}), "24 bits per pixel"},
		{"huge desktop", cat([]byte("RFB 003.008\n"), []byte{1, 1}, be32(0), be16(65535), be16(65535), defaultFormatWire, be32(0)), cat([]byte("RFB 003.008\n"), []byte{1, 0}), "framebuffer"},
		{"huge name", cat([]byte("RFB 003.008\n"), []byte{1, 1}, be32(0), be16(8), be16(8), defaultFormatWire, be32(1<<30)), cat([]byte("RFB 003.008\n"), []byte{1, 0}), "desktop name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sent bytes.Buffer
			c := NewClient(struct {
				io.Reader
				io.Writer
			}{bytes.NewReader(tt.server), &sent})
			_, err := c.Handshake(false)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Handshake: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Handshake = %v, want an error containing %q", err, tt.wantErr)
			}
			if !bytes.Equal(sent.Bytes(), tt.sent) {
				t.Errorf("client sent %q, want %q", sent.Bytes(), tt.sent)
			}
		})
	}
}

// Everything the Client sends is a stream the Filter accepts unchanged
// (but for the shared flag), and a view-only Filter keeps only what does
// not act on the desktop.
func TestClientOutputPassesFilter(t *testing.T) {
	c, sent := testHandshake(t, 8, 8, defaultFormatWire, nil)
	hello := bytes.Clone(sent.Bytes())
	steps := []struct {
		send  func() error
		input bool
	}{
		{func() error { return c.SetPixelFormat(DefaultFormat) }, false},
		{func() error {
			return c.SetEncodings(EncodingZRLE, EncodingCopyRect, EncodingRaw, EncodingDesktopSize, EncodingExtendedDesktopSize,
				EncodingLastRect, EncodingCursor, EncodingPointerPos)
		}, false},
		{func() error { return c.RequestUpdate(true, 0, 0, 8, 8) }, false},
		{func() error { return c.Pointer(1, 3, 4) }, true},
		{func() error { return c.Key(true, 0xff0d) }, true},
		{func() error { return c.Key(false, 0xff0d) }, true},
		{func() error { return c.CutText("clip board") }, true},
	}
	wantView := cat(hello[:len(hello)-1], []byte{1})
	for _, s := range steps {
		before := sent.Len()
		if err := s.send(); err != nil {
			t.Fatal(err)
		}
		if !s.input {
			wantView = append(wantView, sent.Bytes()[before:]...)
		}
	}
	wantControl := cat(hello[:len(hello)-1], []byte{1}, sent.Bytes()[len(hello):])
	for _, tt := range []struct {
		viewOnly bool
		want     []byte
	}{{false, wantControl}, {true, wantView}} {
		got, err := feedAll(NewFilter(FilterOptions{ViewOnly: tt.viewOnly}), sent.Bytes(), nil)
		if err != nil {
			t.Fatalf("viewOnly=%v: Filter: %v", tt.viewOnly, err)
		}
		if !bytes.Equal(got, tt.want) {
			t.Errorf("viewOnly=%v: Filter forwarded %x, want %x", tt.viewOnly, got, tt.want)
		}
	}
}
