package oci

import "testing"

// goferTable is /proc/GOFER/net/unix of a gVisor box seen in a soak: the
// agent's listening socket, the gofer's seqpacket channels to the
// sandbox, and (below, in tests) accepted connections.
const goferTable = `Num       RefCount Protocol Flags    Type St Inode Path
000000001460474b: 00000003 00000000 00000000 0005 03 2657732
00000000c1fd9a17: 00000003 00000000 00000000 0005 03 2657731
0000000046ef1ca6: 00000002 00000000 00010000 0001 01 2658061 /run/cubicle/agent.sock
00000000a289f40e: 00000003 00000000 00000000 0005 03 2658049
`

func TestHeldStreams(t *testing.T) {
	for _, tt := range []struct {
		name    string
		table   string
		want    int
		wantErr bool
	}{
		{"none held", goferTable, 0, false},
		{"two accepted connections", goferTable +
			"00000000aaaaaaaa: 00000002 00000000 00000000 0001 03 2658100 /run/cubicle/agent.sock\n" +
			"00000000bbbbbbbb: 00000002 00000000 00000000 0001 03 2658101\n", 2, false},
		{"a connection queued on the listener counts", goferTable +
			"00000000cccccccc: 00000002 00000000 00000000 0001 02 2658102\n", 1, false},
		{"a second listener does not", goferTable +
			"00000000eeeeeeee: 00000002 00000000 00010000 0001 01 2658103 /run/other.sock\n", 0, false},
		{"header only", "Num       RefCount Protocol Flags    Type St Inode Path\n", 0, false},
		{"empty", "", 0, false},
		{"short line", goferTable + "0000: 00000002 0001\n", 0, true},
		{"no colon", goferTable + "00000000dddddddd 00000002 00000000 00000000 0001 03 1\n", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := heldStreams(tt.table)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("heldStreams = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// FuzzHeldStreams: the table is the kernel's, but a misread must be an
// error, never a panic or a negative count.
func FuzzHeldStreams(f *testing.F) {
	f.Add(goferTable)
	f.Add("Num\n0: 1 2 3 0001 03 4\n")
	f.Add("\n\n")
	f.Fuzz(func(t *testing.T, in string) {
		n, err := heldStreams(in)
		if err == nil && n < 0 {
			t.Fatalf("%d held", n)
		}
	})
}
