package vminit

import (
	"reflect"
	"strings"
	"testing"
)

// FuzzParseIPParam: the guest reads its network from the kernel command
// line. No value may panic, and whatever parses must format and parse
// back to the same network (what init applies is what was meant).
func FuzzParseIPParam(f *testing.F) {
	f.Add("10.0.0.2::10.0.0.1:255.255.255.0:host:eth0:off:10.0.0.53:1.1.1.1")
	f.Add("10.0.0.2:::255.255.0.255::eth0:off")
	f.Add("10.0.0.2::fe80::1:255.0.0.0:h:e:off:::")
	f.Fuzz(func(t *testing.T, v string) {
		n, err := ParseIPParam(v)
		if err != nil {
			return
		}
		again, err := ParseIPParam(strings.TrimPrefix(IPParam(n, "h"), "ip="))
		if err != nil {
			t.Fatalf("%q parsed to %+v, which formats to something unparsable: %v", v, n, err)
		}
		if len(n.DNS) > 2 {
			n.DNS = n.DNS[:2] // the kernel's syntax holds two
		}
		if !reflect.DeepEqual(n, again) {
			t.Fatalf("%q: %+v formats and parses back as %+v", v, n, again)
		}
	})
}

// FuzzDecodeConfig: a config disk's contents; no input may panic.
func FuzzDecodeConfig(f *testing.F) {
	b, _ := EncodeConfig(Config{})
	f.Add(b)
	f.Add([]byte(`{"env":{"A":"b"}}` + "\x00\x00garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		DecodeConfig(b)
	})
}

// FuzzClassifyDisk: the first bytes of a virtio disk, which the guest reads
// to tell its root disk from its config disk; no input may panic, and
// nothing is taken for both.
func FuzzClassifyDisk(f *testing.F) {
	b, _ := EncodeConfig(Config{Token: "t"})
	f.Add(b)
	sb := make([]byte, 2048)
	sb[ext4MagicOffset], sb[ext4MagicOffset+1] = 0x53, 0xEF
	copy(sb[ext4LabelOffset:], RootLabel)
	f.Add(sb)
	f.Add([]byte(`{"token":"x"`))
	f.Fuzz(func(t *testing.T, head []byte) {
		k, ok := classifyDisk(head)
		if !ok {
			return
		}
		_, isExt4 := ext4Label(head)
		if (k == rootDisk) != isExt4 {
			t.Fatalf("classified %v, ext4 %v", k, isExt4)
		}
		if k == configDisk {
			if c, err := DecodeConfig(head); err != nil || c.Token == "" {
				t.Fatalf("config without a token accepted: %+v %v", c, err)
			}
		}
	})
}
