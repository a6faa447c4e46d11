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
