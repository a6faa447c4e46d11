package desktop

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"hash/crc32"
	"image"
	"sync"
)

// encodePNG appends img as an 8-bit RGB PNG to buf, ignoring alpha (a
// screen is opaque).
//
// It exists because image/png spends over half its time choosing a filter
// for each row by trying all five; on screen content the cheaper choice
// between Sub and Up compresses about as well, so this writer is roughly
// twice as fast for the same zlib level (BestSpeed).
func encodePNG(buf *bytes.Buffer, img *image.RGBA) error {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	e := pngEncoders.Get().(*pngEncoder)
	defer pngEncoders.Put(e)
	e.resize(w)

	buf.Write([]byte("\x89PNG\r\n\x1a\n"))
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8] = 8 // bit depth
	ihdr[9] = 2 // color type: truecolor
	writeChunk(buf, "IHDR", ihdr[:])

	// IDAT: compress straight into buf after a length placeholder, then
	// patch the length and append the CRC.
	start := buf.Len()
	buf.Write([]byte("\x00\x00\x00\x00IDAT"))
	e.zw.Reset(buf)
	clear(e.prev)
	for y := 0; y < h; y++ {
		row := img.Pix[(y)*img.Stride : (y)*img.Stride+w*4]
		rgb := e.cur[:3*w]
		for i, j := 0, 0; j < len(rgb); i, j = i+4, j+3 {
			rgb[j], rgb[j+1], rgb[j+2] = row[i], row[i+1], row[i+2]
		}
		line := e.filter(rgb)
		if _, err := e.zw.Write(line); err != nil {
			return err
		}
		e.prev, e.cur = e.cur, e.prev
	}
	if err := e.zw.Close(); err != nil {
		return err
	}
	data := buf.Bytes()[start:]
	binary.BigEndian.PutUint32(data[0:4], uint32(len(data)-8))
	var crc [4]byte
	binary.BigEndian.PutUint32(crc[:], crc32.ChecksumIEEE(data[4:]))
	buf.Write(crc[:])

	writeChunk(buf, "IEND", nil)
	return nil
}

func writeChunk(buf *bytes.Buffer, typ string, data []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(data)))
	buf.Write(n[:])
	buf.WriteString(typ)
	buf.Write(data)
	crc := crc32.NewIEEE()
	crc.Write([]byte(typ))
	crc.Write(data)
	binary.BigEndian.PutUint32(n[:], crc.Sum32())
	buf.Write(n[:])
}

// pngEncoder holds the reusable state of encodePNG.
type pngEncoder struct {
	zw        *zlib.Writer
	cur, prev []byte // RGB rows, unfiltered
	sub, up   []byte // filter byte + filtered row
}

var pngEncoders = sync.Pool{New: func() any {
	zw, _ := zlib.NewWriterLevel(nil, zlib.BestSpeed)
	return &pngEncoder{zw: zw}
}}

func (e *pngEncoder) resize(w int) {
	if cap(e.cur) < 3*w {
		e.cur, e.prev = make([]byte, 3*w), make([]byte, 3*w)
		e.sub, e.up = make([]byte, 1+3*w), make([]byte, 1+3*w)
	}
	e.cur, e.prev = e.cur[:3*w], e.prev[:3*w]
	e.sub, e.up = e.sub[:1+3*w], e.up[:1+3*w]
}

// filter returns the row filtered with Sub or Up, whichever has the smaller
// sum of absolute values (the libpng heuristic, over two filters).
func (e *pngEncoder) filter(cur []byte) []byte {
	n := len(cur)
	sub, up, prev := e.sub[1:1+n], e.up[1:1+n], e.prev[:n]
	var sumSub, sumUp int
	for i := 0; i < 3 && i < n; i++ {
		sub[i] = cur[i]
		u := cur[i] - prev[i]
		up[i] = u
		sumSub += int(absTable[cur[i]])
		sumUp += int(absTable[u])
	}
	for i := 3; i < n; i++ {
		c := cur[i]
		s, u := c-cur[i-3], c-prev[i]
		sub[i], up[i] = s, u
		sumSub += int(absTable[s])
		sumUp += int(absTable[u])
	}
	if sumUp <= sumSub {
		e.up[0] = 2
		return e.up[:1+n]
	}
	e.sub[0] = 1
	return e.sub[:1+n]
}

// absTable[b] is |int8(b)|, the cost measure of a filtered byte.
var absTable = func() (t [256]uint8) {
	for i := range t {
		v := int(int8(i))
		if v < 0 {
			v = -v
		}
		t[i] = uint8(v)
	}
	return t
}()
