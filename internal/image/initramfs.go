package image

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Paths inside the initramfs the VM init (internal/agent/vminit) relies on.
const (
	// InitramfsModules lists the module files to load, in order, one path a
	// line.
	InitramfsModules = "/etc/cubicle/modules"
	// InitramfsModuleDir holds the module files.
	InitramfsModuleDir = "/lib/modules"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks as an
// initramfs (see the kernel's Documentation/driver-api/early-userspace).
type cpioWriter struct {
	w   *bufio.Writer
	ino uint32
	n   int64
}

func (c *cpioWriter) pad() error {
	for c.n%4 != 0 {
		if err := c.w.WriteByte(0); err != nil {
			return err
		}
		c.n++
	}
	return nil
}

// entry writes one header, name and data. mode includes the file type bits
// (S_IFREG 0o100000, S_IFDIR 0o040000, S_IFCHR 0o020000).
func (c *cpioWriter) entry(name string, mode uint32, data []byte, rdevMajor, rdevMinor uint32) error {
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	for _, part := range [][]byte{[]byte(hdr), []byte(name), {0}} {
		k, err := c.w.Write(part)
		c.n += int64(k)
		if err != nil {
			return err
		}
	}
	if err := c.pad(); err != nil {
		return err
	}
	k, err := c.w.Write(data)
	c.n += int64(k)
	if err != nil {
		return err
	}
	return c.pad()
}

func (c *cpioWriter) close() error {
	if err := c.entry("TRAILER!!!", 0, nil, 0, 0); err != nil {
		return err
	}
	return c.w.Flush()
}

// WriteInitramfs writes an uncompressed newc initramfs to w holding init
// (the static cubicle-agent, which runs as /init and detects that it is PID
// 1 of a VM), the vm's kernel modules under /lib/modules with their load
// order in /etc/cubicle/modules, and /dev/console. It is uncompressed on
// purpose: under TCG, decompressing ~20 MB costs the guest more time than
// QEMU copying it.
func WriteInitramfs(w io.Writer, vm VM, init []byte) error {
	c := &cpioWriter{w: bufio.NewWriterSize(w, 1<<20)}
	for _, d := range []string{"dev", "proc", "sys", "run", "newroot", "etc", "etc/cubicle", "lib", "lib/modules"} {
		if err := c.entry(d, 0o040755, nil, 0, 0); err != nil {
			return err
		}
	}
	if err := c.entry("dev/console", 0o020600, nil, 5, 1); err != nil {
		return err
	}
	mods, err := vm.moduleList()
	if err != nil {
		return err
	}
	var list strings.Builder
	for _, m := range mods {
		data, err := os.ReadFile(filepath.Join(vm.Modules, m))
		if err != nil {
			return err
		}
		p := InitramfsModuleDir + "/" + m
		if err := c.entry(strings.TrimPrefix(p, "/"), 0o100644, data, 0, 0); err != nil {
			return err
		}
		list.WriteString(p + "\n")
	}
	if err := c.entry(strings.TrimPrefix(InitramfsModules, "/"), 0o100644, []byte(list.String()), 0, 0); err != nil {
		return err
	}
	if err := c.entry("init", 0o100755, init, 0, 0); err != nil {
		return err
	}
	return c.close()
}

// Initramfs returns the path of the initramfs for vm with agentBin as its
// init, building it into cacheDir when missing. The file name is derived
// from the agent binary's and the kernel's identity, so a new agent (a
// daemon upgrade) or a new image version gets a new initramfs, while boxes
// started earlier keep theirs; the file is written under a temporary name
// and renamed, so a reader never sees half of it.
func Initramfs(vm VM, agentBin, cacheDir string) (string, error) {
	agent, err := os.ReadFile(agentBin)
	if err != nil {
		return "", fmt.Errorf("initramfs: agent binary: %w", err)
	}
	list, err := vm.moduleList()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(agent)
	fmt.Fprintf(h, "\x00%s\x00%s\x00%s", vm.Dir, vm.Release, strings.Join(list, ","))
	path := filepath.Join(cacheDir, "initramfs-"+hex.EncodeToString(h.Sum(nil))[:20]+".cpio")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(cacheDir, ".initramfs-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if err := WriteInitramfs(f, vm, agent); err != nil {
		f.Close()
		return "", fmt.Errorf("initramfs: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Chmod(f.Name(), 0o600); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return "", err
	}
	return path, nil
}
