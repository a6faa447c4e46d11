package image

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ulikunitz/xz/lzma"
)

// ErrNoKernel means a bzImage holds no payload ExtractVmlinux can decompress.
var ErrNoKernel = errors.New("no kernel payload found")

// ExtractVmlinux returns the uncompressed ELF kernel inside the x86 bzImage
// bz, the way the kernel's scripts/extract-vmlinux does it but without
// shelling out. Firecracker boots only an uncompressed vmlinux, while
// distributions ship bzImages. The payload is located through the boot
// protocol header (setup_sects, payload_offset, payload_length) when it is
// there, otherwise by scanning for a gzip or xz magic; the result must be an
// ELF file.
func ExtractVmlinux(bz []byte) ([]byte, error) {
	var candidates []int
	if len(bz) > 0x250 && string(bz[0x202:0x206]) == "HdrS" {
		setupSects := int(bz[0x1f1])
		if setupSects == 0 {
			setupSects = 4
		}
		off := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(bz[0x248:]))
		if n := int(binary.LittleEndian.Uint32(bz[0x24c:])); off > 0 && n > 0 && off+n <= len(bz) {
			candidates = append(candidates, off)
		}
	}
	for _, magic := range [][]byte{{0xfd, '7', 'z', 'X', 'Z', 0}, {0x1f, 0x8b, 0x08}} {
		for i, start := 0, 0; i < 8; i++ {
			j := bytes.Index(bz[start:], magic)
			if j < 0 {
				break
			}
			candidates = append(candidates, start+j)
			start += j + 1
		}
	}
	var errs []error
	for _, off := range candidates {
		out, err := decompress(bz[off:])
		if err != nil {
			errs = append(errs, fmt.Errorf("at %d: %w", off, err))
			continue
		}
		if len(out) < 4 || string(out[:4]) != "\x7fELF" {
			errs = append(errs, fmt.Errorf("at %d: payload is not ELF", off))
			continue
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: %w", ErrNoKernel, errors.Join(errs...))
}

// decompress decompresses a gzip or xz stream at the start of b, ignoring
// trailing bytes (the bzImage carries more after the payload).
func decompress(b []byte) ([]byte, error) {
	var r io.Reader
	switch {
	case bytes.HasPrefix(b, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		zr.Multistream(false)
		r = zr
	case bytes.HasPrefix(b, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return unxzKernel(b)
	default:
		return nil, errors.New("unknown compression (want gzip or xz; zstd kernels are not supported)")
	}
	var out bytes.Buffer
	if _, err := io.Copy(&out, io.LimitReader(r, 1<<30)); err != nil && out.Len() < 4 {
		return nil, err
	}
	return out.Bytes(), nil
}

// VMModules are the kernel modules a cubicle VM loads at boot, in the
// initramfs, before it mounts its root disk: the virtio transports (MMIO for
// QEMU's microvm and Firecracker, PCI for q35), the block device and ext4
// for the root, the console ports for the agent channel, the network card,
// vsock for Firecracker's agent channel and an entropy source. Debian's
// kernel builds all of them as modules. Their dependencies are added from
// each module's own .modinfo.
var VMModules = []string{
	"crc32c_generic", "virtio_mmio", "virtio_pci", "virtio_blk", "ext4",
	"virtio_console", "virtio_net", "virtio_rng", "vmw_vsock_virtio_transport",
}

// modName normalizes a module name ("crc32c-intel" and "crc32c_intel" are
// one module).
func modName(s string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(s), ".ko"), "-", "_")
}

// moduleDeps reads the "depends=" entry of the .modinfo section of a .ko.
func moduleDeps(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("%s: no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				deps = append(deps, modName(d))
			}
		}
	}
	return deps, nil
}

// ResolveModules returns the .ko files under modDir (a lib/modules/RELEASE
// tree) needed to load want, dependencies first, so loading them in order
// with finit_module works without modules.dep (which only depmod writes,
// and an unpacked kernel package has none). A wanted module that does not
// exist is skipped: it may be built into the kernel.
func ResolveModules(modDir string, want []string) ([]string, error) {
	paths := map[string]string{}
	err := filepath.WalkDir(modDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			paths[modName(p)] = p
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string, depth int) error
	visit = func(name string, depth int) error {
		p, ok := paths[name]
		if !ok || state[name] == 2 {
			return nil
		}
		if state[name] == 1 || depth > 64 {
			return fmt.Errorf("module dependency cycle at %s", name)
		}
		state[name] = 1
		deps, err := moduleDeps(p)
		if err != nil {
			return err
		}
		sort.Strings(deps)
		for _, d := range deps {
			if err := visit(d, depth+1); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, p)
		return nil
	}
	for _, w := range want {
		if err := visit(modName(w), 0); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// copyFile copies src to dst with mode, replacing dst.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// unxzKernel decodes the single-block xz stream the kernel build writes
// (xz --check=crc32 --x86 --lzma2): github.com/ulikunitz/xz reads only
// plain LZMA2 blocks, so the block header is parsed here, the LZMA2 data
// decoded with its lzma package, and the x86 BCJ filter undone by bcjX86.
func unxzKernel(b []byte) ([]byte, error) {
	if len(b) < 12+2 {
		return nil, errors.New("xz: short stream")
	}
	h := b[12:]
	hsize := (int(h[0]) + 1) * 4
	if h[0] == 0 || hsize > len(h) {
		return nil, errors.New("xz: bad block header")
	}
	hdr := h[1:hsize]
	flags := hdr[0]
	nfilters := int(flags&3) + 1
	p := 1
	uvarint := func() (uint64, error) {
		v, n := binary.Uvarint(hdr[p:])
		if n <= 0 {
			return 0, errors.New("xz: bad varint in block header")
		}
		p += n
		return v, nil
	}
	if flags&0x40 != 0 {
		if _, err := uvarint(); err != nil {
			return nil, err
		}
	}
	if flags&0x80 != 0 {
		if _, err := uvarint(); err != nil {
			return nil, err
		}
	}
	x86, dictCap := false, 0
	for i := 0; i < nfilters; i++ {
		id, err := uvarint()
		if err != nil {
			return nil, err
		}
		psize, err := uvarint()
		if err != nil {
			return nil, err
		}
		if p+int(psize) > len(hdr) {
			return nil, errors.New("xz: bad filter properties")
		}
		props := hdr[p : p+int(psize)]
		p += int(psize)
		switch {
		case id == 0x04 && psize == 0:
			x86 = true
		case id == 0x21 && psize == 1 && i == nfilters-1:
			d := int(props[0])
			if d > 39 {
				d = 39
			}
			dictCap = (2 | d&1) << (d/2 + 11)
		default:
			return nil, fmt.Errorf("xz: unsupported filter 0x%x", id)
		}
	}
	if dictCap == 0 {
		return nil, errors.New("xz: no LZMA2 filter")
	}
	lr, err := lzma.Reader2Config{DictCap: dictCap}.NewReader2(bytes.NewReader(h[hsize:]))
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if _, err := io.Copy(&out, io.LimitReader(lr, 1<<30)); err != nil {
		return nil, fmt.Errorf("xz: %w", err)
	}
	buf := out.Bytes()
	if x86 {
		bcjX86(buf)
	}
	return buf, nil
}

// bcjX86 undoes xz's x86 branch/call/jump filter in place on a whole
// buffer that starts at stream position 0 (as in xz-embedded's bcj_x86).
func bcjX86(buf []byte) {
	allowed := [8]bool{true, true, true, false, true, false, false, false}
	bitNum := [8]uint32{0, 1, 2, 2, 3, 3, 3, 3}
	msb := func(b byte) bool { return b == 0x00 || b == 0xff }
	if len(buf) <= 4 {
		return
	}
	size := len(buf) - 4
	prevPos := -1
	prevMask := uint32(0)
	for i := 0; i < size; i++ {
		if buf[i]&0xfe != 0xe8 {
			continue
		}
		d := i - prevPos
		if d > 3 {
			prevMask = 0
		} else {
			prevMask = (prevMask << uint(d-1)) & 7
			if prevMask != 0 {
				b := buf[i+4-int(bitNum[prevMask])]
				if !allowed[prevMask] || msb(b) {
					prevPos = i
					prevMask = prevMask<<1 | 1
					continue
				}
			}
		}
		prevPos = i
		if msb(buf[i+4]) {
			src := binary.LittleEndian.Uint32(buf[i+1:])
			var dest uint32
			for {
				dest = src - uint32(i+5)
				if prevMask == 0 {
					break
				}
				j := bitNum[prevMask] * 8
				if !msb(byte(dest >> (24 - j))) {
					break
				}
				src = dest ^ (1<<(32-j) - 1)
			}
			dest &= 0x01ffffff
			dest |= 0 - (dest & 0x01000000)
			binary.LittleEndian.PutUint32(buf[i+1:], dest)
			i += 4
		} else {
			prevMask = prevMask<<1 | 1
		}
	}
}
