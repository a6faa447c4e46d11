package vminit

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestConfigRoundTrip(t *testing.T) {
	c := Config{Token: "secret", Hostname: "cubicle-abc", Env: map[string]string{"CUBICLE_WIDTH": "800", "X": "a b"}}
	b, err := EncodeConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%configBlock != 0 {
		t.Errorf("config disk is %d bytes, want a multiple of %d", len(b), configBlock)
	}
	got, err := DecodeConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if _, err := DecodeConfig([]byte("{not json")); err == nil {
		t.Error("DecodeConfig of garbage: want an error")
	}
}

func TestParseIPParam(t *testing.T) {
	for _, bad := range []string{"", "dhcp", "10.0.0.2::10.0.0.1", "x::10.0.0.1:255.255.255.0:h:eth0:off", "10.0.0.2::10.0.0.1:zz:h:eth0:off"} {
		if _, err := ParseIPParam(bad); err == nil {
			t.Errorf("ParseIPParam(%q): want an error", bad)
		}
	}
	n, err := ParseIPParam("10.0.0.2:::255.255.0.0:h::off")
	if err != nil || n.Addr.String() != "10.0.0.2/16" || n.Gateway.IsValid() || n.Device != "eth0" {
		t.Errorf("ParseIPParam without gateway = %+v, %v", n, err)
	}
}
