package firecracker

import (
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// numaArgs are the cpuset arguments the jailer command has for NUMA node
// 0 when this host shows its cpulist.
func numaArgs() []string {
	cpus, err := os.ReadFile("/sys/devices/system/node/node0/cpulist")
	if err != nil || strings.TrimSpace(string(cpus)) == "" {
		return nil
	}
	return []string{"--cgroup", "cpuset.mems=0", "--cgroup", "cpuset.cpus=" + strings.TrimSuffix(string(cpus), "\n")}
}

func TestJailerCommand(t *testing.T) {
	d := New(Config{
		FirecrackerBin: "/usr/local/bin/firecracker", JailerBin: "/usr/local/bin/jailer",
		ChrootBase: "/srv/cubicle", UID: 990, GID: 991,
	})
	mem := func(n int) string { return strconv.Itoa((n + DefaultMemoryOverheadMB) << 20) }
	for _, tc := range []struct {
		name    string
		netns   string
		version int
		want    []string
	}{
		{"v2 with netns", "/run/netns/cubicle-ab12", 2, concat(
			[]string{"--id", "ab12", "--uid", "990", "--gid", "991", "--exec-file", "/usr/local/bin/firecracker"},
			numaArgs(),
			[]string{"--cgroup-version", "2", "--chroot-base-dir", "/srv/cubicle", "--netns", "/run/netns/cubicle-ab12",
				"--parent-cgroup", "cubicle", "--cgroup", "memory.max=" + mem(1024), "--new-pid-ns",
				"--", "--api-sock", "/api.sock"},
		)},
		{"v1 without network", "", 1, concat(
			[]string{"--id", "ab12", "--uid", "990", "--gid", "991", "--exec-file", "/usr/local/bin/firecracker"},
			numaArgs(),
			[]string{"--cgroup-version", "1", "--chroot-base-dir", "/srv/cubicle",
				"--parent-cgroup", "cubicle", "--cgroup", "memory.limit_in_bytes=" + mem(1024), "--new-pid-ns",
				"--", "--api-sock", "/api.sock"},
		)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := d.jailerCommand("ab12", tc.netns, 1024, tc.version)
			if cmd.Path != "/usr/local/bin/jailer" {
				t.Errorf("path %q", cmd.Path)
			}
			if diff := cmp.Diff(tc.want, cmd.Args[1:]); diff != "" {
				t.Errorf("jailer args (-want +got):\n%s", diff)
			}
			if cmd.SysProcAttr != nil || cmd.Stdout != nil {
				t.Errorf("command has process attributes before launch")
			}
		})
	}
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestCgroupDirs(t *testing.T) {
	v1 := `cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0
`
	got := cgroupDirs([]byte(v1), 1, "cubicle", "ab12", []string{"memory", "cpuset"})
	want := []string{"/sys/fs/cgroup/cpuset/cubicle/ab12", "/sys/fs/cgroup/memory/cubicle/ab12"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("v1 (-want +got):\n%s", diff)
	}
	v2 := "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec 0 0\n"
	if diff := cmp.Diff([]string{"/sys/fs/cgroup/cubicle/ab12"}, cgroupDirs([]byte(v2), 2, "cubicle", "ab12", []string{"memory"})); diff != "" {
		t.Errorf("v2 (-want +got):\n%s", diff)
	}
	args := []string{"--id", "x", "--cgroup", "cpuset.mems=0", "--cgroup", "memory.max=5", "--cgroup", "cpuset.cpus=0", "--", "--cgroup", "pids.max=1"}
	if diff := cmp.Diff([]string{"cpuset", "memory"}, cgroupControllers(args)); diff != "" {
		t.Errorf("controllers (-want +got):\n%s", diff)
	}
}

func TestKernelArgs(t *testing.T) {
	spec := withDefaults(driver.Spec{ID: "ab12", Session: driver.Session{Token: "deadbeef", StartURL: "https://example.test/"}})
	got, err := KernelArgs(spec, "init=/init")
	if err != nil {
		t.Fatal(err)
	}
	want := "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd quiet loglevel=3 random.trust_cpu=on init=/init"
	if got != want {
		t.Errorf("KernelArgs =\n%s\nwant\n%s", got, want)
	}
	spec.Net = &driver.Net{Addr: netip.MustParsePrefix("172.30.0.5/24"), Gateway: netip.MustParseAddr("172.30.0.1"),
		DNS: []netip.Addr{netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("9.9.9.9")}}
	got, _ = KernelArgs(spec, "")
	if want := " random.trust_cpu=on ip=172.30.0.5::172.30.0.1:255.255.255.0:cubicle-ab12:eth0:off:1.1.1.1:9.9.9.9"; !strings.HasSuffix(got, want) {
		t.Errorf("network args: %s, want suffix %s", got, want)
	}
	// With i8042.nopnp an ACPI guest (Firecracker >= 1.8) has no keyboard
	// controller, and SendCtrlAltDel, the driver's clean stop, reaches
	// nothing.
	if strings.Contains(" "+got+" ", " i8042.nopnp ") {
		t.Errorf("kernel args %q disable the ACPI keyboard controller SendCtrlAltDel needs", got)
	}
	if _, err := KernelArgs(spec, strings.Repeat("x", 2000)); err == nil {
		t.Error("overlong command line accepted")
	}
}
