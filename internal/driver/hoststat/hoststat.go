// Package hoststat reads what a box uses of the host from the kernel's
// own accounts: a cgroup's CPU and memory files (cgroup v1, as on hosts
// in hybrid mode, and v2), a process's /proc/PID/stat, a filesystem's
// statfs, the blocks a file or a directory tree has allocated, and the
// virtual size in a qcow2 header. The backends (internal/driver/oci,
// qemu, firecracker) build their driver.Meter from it; nothing else
// should import it.
//
// Every parser here takes text a box can influence (its cgroup's
// counters, a process name it chose, a disk header its VMM wrote), so
// each reads a bounded amount, skips lines it does not know, and has a
// fuzz target. It uses the standard library and x/sys/unix only: the
// few files involved do not justify a cgroup library, whose managers
// would also want to own the cgroups the runtimes made.
package hoststat

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// maxFile bounds what is read of one kernel file: memory.stat, the
// largest read here, is about 1.5 KiB.
const maxFile = 64 << 10

// readFile reads at most maxFile bytes of path.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxFile))
}

// ParseKeyed parses a flat keyed file of the kernel ("key value" a line:
// cpu.stat, memory.stat, cpuacct.stat). Lines that are not a key and one
// unsigned integer are skipped, so that a kernel adding a line of
// another shape breaks nothing; an error means the data had no line at
// all that parsed.
func ParseKeyed(data []byte) (map[string]uint64, error) {
	out := make(map[string]uint64)
	for line := range bytes.SplitSeq(data, []byte{'\n'}) {
		f := bytes.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			continue
		}
		out[string(f[0])] = v
	}
	if len(out) == 0 && len(bytes.TrimSpace(data)) > 0 {
		return nil, errors.New("no key-value line")
	}
	return out, nil
}

// ParseValue parses a single-value kernel file: a decimal integer
// (possibly negative, as cgroup v1's cpu.cfs_quota_us "-1"), or "max"
// (cgroup v2's "no limit"), which reports unlimited.
func ParseValue(data []byte) (v int64, unlimited bool, err error) {
	s := string(bytes.TrimSpace(data))
	if s == "max" {
		return 0, true, nil
	}
	v, err = strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("not a number or \"max\": %q", truncate(s, 32))
	}
	return v, false, nil
}

// ParseCPUMax parses cgroup v2's cpu.max ("QUOTA PERIOD", QUOTA "max"
// for none) into the CPUs it allows: QUOTA/PERIOD, 0 for no quota.
func ParseCPUMax(data []byte) (float64, error) {
	f := bytes.Fields(data)
	if len(f) != 2 {
		return 0, fmt.Errorf("cpu.max: want \"QUOTA PERIOD\", got %q", truncate(string(data), 32))
	}
	period, err := strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil || period == 0 {
		return 0, fmt.Errorf("cpu.max: bad period %q", truncate(string(f[1]), 32))
	}
	if string(f[0]) == "max" {
		return 0, nil
	}
	quota, err := strconv.ParseUint(string(f[0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cpu.max: bad quota %q", truncate(string(f[0]), 32))
	}
	return float64(quota) / float64(period), nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
