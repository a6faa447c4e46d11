package desktop

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"image"
	"image/jpeg"
	"sync"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/shm"
	"github.com/jezek/xgb/xproto"
	"golang.org/x/image/draw"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// Shot is an encoded screenshot. Data may be shared with other shots of
// the same pixels: it must not be modified.
type Shot struct {
	Format string // action.FormatPNG or action.FormatJPEG
	Width  int
	Height int
	Data   []byte

	// Settled says, for a screenshot with a settle, whether the screen
	// was quiet for the settle before the capture; SettleWait is how long
	// the screenshot waited for it.
	Settled    bool
	SettleWait time.Duration
}

// pixelLayout says where the 8-bit red, green and blue channels sit in the
// 4 bytes of a ZPixmap pixel of the root window.
type pixelLayout struct {
	r, g, b int
}

// bgrx is the layout of a little-endian server with the usual 24-bit
// TrueColor visual (Xvfb, Xorg).
var bgrx = pixelLayout{r: 2, g: 1, b: 0}

// layoutFor checks that the root window is 24- or 32-bit TrueColor stored in
// 32 bits per pixel, the only depth the agent's servers use, and returns its
// channel layout.
func layoutFor(info *xproto.SetupInfo, scr *xproto.ScreenInfo) (pixelLayout, error) {
	bpp := 0
	for _, f := range info.PixmapFormats {
		if f.Depth == scr.RootDepth {
			bpp = int(f.BitsPerPixel)
		}
	}
	if bpp != 32 {
		return pixelLayout{}, fmt.Errorf("unsupported root depth %d (%d bits per pixel); run the X server at depth 24", scr.RootDepth, bpp)
	}
	var vis *xproto.VisualInfo
	for _, dep := range scr.AllowedDepths {
		for i := range dep.Visuals {
			if dep.Visuals[i].VisualId == scr.RootVisual {
				vis = &dep.Visuals[i]
			}
		}
	}
	if vis == nil {
		return pixelLayout{}, fmt.Errorf("root visual %d not found", scr.RootVisual)
	}
	byteOf := func(mask uint32) int {
		for i := 0; i < 4; i++ {
			if mask == 0xff<<(8*i) {
				if info.ImageByteOrder == xproto.ImageOrderMSBFirst {
					return 3 - i
				}
				return i
			}
		}
		return -1
	}
	l := pixelLayout{byteOf(vis.RedMask), byteOf(vis.GreenMask), byteOf(vis.BlueMask)}
	if l.r < 0 || l.g < 0 || l.b < 0 {
		return pixelLayout{}, fmt.Errorf("unsupported visual masks %#x/%#x/%#x", vis.RedMask, vis.GreenMask, vis.BlueMask)
	}
	return l, nil
}

// toRGBA converts w*h pixels of ZPixmap data into dst.Pix (stride w*4).
// dst may be src: the conversion works in place.
func (l pixelLayout) toRGBA(dst, src []byte) {
	n := len(dst) / 4
	src = src[:n*4]
	if l == bgrx {
		// Two pixels per 64-bit load and store (the compiler turns these
		// binary.LittleEndian calls into plain moves): swap the red and blue
		// bytes of each half and set alpha.
		const lo, g = 0x000000ff000000ff, 0x0000ff000000ff00
		for len(src) >= 8 && len(dst) >= 8 {
			v := binary.LittleEndian.Uint64(src)
			binary.LittleEndian.PutUint64(dst, (v>>16)&lo|v&g|(v&lo)<<16|0xff000000ff000000)
			src, dst = src[8:], dst[8:]
		}
		if len(src) >= 4 && len(dst) >= 4 {
			dst[0], dst[1], dst[2], dst[3] = src[2], src[1], src[0], 0xff
		}
		return
	}
	for i := 0; i < len(src); i += 4 {
		r, g, b := src[i+l.r], src[i+l.g], src[i+l.b] // dst may be src
		dst[i+0], dst[i+1], dst[i+2], dst[i+3] = r, g, b, 0xff
	}
}

// shmSegment is a SysV shared-memory segment attached both here and in the
// X server, which GetImage fills without copying the pixels through the
// socket.
type shmSegment struct {
	seg  shm.Seg
	data []byte
}

func newShmSegment(conn *xgb.Conn, size int) (*shmSegment, error) {
	if _, err := shm.QueryVersion(conn).Reply(); err != nil {
		return nil, err
	}
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, size, unix.IPC_CREAT|0o600)
	if err != nil {
		return nil, fmt.Errorf("shmget: %w", err)
	}
	// Marking the segment for removal once both sides have attached means it
	// is freed even if the agent dies.
	defer unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	data, err := unix.SysvShmAttach(id, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("shmat: %w", err)
	}
	seg, err := shm.NewSegId(conn)
	if err != nil {
		unix.SysvShmDetach(data)
		return nil, err
	}
	if err := shm.AttachChecked(conn, seg, uint32(id), false).Check(); err != nil {
		unix.SysvShmDetach(data)
		return nil, fmt.Errorf("shm attach in the X server: %w", err)
	}
	return &shmSegment{seg: seg, data: data}, nil
}

func (s *shmSegment) close(conn *xgb.Conn) {
	shm.Detach(conn, s.seg)
	xproto.GetInputFocus(conn).Reply() // let the server detach first
	unix.SysvShmDetach(s.data)
}

// frames recycles the buffers screenshots are captured into. A new 3 MB
// buffer per shot made the garbage collector run about once a shot, and
// under gVisor the page faults on fresh memory are expensive too.
var frames sync.Pool // *[]byte

// capture reads r of the root window. It returns the pixels in the
// server's layout (d.pix), 4 bytes each with stride 4*r.Dx(), and a
// function that recycles them once the caller is done.
func (d *Desktop) capture(r image.Rectangle) (pix []byte, release func(), err error) {
	size := r.Dx() * r.Dy() * 4
	d.shotMu.Lock()
	if seg := d.seg; seg != nil && size <= len(seg.data) {
		_, err := shm.GetImage(d.conn, xproto.Drawable(d.root), int16(r.Min.X), int16(r.Min.Y),
			uint16(r.Dx()), uint16(r.Dy()), 0xffffffff, xproto.ImageFormatZPixmap, seg.seg, 0).Reply()
		if err == nil {
			// Copy out of the segment so that the next capture need not
			// wait for this one to be encoded.
			p, _ := frames.Get().(*[]byte)
			if p == nil || cap(*p) < size {
				b := make([]byte, max(size, d.width*d.height*4))
				p = &b
			}
			pix = (*p)[:size]
			copy(pix, seg.data[:size])
			d.shotMu.Unlock()
			return pix, func() { frames.Put(p) }, nil
		}
		// The segment stopped working (server restarted its extension?):
		// drop it and use the socket from now on.
		seg.close(d.conn)
		d.seg = nil
	}
	d.shotMu.Unlock()
	reply, err := xproto.GetImage(d.conn, xproto.ImageFormatZPixmap, xproto.Drawable(d.root),
		int16(r.Min.X), int16(r.Min.Y), uint16(r.Dx()), uint16(r.Dy()), 0xffffffff).Reply()
	if err != nil {
		return nil, nil, fmt.Errorf("get image: %w", err)
	}
	if len(reply.Data) < size {
		return nil, nil, fmt.Errorf("get image returned %d bytes, want %d", len(reply.Data), size)
	}
	return reply.Data[:size], func() {}, nil
}

func (d *Desktop) screenRect() image.Rectangle { return image.Rect(0, 0, d.width, d.height) }

// Screenshot captures the screen (or opts.Region of it), draws the pointer
// if asked, scales it down and encodes it. opts must be valid for this
// screen (action.Normalize and action.Validate); a region outside the screen
// is an *action.Error.
//
// With opts.Settle it first waits until the screen has had no damage for
// that long (see action.ScreenshotOptions), at most opts.SettleMax, and
// says in the Shot whether it settled; without DAMAGE it captures at once
// and reports that it did not. When no damage has arrived since a
// screenshot with the same options (but the cursor, which moves without
// damage), that screenshot's encoding is returned again.
func (d *Desktop) Screenshot(ctx context.Context, opts action.ScreenshotOptions) (*Shot, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	screen := d.screenRect()
	r := opts.Region
	if r.Empty() {
		r = screen
	}
	if !r.In(screen) {
		return nil, &action.Error{Msg: fmt.Sprintf("region %v is not inside the %dx%d screen", r, d.width, d.height)}
	}
	var (
		gen     uint64
		tracked bool
		settled bool
		waited  time.Duration
	)
	if d.track != nil {
		var err error
		if opts.Settle > 0 {
			gen, settled, err = d.track.settle(ctx, start, opts.Settle, opts.SettleMax)
			waited = time.Since(start)
		} else {
			gen, _, err = d.track.fence(ctx)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// A broken connection shows in the capture below.
		tracked = err == nil
	}
	key := cacheKey(opts)
	useCache := tracked && !opts.Cursor
	if useCache {
		if shot := d.shots.get(gen, key); shot != nil {
			out := *shot
			out.Settled, out.SettleWait = settled, waited
			return &out, nil
		}
	}
	shot, err := d.captureEncode(r, opts)
	if err != nil {
		return nil, err
	}
	if useCache {
		d.shots.put(gen, key, shot)
		out := *shot
		shot = &out
	}
	shot.Settled, shot.SettleWait = settled, waited
	return shot, nil
}

// captureEncode captures r and encodes it as opts say.
func (d *Desktop) captureEncode(r image.Rectangle, opts action.ScreenshotOptions) (*Shot, error) {
	pix, release, err := d.capture(r)
	if err != nil {
		return nil, err
	}
	defer release()
	d.ready.Store(true)
	w, h := r.Dx(), r.Dy()
	if (opts.Format == action.FormatPNG || opts.Format == "") && !opts.Cursor && scaledWidth(w, opts.Scale, opts.Width) == w {
		// The common case: straight from the server's pixels to PNG, with
		// no RGBA copy in between.
		data, err := encodePNGBytes(pix, 4*w, w, h, d.pix)
		if err != nil {
			return nil, err
		}
		return &Shot{Format: action.FormatPNG, Width: w, Height: h, Data: data}, nil
	}
	img := &image.RGBA{Pix: pix, Stride: 4 * w, Rect: image.Rect(0, 0, w, h)}
	d.pix.toRGBA(img.Pix, pix) // in place
	if opts.Cursor {
		d.drawCursor(img, r.Min)
	}
	out := scaleDown(img, opts.Scale, opts.Width)
	return encode(out, opts.Format, opts.Quality)
}

// scaledWidth is the width scaleDown scales a w pixels wide image to.
func scaledWidth(w int, scale float64, width int) int {
	tw := w
	switch {
	case width > 0 && width < w:
		tw = width
	case scale > 0 && scale < 1:
		tw = int(float64(w)*scale + 0.5)
	}
	if tw >= w || tw < 1 {
		return w
	}
	return tw
}

// scaleDown returns img scaled by scale, or to width keeping the aspect
// ratio; it never scales up.
func scaleDown(img *image.RGBA, scale float64, width int) *image.RGBA {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	tw := scaledWidth(w, scale, width)
	if tw == w {
		return img
	}
	th := max(1, int(float64(h)*float64(tw)/float64(w)+0.5))
	dst := image.NewRGBA(image.Rect(0, 0, tw, th))
	draw.ApproxBiLinear.Scale(dst, dst.Rect, img, img.Rect, draw.Src, nil)
	return dst
}

func encode(img *image.RGBA, format string, quality int) (*Shot, error) {
	buf := outBufs.Get().(*bytes.Buffer)
	defer outBufs.Put(buf)
	buf.Reset()
	shot := &Shot{Format: format, Width: img.Rect.Dx(), Height: img.Rect.Dy()}
	switch format {
	case action.FormatJPEG:
		if quality <= 0 || quality > 100 {
			quality = action.DefaultJPEGQuality
		}
		if err := jpeg.Encode(buf, img, &jpeg.Options{Quality: quality}); err != nil {
			return nil, fmt.Errorf("encode jpeg: %w", err)
		}
	case action.FormatPNG, "":
		shot.Format = action.FormatPNG
		if err := encodePNG(buf, img); err != nil {
			return nil, fmt.Errorf("encode png: %w", err)
		}
	default:
		return nil, &action.Error{Msg: fmt.Sprintf("format must be png or jpeg, not %q", format)}
	}
	shot.Data = bytes.Clone(buf.Bytes()) // buf goes back to the pool
	return shot, nil
}
