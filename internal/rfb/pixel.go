package rfb

import (
	"encoding/binary"
	"fmt"
)

// PixelFormat is the RFB description of how a pixel is laid out on the wire
// (RFC 6143 §7.4).
type PixelFormat struct {
	BitsPerPixel uint8 // 8, 16 or 32
	Depth        uint8 // useful bits in a pixel
	BigEndian    bool  // byte order of multi-byte pixels
	TrueColour   bool  // false means pixels index a colour map
	RedMax       uint16
	GreenMax     uint16
	BlueMax      uint16
	RedShift     uint8
	GreenShift   uint8
	BlueShift    uint8
}

// DefaultFormat is the format tests ask the server for: 32 bits per pixel,
// little-endian, 8 bits a channel as 0x00RRGGBB, the native format of
// x11vnc on a 24-bit X screen, so the server does not convert and every
// pixel the Client decodes can be compared exactly with a PNG screenshot.
var DefaultFormat = PixelFormat{
	BitsPerPixel: 32,
	Depth:        24,
	TrueColour:   true,
	RedMax:       255,
	GreenMax:     255,
	BlueMax:      255,
	RedShift:     16,
	GreenShift:   8,
	BlueShift:    0,
}

// pixelFormatLen is the size of a PixelFormat on the wire, padding included.
const pixelFormatLen = 16

// appendTo appends pf in its 16-byte wire form to b.
func (pf PixelFormat) appendTo(b []byte) []byte {
	return append(b,
		pf.BitsPerPixel, pf.Depth, boolByte(pf.BigEndian), boolByte(pf.TrueColour),
		byte(pf.RedMax>>8), byte(pf.RedMax), byte(pf.GreenMax>>8), byte(pf.GreenMax),
		byte(pf.BlueMax>>8), byte(pf.BlueMax),
		pf.RedShift, pf.GreenShift, pf.BlueShift,
		0, 0, 0)
}

// parsePixelFormat reads a PixelFormat from its 16-byte wire form.
func parsePixelFormat(b []byte) PixelFormat {
	return PixelFormat{
		BitsPerPixel: b[0],
		Depth:        b[1],
		BigEndian:    b[2] != 0,
		TrueColour:   b[3] != 0,
		RedMax:       binary.BigEndian.Uint16(b[4:]),
		GreenMax:     binary.BigEndian.Uint16(b[6:]),
		BlueMax:      binary.BigEndian.Uint16(b[8:]),
		RedShift:     b[10],
		GreenShift:   b[11],
		BlueShift:    b[12],
	}
}

// check reports a format no RFB peer may use; the Client sizes every
// rectangle from BitsPerPixel, so it must be one of the three allowed.
func (pf PixelFormat) check() error {
	switch pf.BitsPerPixel {
	case 8, 16, 32:
		return nil
	}
	return fmt.Errorf("pixel format with %d bits per pixel: %w", pf.BitsPerPixel, ErrProtocol)
}

// bytesPerPixel is the size of one pixel on the wire.
func (pf PixelFormat) bytesPerPixel() int { return int(pf.BitsPerPixel) / 8 }

// decodable reports whether the Client turns pixels of this format into
// RGBA; others are read and skipped.
func (pf PixelFormat) decodable() bool { return pf.BitsPerPixel == 32 && pf.TrueColour }

// rgba turns one 32-bit pixel of a true-colour format into 8-bit channels,
// scaling each from 0..max to 0..255 so formats with fewer bits per channel
// still compare with a screenshot.
func (pf PixelFormat) rgba(b []byte) (r, g, bl uint8) {
	var v uint32
	if pf.BigEndian {
		v = binary.BigEndian.Uint32(b)
	} else {
		v = binary.LittleEndian.Uint32(b)
	}
	return channel(v, pf.RedShift, pf.RedMax), channel(v, pf.GreenShift, pf.GreenMax), channel(v, pf.BlueShift, pf.BlueMax)
}

// channel extracts one colour channel of pixel v and scales it to 0..255.
func channel(v uint32, shift uint8, limit uint16) uint8 {
	if limit == 0 || shift >= 32 {
		return 0
	}
	c := (v >> shift) & uint32(limit)
	if limit == 255 {
		return uint8(c)
	}
	// A max that is not 2^n-1 lets the masked value exceed it.
	c = c * 255 / uint32(limit)
	if c > 255 {
		c = 255
	}
	return uint8(c)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}
