package hoststat

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// CgroupRoot is where the cgroup filesystems are mounted.
const CgroupRoot = "/sys/fs/cgroup"

// v1Unlimited: cgroup v1 reports "no memory limit" as the largest
// page-aligned int64 (9223372036854771712); anything this large is no
// limit.
const v1Unlimited = 1 << 62

// Cgroup is what the processes of one cgroup use.
type Cgroup struct {
	CPUSeconds float64 // user + system since the cgroup was made
	// CPUs is the CPU quota in CPUs (quota / period), at most the host's
	// CPUs; the host's CPUs when there is no quota.
	CPUs             float64
	MemoryBytes      int64 // usage less inactive file pages
	MemoryCacheBytes int64 // file pages (page cache and shared memory)
	MemoryLimitBytes int64 // 0: none
}

// ReadCgroup reads the figures of the cgroup rel (e.g. "cubicle/ID", as
// an OCI spec's cgroupsPath names it) under root (CgroupRoot; tests
// give a directory of their own). With root/cgroup.controllers present
// the host is in cgroup v2's unified mode and rel is one directory;
// otherwise rel is looked for in the v1 hierarchies of the cpuacct, cpu
// and memory controllers (however the host co-mounts them).
func ReadCgroup(root, rel string) (Cgroup, error) {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return readCgroupV2(filepath.Join(root, rel))
	}
	return readCgroupV1(root, rel)
}

func readCgroupV2(dir string) (Cgroup, error) {
	var c Cgroup
	data, err := readFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return c, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	stat, err := ParseKeyed(data)
	if err != nil {
		return c, fmt.Errorf("cgroup %s: cpu.stat: %w", dir, err)
	}
	usec, ok := stat["usage_usec"]
	if !ok {
		return c, fmt.Errorf("cgroup %s: cpu.stat has no usage_usec", dir)
	}
	c.CPUSeconds = float64(usec) / 1e6
	if data, err := readFile(filepath.Join(dir, "cpu.max")); err == nil {
		if cpus, err := ParseCPUMax(data); err == nil {
			c.CPUs = cpus
		}
	}
	c.CPUs = capCPUs(c.CPUs)
	cur, err := readValue(filepath.Join(dir, "memory.current"))
	if err != nil {
		return c, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	c.MemoryBytes = cur
	if data, err := readFile(filepath.Join(dir, "memory.stat")); err == nil {
		if ms, err := ParseKeyed(data); err == nil {
			c.MemoryBytes = subClamp(cur, ms["inactive_file"])
			c.MemoryCacheBytes = clampInt(ms["file"])
		}
	}
	if data, err := readFile(filepath.Join(dir, "memory.max")); err == nil {
		if v, unlimited, err := ParseValue(data); err == nil && !unlimited && v > 0 {
			c.MemoryLimitBytes = v
		}
	}
	return c, nil
}

func readCgroupV1(root, rel string) (Cgroup, error) {
	var c Cgroup
	acct := v1Dir(root, rel, "cpuacct", "cpu,cpuacct", "cpuacct,cpu")
	if acct == "" {
		return c, fmt.Errorf("cgroup %s: no cpuacct hierarchy has it", rel)
	}
	ns, err := readValue(filepath.Join(acct, "cpuacct.usage"))
	if err != nil {
		return c, fmt.Errorf("cgroup %s: %w", rel, err)
	}
	c.CPUSeconds = float64(ns) / 1e9
	if cpu := v1Dir(root, rel, "cpu", "cpu,cpuacct", "cpuacct,cpu"); cpu != "" {
		quota, qerr := readValue(filepath.Join(cpu, "cpu.cfs_quota_us"))
		period, perr := readValue(filepath.Join(cpu, "cpu.cfs_period_us"))
		if qerr == nil && perr == nil && quota > 0 && period > 0 {
			c.CPUs = float64(quota) / float64(period)
		}
	}
	c.CPUs = capCPUs(c.CPUs)
	mem := v1Dir(root, rel, "memory")
	if mem == "" {
		return c, fmt.Errorf("cgroup %s: no memory hierarchy has it", rel)
	}
	usage, err := readValue(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return c, fmt.Errorf("cgroup %s: %w", rel, err)
	}
	c.MemoryBytes = usage
	if data, err := readFile(filepath.Join(mem, "memory.stat")); err == nil {
		if ms, err := ParseKeyed(data); err == nil {
			// The total_ figures include child cgroups, which a box
			// may make (runc mounts its cgroup read-only, but runsc
			// has its own view of it).
			inactive, cache := ms["total_inactive_file"], ms["total_cache"]
			if _, ok := ms["total_cache"]; !ok {
				inactive, cache = ms["inactive_file"], ms["cache"]
			}
			c.MemoryBytes = subClamp(usage, inactive)
			c.MemoryCacheBytes = clampInt(cache)
		}
	}
	if lim, err := readValue(filepath.Join(mem, "memory.limit_in_bytes")); err == nil && lim > 0 && lim < v1Unlimited {
		c.MemoryLimitBytes = lim
	}
	return c, nil
}

// v1Dir is the directory of rel in the first of the named v1
// hierarchies that has it, or "".
func v1Dir(root, rel string, hierarchies ...string) string {
	for _, h := range hierarchies {
		d := filepath.Join(root, h, rel)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return d
		}
	}
	return ""
}

// readValue reads a single-value file; "max" is an error here (the
// callers that accept it parse themselves).
func readValue(path string) (int64, error) {
	data, err := readFile(path)
	if err != nil {
		return 0, err
	}
	v, unlimited, err := ParseValue(data)
	if err == nil && unlimited {
		err = errors.New("unexpected \"max\"")
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return v, nil
}

// capCPUs bounds a quota by the host's CPUs: a box allowed four CPUs on
// a two-CPU host can use two. No quota (0) is the host's CPUs.
func capCPUs(cpus float64) float64 {
	host := float64(runtime.NumCPU())
	if cpus <= 0 || cpus > host {
		return host
	}
	return cpus
}

// subClamp is a - b, never below zero (the kernel's counters are read
// one after the other, not at one instant).
func subClamp(a int64, b uint64) int64 {
	if a <= 0 || b >= uint64(a) {
		return 0
	}
	return a - int64(b)
}

func clampInt(v uint64) int64 {
	if v > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(v)
}
