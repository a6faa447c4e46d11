package desktop

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/adler32"
	"hash/crc32"
	"image"
	"runtime"
	"sync"

	"github.com/klauspost/compress/flate"
)

// rgba is the layout of image.RGBA pixels.
var rgba = pixelLayout{r: 0, g: 1, b: 2}

// encodePNG appends img as an 8-bit RGB PNG to buf, ignoring alpha (a
// screen is opaque).
//
// It exists because image/png spends over half its time choosing a filter
// for each row by trying all five; on screen content the cheaper choice
// between Sub and Up compresses about as well, so this writer is roughly
// twice as fast for the same zlib level (BestSpeed).
func encodePNG(buf *bytes.Buffer, img *image.RGBA) error {
	pix := img.Pix[img.PixOffset(img.Rect.Min.X, img.Rect.Min.Y):]
	return encodePNGPix(buf, pix, img.Stride, img.Rect.Dx(), img.Rect.Dy(), rgba)
}

// outBufs recycles the buffers images are encoded into; the caller gets a
// copy of exactly the encoded size.
var outBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// encodePNGBytes encodes w*h pixels of 4 bytes in layout l, rows stride
// bytes apart, as a PNG.
func encodePNGBytes(pix []byte, stride, w, h int, l pixelLayout) ([]byte, error) {
	buf := outBufs.Get().(*bytes.Buffer)
	defer outBufs.Put(buf)
	buf.Reset()
	if err := encodePNGPix(buf, pix, stride, w, h, l); err != nil {
		return nil, fmt.Errorf("encode png: %w", err)
	}
	return bytes.Clone(buf.Bytes()), nil
}

// encodePNGPix appends w*h pixels of 4 bytes in layout l, rows stride bytes
// apart, to buf as an RGB PNG.
func encodePNGPix(buf *bytes.Buffer, pix []byte, stride, w, h int, l pixelLayout) error {
	buf.Write([]byte("\x89PNG\r\n\x1a\n"))
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8] = 8 // bit depth
	ihdr[9] = 2 // color type: truecolor
	writeChunk(buf, "IHDR", ihdr[:])

	// IDAT: a zlib stream. Its deflate data is made in horizontal strips,
	// compressed concurrently (each strip ends in a sync flush, the last in
	// the final block, so their concatenation is one valid deflate stream,
	// as pigz does); the Adler-32 of the whole is combined from the strips'.
	start := buf.Len()
	buf.Write([]byte("\x00\x00\x00\x00IDAT\x78\x01"))
	strips := stripsFor(w, h)
	parts := make([]*pngStrip, len(strips))
	var wg sync.WaitGroup
	for i, st := range strips {
		parts[i] = pngStrips.Get().(*pngStrip)
		defer pngStrips.Put(parts[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			parts[i].encode(pix, stride, w, st[0], st[1], st[1] == h, l)
		}()
	}
	wg.Wait()
	var sum uint32 = 1 // Adler-32 of nothing
	for _, p := range parts {
		if p.err != nil {
			return p.err
		}
		buf.Write(p.out.Bytes())
		sum = adler32Combine(sum, p.sum, p.n)
	}
	var tail [4]byte
	binary.BigEndian.PutUint32(tail[:], sum)
	buf.Write(tail[:])
	data := buf.Bytes()[start:]
	binary.BigEndian.PutUint32(data[0:4], uint32(len(data)-8))
	binary.BigEndian.PutUint32(tail[:], crc32.ChecksumIEEE(data[4:]))
	buf.Write(tail[:])

	writeChunk(buf, "IEND", nil)
	return nil
}

// toRGB converts a row of 4-byte pixels into 3-byte RGB ones.
func (l pixelLayout) toRGB(rgb, row []byte) {
	switch l {
	case bgrx:
		for i, j := 0, 0; j+2 < len(rgb) && i+3 < len(row); i, j = i+4, j+3 {
			rgb[j], rgb[j+1], rgb[j+2] = row[i+2], row[i+1], row[i]
		}
	case rgba:
		for i, j := 0, 0; j+2 < len(rgb) && i+3 < len(row); i, j = i+4, j+3 {
			rgb[j], rgb[j+1], rgb[j+2] = row[i], row[i+1], row[i+2]
		}
	default:
		for i, j := 0, 0; j+2 < len(rgb) && i+3 < len(row); i, j = i+4, j+3 {
			rgb[j], rgb[j+1], rgb[j+2] = row[i+l.r], row[i+l.g], row[i+l.b]
		}
	}
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

// pngEncoder holds the reusable row buffers of one strip.
type pngEncoder struct {
	cur, prev []byte // RGB rows, unfiltered
	sub, up   []byte // filter byte + row filtered with Sub, Up
}

// pngStrip compresses rows [y0, y1) of an image into out.
type pngStrip struct {
	pngEncoder
	fw  *flate.Writer
	out bytes.Buffer
	sum uint32 // Adler-32 of the strip's uncompressed (filtered) bytes
	n   int64  // their count
	err error
}

var pngStrips = sync.Pool{New: func() any {
	fw, _ := flate.NewWriter(nil, flate.BestSpeed)
	return &pngStrip{fw: fw}
}}

func (s *pngStrip) encode(pix []byte, stride, w, y0, y1 int, last bool, l pixelLayout) {
	s.resize(w)
	s.out.Reset()
	s.fw.Reset(&s.out)
	s.err = nil
	clear(s.prev)
	if y0 > 0 { // the Up filter of the first row looks at the row above
		l.toRGB(s.prev, pix[(y0-1)*stride:(y0-1)*stride+w*4])
	}
	ad := adler32.New()
	s.n = 0
	for y := y0; y < y1; y++ {
		l.toRGB(s.cur, pix[y*stride:y*stride+w*4])
		line := s.filter(s.cur)
		ad.Write(line)
		s.n += int64(len(line))
		if _, err := s.fw.Write(line); err != nil {
			s.err = err
			return
		}
		s.prev, s.cur = s.cur, s.prev
	}
	s.sum = ad.Sum32()
	if last {
		s.err = s.fw.Close()
	} else {
		s.err = s.fw.Flush()
	}
}

// stripsFor splits h rows into one strip per CPU (at most 4), or one for
// small images where a goroutine costs more than it saves.
func stripsFor(w, h int) [][2]int {
	n := min(runtime.GOMAXPROCS(0), 4)
	if w*h < 256*256 || n < 2 {
		n = 1
	}
	out := make([][2]int, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, [2]int{h * i / n, h * (i + 1) / n})
	}
	return out
}

// adler32Combine returns the Adler-32 of the concatenation of two byte
// sequences from their checksums a and b and the length n of the second
// (the arithmetic is that of zlib's adler32_combine).
func adler32Combine(a, b uint32, n int64) uint32 {
	const base = 65521
	rem := uint32(n % base)
	s1 := a & 0xffff
	s2 := uint32((uint64(rem) * uint64(s1)) % base)
	s1 += (b & 0xffff) + base - 1
	s2 += (a >> 16) + (b >> 16) + base - rem
	if s1 >= base {
		s1 -= base
	}
	if s1 >= base {
		s1 -= base
	}
	if s2 >= 2*base {
		s2 -= 2 * base
	}
	if s2 >= base {
		s2 -= base
	}
	return s1 | s2<<16
}

func (e *pngEncoder) resize(w int) {
	if cap(e.cur) < 3*w {
		e.cur, e.prev = make([]byte, 3*w), make([]byte, 3*w)
		e.sub, e.up = make([]byte, 1+3*w), make([]byte, 1+3*w)
	}
	e.cur, e.prev = e.cur[:3*w], e.prev[:3*w]
	e.sub, e.up = e.sub[:1+3*w], e.up[:1+3*w]
}

// filterSample is the stride of the bytes filter looks at to choose. It is
// prime to 3 so that the sample covers the three channels alike.
const filterSample = 5

// filter returns the row filtered with Sub or Up, whichever has the smaller
// sum of absolute values (the libpng heuristic, over two filters). The sums
// are taken over every filterSample-th byte only, and only the chosen
// filter is applied: computing both filtered rows in full took a third of
// the encoding time, and on screen content the sampled choice makes files
// within 0.5% of the same size.
func (e *pngEncoder) filter(cur []byte) []byte {
	n := len(cur)
	prev := e.prev[:n]
	var sumSub, sumUp int
	for i := 0; i < 3 && i < n; i++ {
		sumSub += int(absTable[cur[i]])
		sumUp += int(absTable[cur[i]-prev[i]])
	}
	for i := 3; i < n; i += filterSample {
		c := cur[i]
		sumSub += int(absTable[c-cur[i-3]])
		sumUp += int(absTable[c-prev[i]])
	}
	if sumUp <= sumSub {
		up := e.up[1 : 1+n]
		for i := range up {
			up[i] = cur[i] - prev[i]
		}
		e.up[0] = 2
		return e.up[:1+n]
	}
	sub := e.sub[1 : 1+n]
	copy(sub[:min(3, n)], cur)
	for i := 3; i < n; i++ {
		sub[i] = cur[i] - cur[i-3]
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
