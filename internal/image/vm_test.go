package image

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// fakeBzImage wraps payload the way an x86 bzImage does: a setup header
// naming the payload's offset and length, one setup sector.
func fakeBzImage(payload []byte) []byte {
	b := make([]byte, 2*512)
	b[0x1f1] = 1 // setup_sects
	copy(b[0x202:], "HdrS")
	binary.LittleEndian.PutUint32(b[0x248:], 16) // payload_offset, from the protected-mode code
	binary.LittleEndian.PutUint32(b[0x24c:], uint32(len(payload)))
	b = append(b, make([]byte, 16)...)
	b = append(b, payload...)
	return append(b, 0xde, 0xad, 0xbe, 0xef) // trailing data after the payload
}

func TestExtractVmlinuxGzip(t *testing.T) {
	elf := append([]byte("\x7fELF"), bytes.Repeat([]byte("kernel"), 1000)...)
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(elf)
	zw.Close()
	got, err := ExtractVmlinux(fakeBzImage(z.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, elf) {
		t.Errorf("extracted %d bytes, want the %d-byte ELF", len(got), len(elf))
	}
	if _, err := ExtractVmlinux(fakeBzImage([]byte("not compressed"))); err == nil {
		t.Error("ExtractVmlinux of a bzImage without a payload: want an error")
	}
}

// TestExtractVmlinuxXZ compresses with xz the way the kernel build does
// (x86 BCJ filter + LZMA2, CRC32), when xz is installed.
func TestExtractVmlinuxXZ(t *testing.T) {
	needs.Command(t, "xz")
	// Code-like bytes with E8/E9 call and jump opcodes the filter rewrites.
	var elf bytes.Buffer
	elf.WriteString("\x7fELF")
	for i := 0; i < 20000; i++ {
		elf.Write([]byte{0x55, 0xe8, byte(i), byte(i >> 8), 0, 0, 0x90, 0xe9, byte(i * 7), 0xff, 0xff, 0xff})
	}
	cmd := exec.Command("xz", "--format=xz", "--check=crc32", "--x86", "--lzma2=dict=1MiB", "-c")
	cmd.Stdin = bytes.NewReader(elf.Bytes())
	xzData, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ExtractVmlinux(fakeBzImage(xzData))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, elf.Bytes()) {
		t.Errorf("xz+BCJ round trip differs (%d vs %d bytes)", len(got), len(elf.Bytes()))
	}
}

func TestWriteInitramfs(t *testing.T) {
	dir := t.TempDir()
	mods := filepath.Join(dir, "kernel", "modules")
	os.MkdirAll(mods, 0o755)
	os.WriteFile(filepath.Join(mods, "a.ko"), []byte("AAAA1"), 0o644)
	os.WriteFile(filepath.Join(mods, "order"), []byte("a.ko\n"), 0o644)
	vm := VM{Dir: dir, Modules: mods}
	var buf bytes.Buffer
	if err := WriteInitramfs(&buf, vm, []byte("#!init")); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not 4-aligned", buf.Len())
	}
	for _, want := range []string{"070701", "init\x00", "lib/modules/a.ko\x00", "AAAA1", "/lib/modules/a.ko\n", "TRAILER!!!\x00"} {
		if !bytes.Contains(buf.Bytes(), []byte(want)) {
			t.Errorf("archive lacks %q", want)
		}
	}
	// cpio, the kernel's own format's reference reader, lists what we wrote.
	t.Run("cpio reads it", func(t *testing.T) {
		needs.Command(t, "cpio")
		cmd := exec.Command("cpio", "-it")
		cmd.Stdin = bytes.NewReader(buf.Bytes())
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "lib/modules/a.ko") || !strings.Contains(string(out), "dev/console") {
			t.Errorf("cpio -it: %v\n%s", err, out)
		}
	})
	agent := filepath.Join(dir, "agent")
	os.WriteFile(agent, []byte("agent v1"), 0o755)
	p1, err := Initramfs(vm, agent, filepath.Join(dir, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := Initramfs(vm, agent, filepath.Join(dir, "cache")); p != p1 {
		t.Errorf("same agent: got %s, want the cached %s", p, p1)
	}
	os.WriteFile(agent, []byte("agent v2"), 0o755)
	if p, _ := Initramfs(vm, agent, filepath.Join(dir, "cache")); p == p1 {
		t.Errorf("a new agent binary must give a new initramfs")
	}
}

func TestMakeDisk(t *testing.T) {
	needs.Command(t, "mkfs.ext4")
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("x\n"), 0o644)
	out := filepath.Join(t.TempDir(), "disk.ext4")
	if err := makeDisk(t.Context(), root, out, 16); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < 64<<20+16<<20 {
		t.Errorf("disk is %d bytes, want at least the metadata reserve and the free space", fi.Size())
	}
	b := make([]byte, 2)
	f, _ := os.Open(out)
	f.ReadAt(b, 1080)
	f.Close()
	if b[0] != 0x53 || b[1] != 0xef {
		t.Errorf("no ext4 superblock magic: %x", b)
	}
}
