package oci

import "testing"

// daemonTable is /proc/self/net/unix of a daemon's network namespace as a
// soak saw it: the sentry of one box holds its runsc control connection,
// two unnamed stream sockets and (below, in tests) connections to its
// agent; other lines are other processes'.
const daemonTable = `Num       RefCount Protocol Flags    Type St Inode Path
000000005f14f9ca: 00000003 00000000 00000000 0001 03 5616752 @runsc-sandbox.yf35m6ngxbvwd57yxg532mvf7q@
00000000a6b05e5e: 00000003 00000000 00000000 0001 03 5534156
000000006986b602: 00000003 00000000 00000000 0005 03 5534157
00000000cafe0001: 00000002 00000000 00010000 0001 01 5534160 /run/cubicle/agent.sock
00000000beef0001: 00000003 00000000 00000000 0001 03 7777777 /run/cubicle/agent.sock
`

// sentry is what the box's sentry holds of daemonTable.
var sentry = map[uint64]bool{5616752: true, 5534156: true, 5534157: true, 5534160: true, 5625920: true, 5615177: true, 5625921: true}

func TestAgentConns(t *testing.T) {
	for _, tt := range []struct {
		name    string
		table   string
		want    int
		wantErr bool
	}{
		{"none held (another box's connection is not this one's)", daemonTable, 0, false},
		{"two held", daemonTable +
			"00000000aaaaaaaa: 00000003 00000000 00000000 0001 03 5625920 /run/cubicle/agent.sock\n" +
			"00000000bbbbbbbb: 00000003 00000000 00000000 0001 03 5615177 /run/cubicle/agent.sock\n", 2, false},
		{"one being set up", daemonTable +
			"00000000cccccccc: 00000002 00000000 00000000 0001 02 5625921 /run/cubicle/agent.sock\n", 1, false},
		{"header only", "Num       RefCount Protocol Flags    Type St Inode Path\n", 0, false},
		{"empty", "", 0, false},
		{"short line", daemonTable + "0000: 00000002 0001\n", 0, true},
		{"no colon", daemonTable + "00000000dddddddd 00000002 00000000 00000000 0001 03 1\n", 0, true},
		{"bad inode", daemonTable + "00000000dddddddd: 00000002 00000000 00000000 0001 03 x1\n", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := agentConns(tt.table, sentry)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("agentConns = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// FuzzAgentConns: the table is the kernel's, but a misread must be an
// error, never a panic or a negative count.
func FuzzAgentConns(f *testing.F) {
	f.Add(daemonTable)
	f.Add("Num\n0: 1 2 00000000 0001 03 4 /run/cubicle/agent.sock\n")
	f.Add("\n\n")
	f.Fuzz(func(t *testing.T, in string) {
		n, err := agentConns(in, sentry)
		if err == nil && n < 0 {
			t.Fatalf("%d held", n)
		}
	})
}
