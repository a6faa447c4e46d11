package vminit

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// diskKind is which of its two disks the guest looks for.
type diskKind int

const (
	rootDisk   diskKind = iota // the image's ext4 (copy-on-write per VM)
	configDisk                 // the raw, read-only Config blob
)

func (k diskKind) String() string {
	if k == rootDisk {
		return "root disk"
	}
	return "config disk"
}

// serial is the virtio-blk serial the qemu driver gives the disk.
func (k diskKind) serial() string {
	if k == rootDisk {
		return RootSerial
	}
	return ConfigSerial
}

// diskFinder finds the VM's disks among the virtio-blk devices listed in
// SYS/block/vd* and readable at DEV/NAME: at boot /sys and /dev, in tests a
// tree standing in for them.
//
// A disk is recognised first by its serial and otherwise by its contents.
// QEMU passes the serials the driver sets (RootSerial, ConfigSerial).
// Firecracker cannot: it answers the virtio-blk device-ID request with an ID
// it makes from the backing file (its st_dev, st_rdev and st_ino in
// decimal, as kvmtool does), never the drive's id, so under Firecracker
// every disk has a serial and none is cubicle's. The contents decide then:
// the root disk is the ext4 file system labelled RootLabel that
// internal/image makes, the config disk the blob EncodeConfig writes (JSON
// with a token, NUL-padded), which an ext4 can never be (its first 1024
// bytes are zero). The device order is not used: nothing promises it, and
// a wrong guess would mount the config blob or hand the root disk to
// DecodeConfig.
type diskFinder struct{ sys, dev string }

// headSize is how much of each disk is read to recognise it: the ext4
// superblock is at 1024..2047, and a config's first byte is '{'.
const headSize = 4096

// maxConfig bounds how much of a disk is read as a config (readConfig reads
// as much).
const maxConfig = 1 << 20

// wait returns the DEV path of the disk of the given kind, waiting up to
// timeout for it to appear (virtio devices show up while their driver
// probes them).
func (f diskFinder) wait(kind diskKind, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		dev, seen := f.find(kind)
		if dev != "" {
			return dev, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%w: %s: no disk has serial %q or its contents (disks: %s)", errNoDisk, kind, kind.serial(), strings.Join(seen, "; "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// find returns the DEV path of the disk of the given kind, or "" and a
// description of every disk it looked at.
func (f diskFinder) find(kind diskKind) (string, []string) {
	blocks, _ := filepath.Glob(filepath.Join(f.sys, "block", "vd*"))
	var seen []string
	var byContent string
	for _, b := range blocks {
		name := filepath.Base(b)
		s, _ := os.ReadFile(filepath.Join(b, "serial"))
		serial := strings.TrimSpace(string(s))
		dev := filepath.Join(f.dev, name)
		switch serial {
		case kind.serial():
			return dev, nil
		case RootSerial, ConfigSerial:
			// The other disk, by its serial, whatever is on it.
			seen = append(seen, fmt.Sprintf("%s serial %q", name, serial))
			continue
		}
		head, err := readHead(dev)
		if err != nil {
			seen = append(seen, fmt.Sprintf("%s serial %q: %v", name, serial, err))
			continue
		}
		k, ok := classifyDisk(head)
		seen = append(seen, fmt.Sprintf("%s serial %q: %s", name, serial, describeHead(head, k, ok)))
		if ok && k == kind && byContent == "" {
			// Keep looking: a disk with the serial wins over contents.
			byContent = dev
		}
	}
	return byContent, seen
}

// readHead reads the first headSize bytes of a device (fewer if it is
// smaller) and, when they begin a config that goes on past them (no NUL
// yet), on up to the config's end or maxConfig bytes, so that a config
// with a large environment is recognised whole.
func readHead(dev string) ([]byte, error) {
	f, err := os.Open(dev)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, headSize)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, err
	}
	buf = buf[:n]
	if n < headSize || buf[0] != '{' || bytes.IndexByte(buf, 0) >= 0 {
		return buf, nil
	}
	rest, err := io.ReadAll(io.LimitReader(f, maxConfig-headSize))
	if err != nil {
		return nil, err
	}
	return append(buf, rest...), nil
}

// ext4 superblock facts (the superblock starts at byte 1024).
const (
	ext4SuperOffset = 1024
	ext4MagicOffset = ext4SuperOffset + 0x38 // __le16 s_magic
	ext4LabelOffset = ext4SuperOffset + 0x78 // char s_volume_name[16]
	ext4UUIDOffset  = ext4SuperOffset + 0x68 // __u8 s_uuid[16]
	ext4Magic       = 0xEF53
)

// ext4Label returns the volume label of the ext4 (or ext2/3) file system
// whose first bytes are head, and whether head is one.
func ext4Label(head []byte) (string, bool) {
	if len(head) < ext4LabelOffset+16 || binary.LittleEndian.Uint16(head[ext4MagicOffset:]) != ext4Magic {
		return "", false
	}
	label := head[ext4LabelOffset : ext4LabelOffset+16]
	if i := bytes.IndexByte(label, 0); i >= 0 {
		label = label[:i]
	}
	return string(label), true
}

// Ext4UUID returns the UUID of the ext4 file system whose first bytes
// are head (at least its first 2048), as 32 lower-case hex digits, and
// whether head is one. Hosts read a volume's with it, the guest its disks'.
func Ext4UUID(head []byte) (string, bool) {
	if len(head) < ext4LabelOffset+16 || binary.LittleEndian.Uint16(head[ext4MagicOffset:]) != ext4Magic {
		return "", false
	}
	return hex.EncodeToString(head[ext4UUIDOffset : ext4UUIDOffset+16]), true
}

// findUUID returns the DEV path of the disk whose ext4 UUID is uuid.
func (f diskFinder) findUUID(uuid string) string {
	blocks, _ := filepath.Glob(filepath.Join(f.sys, "block", "vd*"))
	for _, b := range blocks {
		dev := filepath.Join(f.dev, filepath.Base(b))
		if head, err := readHead(dev); err == nil {
			if u, ok := Ext4UUID(head); ok && u == uuid {
				return dev
			}
		}
	}
	return ""
}

// classifyDisk says which of the VM's disks head (a disk's first bytes)
// is: the root disk (an ext4 labelled RootLabel) or the config disk (a
// Config with a token); ok is false for anything else.
func classifyDisk(head []byte) (kind diskKind, ok bool) {
	if label, isExt4 := ext4Label(head); isExt4 {
		return rootDisk, label == RootLabel
	}
	if len(head) == 0 || head[0] != '{' {
		return 0, false
	}
	c, err := DecodeConfig(head)
	if err != nil || c.Token == "" {
		return 0, false
	}
	return configDisk, true
}

// describeHead says what a disk holds, for the error naming every disk.
func describeHead(head []byte, k diskKind, ok bool) string {
	if ok {
		return k.String()
	}
	if label, isExt4 := ext4Label(head); isExt4 {
		return fmt.Sprintf("ext4 labelled %q, not %q", label, RootLabel)
	}
	return "neither an ext4 nor a config"
}
