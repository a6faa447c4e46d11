package rfb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// be16 and be32 write big-endian fields for hand-built messages.
func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// neg32 writes the extended clipboard's negative length for n bytes.
func neg32(n int) []byte { return be32(uint32(-int32(n))) }

// clientHello is what a 3.8 viewer sends before its first message, with the
// given shared flag.
func clientHello(shared byte) []byte {
	return cat([]byte("RFB 003.008\n"), []byte{1}, []byte{shared})
}

// filteredHello is what the Filter forwards of any clientHello.
var filteredHello = clientHello(1)

// clientMessage is one well-formed client message and whether it is input,
// which a view-only Filter drops.
type clientMessage struct {
	name  string
	b     []byte
	input bool
}

// clientMessages holds one or more of every message the Filter knows, built
// by hand from RFC 6143 and the community protocol documentation rather
// than with the package's own encoders.
func clientMessages() []clientMessage {
	pixelFormat := []byte{32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}
	bigCut := bytes.Repeat([]byte("x"), 100_000)
	screen := cat(be32(0), be16(0), be16(0), be16(1280), be16(800), be32(0))
	return []clientMessage{
		{"SetPixelFormat", cat([]byte{0, 0, 0, 0}, pixelFormat), false},
		{"SetPixelFormat 8bpp", cat([]byte{0, 0, 0, 0}, []byte{8, 8, 0, 0, 0, 7, 0, 7, 0, 3, 0, 3, 6, 0, 0, 0}), false},
		{"SetEncodings none", []byte{2, 0, 0, 0}, false},
		{"SetEncodings", cat([]byte{2, 0}, be16(3), be32(16), be32(0), be32(0xffffff21)), false},
		{"SetEncodings 1024", cat([]byte{2, 0}, be16(1024), make([]byte, 4096)), false},
		{"FramebufferUpdateRequest", cat([]byte{3, 1}, be16(0), be16(0), be16(1280), be16(800)), false},
		{"KeyEvent", cat([]byte{4, 1, 0, 0}, be32(0xff0d)), true},
		{"PointerEvent", cat([]byte{5, 1}, be16(10), be16(20)), true},
		{"ClientCutText", cat([]byte{6, 0, 0, 0}, be32(5), []byte("hello")), true},
		{"ClientCutText empty", cat([]byte{6, 0, 0, 0}, be32(0)), true},
		{"ClientCutText large", cat([]byte{6, 0, 0, 0}, be32(uint32(len(bigCut))), bigCut), true},
		{"ClientCutText extended", cat([]byte{6, 0, 0, 0}, neg32(4), be32(0x01000001)), true},
		{"ClientCutText at cap", cat([]byte{6, 0, 0, 0}, be32(DefaultMaxCutText), make([]byte, DefaultMaxCutText)), true},
		{"EnableContinuousUpdates", cat([]byte{150, 1}, be16(0), be16(0), be16(1280), be16(800)), false},
		{"ClientFence", cat([]byte{248, 0, 0, 0}, be32(0x80000003), []byte{3}, []byte("abc")), false},
		{"ClientFence empty", cat([]byte{248, 0, 0, 0}, be32(0), []byte{0}), false},
		{"ClientFence 64", cat([]byte{248, 0, 0, 0}, be32(0), []byte{64}, make([]byte, 64)), false},
		{"xvp", []byte{250, 0, 1, 2}, true},
		{"SetDesktopSize", cat([]byte{251, 0}, be16(1280), be16(800), []byte{2, 0}, screen, screen), true},
		{"SetDesktopSize no screens", cat([]byte{251, 0}, be16(1280), be16(800), []byte{0, 0}), true},
		{"QEMU extended key", cat([]byte{255, 0}, be16(1), be32(0x61), be32(30)), true},
	}
}

// feedAll feeds stream to f in the given chunk sizes (the rest in one piece)
// and returns everything forwarded and the first error.
func feedAll(f *Filter, stream []byte, chunks []int) ([]byte, error) {
	var out []byte
	for _, n := range chunks {
		if n > len(stream) {
			n = len(stream)
		}
		o, err := f.Feed(stream[:n])
		if err != nil {
			return out, err
		}
		out = append(out, o...)
		stream = stream[n:]
	}
	if len(stream) > 0 {
		o, err := f.Feed(stream)
		if err != nil {
			return out, err
		}
		out = append(out, o...)
	}
	return out, nil
}

func TestFilterMessages(t *testing.T) {
	for _, m := range clientMessages() {
		for _, viewOnly := range []bool{false, true} {
			name := m.name + "/control"
			if viewOnly {
				name = m.name + "/view-only"
			}
			t.Run(name, func(t *testing.T) {
				f := NewFilter(FilterOptions{ViewOnly: viewOnly})
				got, err := feedAll(f, cat(clientHello(0), m.b), nil)
				if err != nil {
					t.Fatalf("Feed: %v", err)
				}
				want, wantDropped := cat(filteredHello, m.b), 0
				if viewOnly && m.input {
					want, wantDropped = filteredHello, 1
				}
				if !bytes.Equal(got, want) {
					t.Errorf("forwarded %d bytes %.40x…, want %d bytes %.40x…", len(got), got, len(want), want)
				}
				if got := f.Dropped(); got != wantDropped {
					t.Errorf("Dropped() = %d, want %d", got, wantDropped)
				}
			})
		}
	}
}

func TestFilterHandshake(t *testing.T) {
	pointer := cat([]byte{5, 0}, be16(1), be16(2))
	tests := []struct {
		name string
		in   []byte
		want []byte
	}{
		{"3.8 exclusive", cat([]byte("RFB 003.008\n"), []byte{1, 0}, pointer), cat([]byte("RFB 003.008\n"), []byte{1, 1}, pointer)},
		{"3.8 shared", cat([]byte("RFB 003.008\n"), []byte{1, 1}, pointer), cat([]byte("RFB 003.008\n"), []byte{1, 1}, pointer)},
		{"3.8 shared as 2", cat([]byte("RFB 003.008\n"), []byte{1, 2}, pointer), cat([]byte("RFB 003.008\n"), []byte{1, 1}, pointer)},
		{"3.7 exclusive", cat([]byte("RFB 003.007\n"), []byte{1, 0}, pointer), cat([]byte("RFB 003.007\n"), []byte{1, 1}, pointer)},
		// 3.3 has no security byte: the next byte is already ClientInit.
		{"3.3 exclusive", cat([]byte("RFB 003.003\n"), []byte{0}, pointer), cat([]byte("RFB 003.003\n"), []byte{1}, pointer)},
		{"3.3 shared", cat([]byte("RFB 003.003\n"), []byte{1}, pointer), cat([]byte("RFB 003.003\n"), []byte{1}, pointer)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := feedAll(NewFilter(FilterOptions{}), tt.in, nil)
			if err != nil {
				t.Fatalf("Feed: %v", err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Errorf("forwarded %q, want %q", got, tt.want)
			}
		})
	}
}

// chunkings returns the chunk sizes every test stream is fed in: whole,
// byte by byte, and random splits.
func chunkings(n int) map[string][]int {
	out := map[string][]int{"whole": nil}
	ones := make([]int, n)
	for i := range ones {
		ones[i] = 1
	}
	out["byte by byte"] = ones
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 50 {
		var cuts []int
		for left := n; left > 0; {
			// Mostly small pieces, so that headers are split, and now
			// and then a large one that holds many messages.
			c := 1 + r.IntN(24)
			if r.IntN(8) == 0 {
				c = 1 + r.IntN(200_000)
			}
			cuts = append(cuts, c)
			left -= c
		}
		out[fmt.Sprintf("random %d", i)] = cuts
	}
	return out
}

func TestFilterChunking(t *testing.T) {
	msgs := clientMessages()
	for _, viewOnly := range []bool{false, true} {
		in, want := clientHello(0), filteredHello
		wantDropped := 0
		// Twice over, so that every message follows every kind of
		// message at least once in some order.
		for range 2 {
			for _, m := range msgs {
				in = cat(in, m.b)
				if viewOnly && m.input {
					wantDropped++
				} else {
					want = cat(want, m.b)
				}
			}
		}
		for name, cuts := range chunkings(len(in)) {
			f := NewFilter(FilterOptions{ViewOnly: viewOnly})
			got, err := feedAll(f, in, cuts)
			if err != nil {
				t.Fatalf("viewOnly=%v %s: Feed: %v", viewOnly, name, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("viewOnly=%v %s: forwarded %d bytes, want %d, first difference at %d", viewOnly, name, len(got), len(want), firstDiff(got, want))
			}
			if got := f.Dropped(); got != wantDropped {
				t.Errorf("viewOnly=%v %s: Dropped() = %d, want %d", viewOnly, name, got, wantDropped)
			}
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestFilterViolations(t *testing.T) {
	hello := clientHello(1)
	tests := []struct {
		name string
		in   []byte
		opts FilterOptions
	}{
		{"version 4.0", []byte("RFB 004.000\n"), FilterOptions{}},
		{"version 3.5", []byte("RFB 003.005\n"), FilterOptions{}},
		{"version Apple 3.889", []byte("RFB 003.889\n"), FilterOptions{}},
		{"version without newline", []byte("RFB 003.008 "), FilterOptions{}},
		{"HTTP instead of RFB", []byte("GET / HTTP/1"), FilterOptions{}},
		{"security VNC auth", cat([]byte("RFB 003.008\n"), []byte{2}), FilterOptions{}},
		{"security invalid", cat([]byte("RFB 003.007\n"), []byte{0}), FilterOptions{}},
		{"unknown type 7", cat(hello, []byte{7}), FilterOptions{}},
		{"unknown type 1", cat(hello, []byte{1}), FilterOptions{}},
		{"unknown type after a message", cat(hello, []byte{5, 0, 0, 1, 0, 1}, []byte{249}), FilterOptions{}},
		// The count is a u16, so the 100000 of the brief cannot be sent;
		// its largest value and the first one past the limit can.
		{"SetEncodings 65535", cat(hello, []byte{2, 0}, be16(65535)), FilterOptions{}},
		{"SetEncodings 1025", cat(hello, []byte{2, 0}, be16(1025)), FilterOptions{}},
		{"SetPixelFormat 24bpp", cat(hello, []byte{0, 0, 0, 0, 24, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}), FilterOptions{}},
		{"cut text over default cap", cat(hello, []byte{6, 0, 0, 0}, be32(DefaultMaxCutText+1)), FilterOptions{}},
		{"cut text 4 GiB", cat(hello, []byte{6, 0, 0, 0}, be32(0x7fffffff)), FilterOptions{}},
		{"extended cut text over cap", cat(hello, []byte{6, 0, 0, 0}, neg32(DefaultMaxCutText+1)), FilterOptions{}},
		{"extended cut text min int32", cat(hello, []byte{6, 0, 0, 0}, be32(0x80000000)), FilterOptions{}},
		{"cut text over set cap", cat(hello, []byte{6, 0, 0, 0}, be32(11)), FilterOptions{MaxCutText: 10}},
		{"cut text over cap in view-only", cat(hello, []byte{6, 0, 0, 0}, be32(DefaultMaxCutText+1)), FilterOptions{ViewOnly: true}},
		{"fence payload 65", cat(hello, []byte{248, 0, 0, 0}, be32(0), []byte{65}), FilterOptions{}},
		{"fence payload 255", cat(hello, []byte{248, 0, 0, 0}, be32(0), []byte{255}), FilterOptions{}},
		{"QEMU sub-type 1", cat(hello, []byte{255, 1}), FilterOptions{}},
		{"QEMU sub-type 1 in view-only", cat(hello, []byte{255, 1}), FilterOptions{ViewOnly: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFilter(tt.opts)
			out, err := f.Feed(tt.in)
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("Feed(%q) = %v, want an error wrapping ErrProtocol", tt.in, err)
			}
			if out != nil {
				t.Errorf("Feed forwarded %q along with the error", out)
			}
			// It stays an error, whatever comes next.
			for _, next := range [][]byte{hello, {5, 0, 0, 0, 0, 0}, {0}} {
				if _, err2 := f.Feed(next); err2 != err {
					t.Errorf("Feed after the violation = %v, want the same error %v", err2, err)
				}
			}
			// Byte by byte, the violation is found at the same byte, as
			// soon as the bytes that break the protocol are in.
			f2 := NewFilter(tt.opts)
			var err2 error
			for i := range tt.in {
				if _, err2 = f2.Feed(tt.in[i : i+1]); err2 != nil {
					if i != len(tt.in)-1 {
						t.Errorf("byte by byte: error at byte %d of %d: %v", i, len(tt.in), err2)
					}
					break
				}
			}
			if err2 == nil || err2.Error() != err.Error() {
				t.Errorf("byte by byte: error %v, want %v", err2, err)
			}
		})
	}
}

func TestFilterCutTextCap(t *testing.T) {
	msg := cat([]byte{6, 0, 0, 0}, be32(10), []byte("0123456789"))
	f := NewFilter(FilterOptions{MaxCutText: 10})
	got, err := feedAll(f, cat(clientHello(1), msg), nil)
	if err != nil {
		t.Fatalf("Feed at the cap: %v", err)
	}
	if want := cat(filteredHello, msg); !bytes.Equal(got, want) {
		t.Errorf("forwarded %q, want %q", got, want)
	}
}

// Each Feed forwards exactly the checked part of what it got: a header split
// over chunks goes out whole with the chunk that completes it, in both
// modes. (Returning the caller's chunk as it is, as control mode does,
// once forwarded a completed header without its first bytes.)
func TestFilterSplitHeaders(t *testing.T) {
	pointer := cat([]byte{5, 0}, be16(1), be16(2))
	request := cat([]byte{3, 1}, be16(0), be16(0), be16(1280), be16(800))
	cut := cat([]byte{6, 0, 0, 0}, be32(3), []byte("abc"))
	steps := []struct {
		in, control, viewOnly []byte
	}{
		{clientHello(0)[:5], nil, nil},
		{clientHello(0)[5:], filteredHello, filteredHello},
		{pointer[:3], nil, nil},
		{pointer[3:], pointer, nil},
		{cat(request, pointer[:1]), request, request},
		{pointer[1:], pointer, nil},
		{cat(pointer, cut[:9]), cat(pointer, cut[:9]), nil},
		{cut[9:], cut[9:], nil},
		{cat(request, cut[:5]), request, request},
		{cut[5:8], cut[:8], nil},
		{cut[8:], cut[8:], nil},
	}
	for _, viewOnly := range []bool{false, true} {
		f := NewFilter(FilterOptions{ViewOnly: viewOnly})
		for i, s := range steps {
			want := s.control
			if viewOnly {
				want = s.viewOnly
			}
			got, err := f.Feed(s.in)
			if err != nil {
				t.Fatalf("viewOnly=%v step %d: %v", viewOnly, i, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("viewOnly=%v step %d: Feed(%x) = %x, want %x", viewOnly, i, s.in, got, want)
			}
		}
	}
}

// A violation closes the connection: the valid messages in front of it in
// the same chunk are not forwarded either, as the server is about to lose
// the connection anyway.
func TestFilterViolationForwardsNothingOfItsChunk(t *testing.T) {
	f := NewFilter(FilterOptions{})
	if _, err := f.Feed(clientHello(1)); err != nil {
		t.Fatal(err)
	}
	out, err := f.Feed(cat([]byte{5, 0, 0, 1, 0, 1}, []byte{7}))
	if err == nil || out != nil {
		t.Errorf("Feed = %q, %v; want nil and an error", out, err)
	}
}

// BenchmarkFilter feeds what a viewer sends while someone moves the mouse:
// pointer events with now and then an incremental update request, each in a
// WebSocket message of its own (as noVNC sends them) or coalesced into
// larger reads.
func BenchmarkFilter(b *testing.B) {
	var msgs [][]byte
	for i := range 1000 {
		if i%10 == 0 {
			msgs = append(msgs, cat([]byte{3, 1}, be16(0), be16(0), be16(1280), be16(800)))
			continue
		}
		msgs = append(msgs, cat([]byte{5, byte(i % 2)}, be16(uint16(i%1280)), be16(uint16(i%800))))
	}
	stream := bytes.Join(msgs, nil)
	for _, viewOnly := range []bool{false, true} {
		mode := "control"
		if viewOnly {
			mode = "view-only"
		}
		b.Run(mode+"/per-message", func(b *testing.B) {
			f := NewFilter(FilterOptions{ViewOnly: viewOnly})
			if _, err := f.Feed(clientHello(1)); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				for _, m := range msgs {
					if _, err := f.Feed(m); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(mode+"/4KiB-reads", func(b *testing.B) {
			f := NewFilter(FilterOptions{ViewOnly: viewOnly})
			if _, err := f.Feed(clientHello(1)); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				for p := stream; len(p) > 0; {
					n := min(len(p), 4096)
					if _, err := f.Feed(p[:n]); err != nil {
						b.Fatal(err)
					}
					p = p[n:]
				}
			}
		})
	}
}

func TestFilterNoAllocations(t *testing.T) {
	f := NewFilter(FilterOptions{})
	if _, err := f.Feed(clientHello(1)); err != nil {
		t.Fatal(err)
	}
	pointer := cat([]byte{5, 0}, be16(1), be16(2))
	request := cat([]byte{3, 1}, be16(0), be16(0), be16(1280), be16(800))
	split := cat(pointer, request)
	f.Feed(split) // let the output buffer grow once
	allocs := testing.AllocsPerRun(100, func() {
		f.Feed(pointer)
		f.Feed(request)
		f.Feed(split[:3])
		f.Feed(split[3:9])
		f.Feed(split[9:])
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run, want 0", allocs)
	}
}
