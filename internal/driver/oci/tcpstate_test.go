package oci

import (
	"strings"
	"testing"
)

// A /proc/net/tcp and tcp6 as a box shows them: x11vnc listening on
// 127.0.0.1:5999, a browser's connection to 192.0.2.1:8080 established
// and one in TIME-WAIT, a closed socket, and an IPv6 listener.
const sampleTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:176F 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 02005A0A:8A3D 010200C0:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0000000000000000 20 4 30 10 -1
   2: 02005A0A:8A3E 010200C0:1F90 06 00000000:00000000 03:00000ABC 00000000     0        0 0 3 0000000000000000
   3: 0100007F:C000 0100007F:176F 07 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 100 0 0 10 0
`

func TestConnectedTCP(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string // local→remote state
		wantErr  string
	}{
		{name: "box with a browser", in: sampleTCP, want: []string{"10.90.0.2:35389→192.0.2.1:8080 ESTAB", "10.90.0.2:35390→192.0.2.1:8080 TIME-WAIT"}},
		{name: "empty", in: ""},
		{name: "headers only", in: "  sl  local_address rem_address   st\n"},
		{name: "ipv6 established", in: "   0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:C001 01 0 0\n", want: []string{"[::1]:8080→[::1]:49153 ESTAB"}},
		{name: "garbage line", in: "hello world\n", wantErr: "unexpected line"},
		{name: "bad state", in: "   0: 0100007F:176F 00000000:0000 ZZ 0\n", wantErr: "state"},
		{name: "bad address", in: "   0: 0100007:176F 00000000:0000 01 0\n", wantErr: "address"},
		{name: "bad port", in: "   0: 0100007F:1Z6F 00000000:0000 01 0\n", wantErr: "port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := connectedTCP(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one about %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var s []string
			for _, c := range got {
				s = append(s, c.Local.String()+"→"+c.Remote.String()+" "+c.State)
			}
			if strings.Join(s, "; ") != strings.Join(tt.want, "; ") {
				t.Errorf("got %v, want %v", s, tt.want)
			}
		})
	}
}

// FuzzConnectedTCP feeds the parser what a box's /proc/net/tcp could
// hold (the box controls it): it must not panic, and what it returns
// must be connected endpoints only.
func FuzzConnectedTCP(f *testing.F) {
	f.Add(sampleTCP)
	f.Add("   0: 0100007F:176F 00000000:0000 01\n")
	f.Add("sl\n\n  0: :")
	f.Fuzz(func(t *testing.T, in string) {
		conns, err := connectedTCP(in)
		if err != nil {
			return
		}
		for _, c := range conns {
			if c.State == "LISTEN" || c.State == "CLOSE" || !c.Local.IsValid() || !c.Remote.IsValid() {
				t.Fatalf("returned %+v", c)
			}
		}
	})
}
