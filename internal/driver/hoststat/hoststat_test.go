package hoststat

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseKeyed(t *testing.T) {
	for _, tt := range []struct {
		name    string
		in      string
		want    map[string]uint64
		wantErr bool
	}{
		{"cgroup v2 cpu.stat", "usage_usec 38153276459\nuser_usec 23745163594\nsystem_usec 14408112865\nnice_usec 2599964\n",
			map[string]uint64{"usage_usec": 38153276459, "user_usec": 23745163594, "system_usec": 14408112865, "nice_usec": 2599964}, false},
		{"v1 memory.stat", "cache 14221312\nrss 5885952\ntotal_inactive_file 1133043712\n",
			map[string]uint64{"cache": 14221312, "rss": 5885952, "total_inactive_file": 1133043712}, false},
		{"lines of other shapes skipped", "some 1 2\nneg -5\nok 7\nword\n\n", map[string]uint64{"ok": 7}, false},
		{"empty", "", map[string]uint64{}, false},
		{"nothing parses", "garbage here now\n", nil, true},
		{"overflow skipped", "big 18446744073709551616\nx 1\n", map[string]uint64{"x": 1}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKeyed([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr {
				if d := cmp.Diff(tt.want, got); d != "" {
					t.Errorf("(-want +got):\n%s", d)
				}
			}
		})
	}
}

func TestParseValue(t *testing.T) {
	for _, tt := range []struct {
		in        string
		want      int64
		unlimited bool
		wantErr   bool
	}{
		{"2147483648\n", 2147483648, false, false},
		{"max\n", 0, true, false},
		{"-1\n", -1, false, false},
		{"9223372036854771712", 9223372036854771712, false, false},
		{"", 0, false, true},
		{"12 34", 0, false, true},
		{"0x10", 0, false, true},
		{"99999999999999999999", 0, false, true},
	} {
		got, unlimited, err := ParseValue([]byte(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want || unlimited != tt.unlimited {
			t.Errorf("ParseValue(%q) = %d, %v, %v; want %d, %v, error %v", tt.in, got, unlimited, err, tt.want, tt.unlimited, tt.wantErr)
		}
	}
}

func TestParseCPUMax(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    float64
		wantErr bool
	}{
		{"200000 100000\n", 2, false},
		{"50000 100000\n", 0.5, false},
		{"max 100000\n", 0, false},
		{"max 0\n", 0, true},
		{"200000\n", 0, true},
		{"a b\n", 0, true},
		{"-5 100000", 0, true},
	} {
		got, err := ParseCPUMax([]byte(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseCPUMax(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// realStat is a /proc/PID/stat line of this machine's cat(1).
const realStat = "8781 (cat) R 8779 8779 29822 0 -1 4194304 99 0 0 0 250 130 0 0 20 0 1 0 2949630 3133440 390 18446744073709551615 94918695616512 94918695636393 140722921974192 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94918695652400 94918695654016 94919165001728 140722921978563 140722921978583 140722921978583 140722921979883 0\n"

func TestParseProcStat(t *testing.T) {
	for _, tt := range []struct {
		name    string
		in      string
		want    ProcStat
		wantErr bool
	}{
		{"real", realStat, ProcStat{UTime: 250, STime: 130, StartTime: 2949630, RSSPages: 390}, false},
		// A process may name itself anything, ") 1 2 3" included.
		{"name with parentheses and spaces", "42 (a) b (c) R" + realStat[len("8781 (cat) R"):],
			ProcStat{UTime: 250, STime: 130, StartTime: 2949630, RSSPages: 390}, false},
		{"negative rss clamped", "1 (x) S 0 0 0 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0 77 0 -3 0", ProcStat{UTime: 5, STime: 6, StartTime: 77}, false},
		{"no parenthesis", "1 x S 0", ProcStat{}, true},
		{"too short", "1 (x) S 0 0 0", ProcStat{}, true},
		{"not a number", "1 (x) S 0 0 0 0 -1 0 0 0 0 0 zz 6 0 0 20 0 1 0 77 0 3 0", ProcStat{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseProcStat([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if got := (ProcStat{UTime: 250, STime: 130}).CPUSeconds(); got != 3.8 {
		t.Errorf("CPUSeconds = %v, want 3.8", got)
	}
}

func TestReadProcSelf(t *testing.T) {
	// Burn a little CPU so the figure is not zero.
	deadline := time.Now().Add(30 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	p, err := ReadProc(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.CPUSeconds <= 0 || p.RSSBytes < 1<<20 {
		t.Errorf("self: %+v, want some CPU time and at least 1 MiB resident", p)
	}
	data, _ := os.ReadFile("/proc/self/stat")
	st, _ := ParseProcStat(data)
	if _, err := ReadProc(os.Getpid(), st.StartTime+1); err == nil {
		t.Error("a start time that does not match was accepted")
	}
	if _, err := ReadProc(0, 0); err == nil {
		t.Error("pid 0 was accepted")
	}
}

func qcow2Header(version uint32, size uint64) []byte {
	h := make([]byte, 72)
	binary.BigEndian.PutUint32(h[0:], qcow2Magic)
	binary.BigEndian.PutUint32(h[4:], version)
	binary.BigEndian.PutUint64(h[24:], size)
	return h
}

func TestParseQcow2Size(t *testing.T) {
	for _, tt := range []struct {
		name    string
		in      []byte
		want    int64
		wantErr bool
	}{
		{"v3", qcow2Header(3, 4<<30), 4 << 30, false},
		{"v2", qcow2Header(2, 1<<20), 1 << 20, false},
		{"v4", qcow2Header(4, 1<<20), 0, true},
		{"short", qcow2Header(3, 1)[:31], 0, true},
		{"raw disk", make([]byte, 512), 0, true},
		{"absurd size", qcow2Header(3, 1<<63), 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseQcow2Size(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("got %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// writeTree writes files (path → content) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadCgroup(t *testing.T) {
	host := float64(runtime.NumCPU())
	for _, tt := range []struct {
		name    string
		files   map[string]string
		want    Cgroup
		wantErr bool
	}{
		{"v2", map[string]string{
			"cgroup.controllers":        "cpu memory pids\n",
			"cubicle/b1/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
			"cubicle/b1/cpu.max":        "50000 100000\n",
			"cubicle/b1/memory.current": "300000000\n",
			"cubicle/b1/memory.stat":    "anon 200000000\nfile 90000000\ninactive_file 40000000\n",
			"cubicle/b1/memory.max":     "2147483648\n",
		}, Cgroup{CPUSeconds: 2.5, CPUs: min(0.5, host), MemoryBytes: 260000000, MemoryCacheBytes: 90000000, MemoryLimitBytes: 2147483648}, false},
		{"v2 without limits", map[string]string{
			"cgroup.controllers":        "cpu memory\n",
			"cubicle/b1/cpu.stat":       "usage_usec 1000000\n",
			"cubicle/b1/cpu.max":        "max 100000\n",
			"cubicle/b1/memory.current": "1000\n",
			"cubicle/b1/memory.max":     "max\n",
		}, Cgroup{CPUSeconds: 1, CPUs: host, MemoryBytes: 1000}, false},
		{"v2 missing", map[string]string{"cgroup.controllers": "cpu\n"}, Cgroup{}, true},
		{"v1, cpu and cpuacct apart (this project's CI host)", map[string]string{
			"cpuacct/cubicle/b1/cpuacct.usage":        "1500000000\n",
			"cpu/cubicle/b1/cpu.cfs_quota_us":         "100000\n",
			"cpu/cubicle/b1/cpu.cfs_period_us":        "100000\n",
			"memory/cubicle/b1/memory.usage_in_bytes": "500000000\n",
			"memory/cubicle/b1/memory.stat":           "cache 1\ninactive_file 1\ntotal_cache 120000000\ntotal_inactive_file 100000000\n",
			"memory/cubicle/b1/memory.limit_in_bytes": "1073741824\n",
		}, Cgroup{CPUSeconds: 1.5, CPUs: min(1, host), MemoryBytes: 400000000, MemoryCacheBytes: 120000000, MemoryLimitBytes: 1073741824}, false},
		{"v1 co-mounted, unlimited", map[string]string{
			"cpu,cpuacct/cubicle/b1/cpuacct.usage":     "2000000000\n",
			"cpu,cpuacct/cubicle/b1/cpu.cfs_quota_us":  "-1\n",
			"cpu,cpuacct/cubicle/b1/cpu.cfs_period_us": "100000\n",
			"memory/cubicle/b1/memory.usage_in_bytes":  "4096\n",
			"memory/cubicle/b1/memory.stat":            "cache 8192\ninactive_file 8192\n",
			"memory/cubicle/b1/memory.limit_in_bytes":  "9223372036854771712\n",
		}, Cgroup{CPUSeconds: 2, CPUs: host, MemoryBytes: 0, MemoryCacheBytes: 8192}, false},
		{"v1 without memory", map[string]string{"cpuacct/cubicle/b1/cpuacct.usage": "1\n"}, Cgroup{}, true},
		{"v1 garbage", map[string]string{"cpuacct/cubicle/b1/cpuacct.usage": "lots\n", "memory/cubicle/b1/memory.usage_in_bytes": "1\n"}, Cgroup{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tt.files)
			got, err := ReadCgroup(root, "cubicle/b1")
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestTreeSizer(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a": string(bytes.Repeat([]byte("x"), 64<<10)), "d/b": "hi"})
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "d", "a-again")); err != nil {
		t.Fatal(err)
	}
	ts := &TreeSizer{Every: time.Hour}
	n, err := ts.Size(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The 64 KiB file counts once whatever its links; directories and
	// the small file add a few blocks.
	if n < 64<<10 || n > 128<<10 {
		t.Errorf("tree of 64 KiB + 2 bytes: %d bytes allocated", n)
	}
	writeTree(t, dir, map[string]string{"c": string(bytes.Repeat([]byte("y"), 1<<20))})
	if again, _ := ts.Size(dir); again != n {
		t.Errorf("walked again within Every: %d, then %d", n, again)
	}
	fresh := &TreeSizer{}
	if grown, _ := fresh.Size(dir); grown < n+1<<20 {
		t.Errorf("after a 1 MiB write: %d bytes, want at least %d", grown, n+1<<20)
	}
	limited := &TreeSizer{MaxEntries: 2}
	if part, err := limited.Size(dir); err != nil || part >= n {
		t.Errorf("walk limited to 2 entries: %d, %v; want less than %d", part, err, n)
	}
	if _, err := ts.Size(filepath.Join(dir, "nope")); err == nil {
		t.Error("a missing directory was measured")
	}
}

func TestMountUsageRefusesPlainDir(t *testing.T) {
	if _, _, err := MountUsage(t.TempDir()); err == nil {
		t.Error("a directory that is no mount point was measured as one")
	}
	if _, _, err := MountUsage("/proc"); err != nil {
		t.Errorf("/proc: %v", err)
	}
}

func TestAllocated(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(1 << 30)
	f.WriteAt(bytes.Repeat([]byte("z"), 1<<20), 0)
	f.Close()
	alloc, size, err := Allocated(p)
	if err != nil {
		t.Fatal(err)
	}
	if size != 1<<30 || alloc < 1<<20 || alloc > 8<<20 {
		t.Errorf("1 GiB sparse file with 1 MiB written: allocated %d, size %d", alloc, size)
	}
}

func FuzzParseKeyed(f *testing.F) {
	f.Add([]byte("usage_usec 1\nuser_usec 2\n"))
	f.Add([]byte("total_cache 3637751808\ntotal_inactive_file 1133043712\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseKeyed(data)
		if err == nil && m == nil {
			t.Fatal("nil map without an error")
		}
	})
}

func FuzzParseValue(f *testing.F) {
	f.Add([]byte("max\n"))
	f.Add([]byte("-1\n"))
	f.Add([]byte("9223372036854771712\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, unlimited, err := ParseValue(data)
		if err != nil && (v != 0 || unlimited) {
			t.Fatalf("error %v with value %d, unlimited %v", err, v, unlimited)
		}
	})
}

func FuzzParseCPUMax(f *testing.F) {
	f.Add([]byte("200000 100000\n"))
	f.Add([]byte("max 100000\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cpus, err := ParseCPUMax(data)
		if err == nil && (cpus < 0 || math.IsNaN(cpus)) {
			t.Fatalf("CPUs %v", cpus)
		}
	})
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte(realStat))
	f.Add([]byte("1 ((x) )) S 0 0 0 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0 77 0 3 0"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseProcStat(data)
		if err == nil && p.RSSPages < 0 {
			t.Fatalf("negative RSS %d", p.RSSPages)
		}
	})
}

func FuzzParseQcow2Size(f *testing.F) {
	f.Add(qcow2Header(3, 4<<30))
	f.Add(qcow2Header(2, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := ParseQcow2Size(data)
		if err == nil && (n < 0 || len(data) < 32) {
			t.Fatalf("size %d from %d bytes", n, len(data))
		}
	})
}
