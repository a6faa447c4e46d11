package rfb

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
)

// FuzzFilter feeds random client streams in random chunks. Whatever the
// bytes, the Filter must not panic, must find the same violation however the
// stream is cut, and must only ever forward a valid client stream: a fresh
// control-mode Filter accepts its output unchanged, and in view-only mode
// that output holds no input message.
func FuzzFilter(f *testing.F) {
	var all []byte
	for _, m := range clientMessages() {
		if len(m.b) < 1000 { // keep seeds small so mutation stays quick
			f.Add(cat(clientHello(0), m.b), []byte{3, 1, 7}, false)
			f.Add(cat(clientHello(0), m.b), []byte{0}, true)
			all = cat(all, m.b)
		}
	}
	f.Add(cat(clientHello(0), all), []byte{}, false)
	f.Add(cat(clientHello(0), all), []byte{5, 17, 2, 64}, true)
	f.Add(cat([]byte("RFB 003.003\n"), []byte{0, 5, 0, 0, 1, 0, 1}), []byte{11}, false)
	f.Add(cat([]byte("RFB 003.007\n"), []byte{1, 0, 4, 1, 0, 0, 0, 0, 0, 0x61}), []byte{12, 0}, true)
	f.Add(cat(clientHello(1), []byte{6, 0, 0, 0}, neg32(3), []byte("abc")), []byte{9}, true)
	f.Add(cat(clientHello(1), []byte{255, 1, 0, 0}), []byte{13}, false)
	f.Add(cat(clientHello(1), []byte{248, 0, 0, 0}, be32(0), []byte{65}), []byte{1}, false)

	f.Fuzz(func(t *testing.T, stream, cuts []byte, viewOnly bool) {
		chunks := make([]int, 0, len(stream))
		for i, left := 0, len(stream); left > 0 && len(cuts) > 0; i++ {
			n := int(cuts[i%len(cuts)]) + 1
			chunks = append(chunks, n)
			left -= n
		}
		opts := FilterOptions{ViewOnly: viewOnly, MaxCutText: 4096}

		whole := NewFilter(opts)
		wantOut, wantErr := feedAll(whole, stream, nil)
		fl := NewFilter(opts)
		out, err := feedAll(fl, stream, chunks)

		if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
			t.Fatalf("chunked: error %v, whole: error %v", err, wantErr)
		}
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not wrap ErrProtocol", err)
			}
			if again, err2 := fl.Feed([]byte{5, 0, 0, 0, 0, 0}); again != nil || err2 != err {
				t.Fatalf("Feed after %v = %q, %v; want the same error", err, again, err2)
			}
		} else {
			if !bytes.Equal(out, wantOut) {
				t.Fatalf("chunked forwarded %x, whole forwarded %x", out, wantOut)
			}
			if fl.Dropped() != whole.Dropped() {
				t.Fatalf("chunked dropped %d, whole dropped %d", fl.Dropped(), whole.Dropped())
			}
		}

		// What was forwarded before any violation is itself valid.
		check := NewFilter(FilterOptions{MaxCutText: 4096})
		again, err := feedAll(check, out, nil)
		if err != nil {
			t.Fatalf("forwarded stream %x is not valid: %v", out, err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("forwarded stream %x changes when filtered again into %x", out, again)
		}
		if viewOnly {
			view := NewFilter(FilterOptions{ViewOnly: true, MaxCutText: 4096})
			if _, err := feedAll(view, out, nil); err != nil {
				t.Fatalf("view-only filter on the output: %v", err)
			}
			if view.Dropped() != 0 {
				t.Fatalf("view-only output %x holds %d input messages", out, view.Dropped())
			}
		}
	})
}

// fuzzFormats are the server formats FuzzClientReadMessage starts from:
// the decoded 32-bit ones and the skipped 16- and 8-bit ones.
var fuzzFormats = [][]byte{
	defaultFormatWire,
	{32, 24, 1, 1, 0, 255, 0, 255, 0, 255, 0, 8, 16, 0, 0, 0},
	{16, 16, 0, 1, 0, 31, 0, 63, 0, 31, 11, 5, 0, 0, 0, 0},
	{8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
}

// fuzzAllocBound is what one FuzzClientReadMessage input may make the
// Client allocate beyond a small multiple of its own length: two framebuffers
// of the largest size (a resize grows memory at least twofold) and change.
const fuzzAllocBound = 2*MaxFramebufferBytes + 1<<20

// FuzzClientReadMessage hands a Client random server messages after a
// scripted handshake. It must never panic, and never allocate more than
// fuzzAllocBound plus a small multiple of the input: a server cannot make
// it reserve memory for data it has not sent.
func FuzzClientReadMessage(f *testing.F) {
	f.Add(uint8(0), cat([]byte{0, 0}, be16(2), rect(0, 0, 1, 1, EncodingRaw), []byte{1, 2, 3, 4}, rect(1, 1, 1, 1, EncodingCopyRect), be16(0), be16(0)))
	f.Add(uint8(1), cat([]byte{0, 0}, be16(0xffff), rect(0, 0, 100, 100, EncodingDesktopSize), rect(0, 0, 2, 2, EncodingZRLE), be32(3), []byte{1, 2, 3}, rect(0, 0, 0, 0, EncodingLastRect)))
	f.Add(uint8(2), cat([]byte{0, 0}, be16(1), rect(0, 0, 2, 2, EncodingCursor), make([]byte, 2*2*2+2)))
	f.Add(uint8(3), cat([]byte{1, 0}, be16(0), be16(1), make([]byte, 6), []byte{2, 150}))
	f.Add(uint8(0), cat([]byte{3, 0, 0, 0}, be32(2), []byte("hi"), []byte{3, 0, 0, 0}, neg32(1), []byte{0}))
	f.Add(uint8(0), cat([]byte{248, 0, 0, 0}, be32(0), []byte{1, 0}))
	f.Add(uint8(0), cat([]byte{0, 0}, be16(1), rect(0, 0, 10, 10, EncodingExtendedDesktopSize), []byte{1, 0, 0, 0}, make([]byte, 16)))
	f.Add(uint8(0), cat([]byte{0, 0}, be16(1), rect(0, 0, 4096, 4096, EncodingDesktopSize)))

	f.Fuzz(func(t *testing.T, format uint8, data []byte) {
		pf := fuzzFormats[int(format)%len(fuzzFormats)]
		server := bytes.NewReader(cat(serverHello(64, 48, pf, "fuzz"), data))

		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		c := NewClient(struct {
			io.Reader
			io.Writer
		}{server, io.Discard})
		if _, err := c.Handshake(true); err != nil {
			t.Fatalf("scripted handshake: %v", err)
		}
		for {
			m, err := c.ReadMessage()
			if m.Bytes < 0 || m.Rects < 0 || m.Skipped > m.Rects {
				t.Fatalf("ReadMessage = %+v", m)
			}
			if err != nil {
				break
			}
			if fb := c.Framebuffer(); len(fb.Pix) != 4*fb.Rect.Dx()*fb.Rect.Dy() {
				t.Fatalf("framebuffer %v with %d bytes", fb.Rect, len(fb.Pix))
			}
		}
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > fuzzAllocBound+16*uint64(len(data)) {
			t.Fatalf("allocated %d bytes for %d bytes of input", n, len(data))
		}
	})
}
