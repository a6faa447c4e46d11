package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// idleStep is the machine with n idle desktops: what their cgroups used
// over the window, and the host as a whole.
type idleStep struct {
	n            int
	cpuPct       float64 // the sandboxes' cgroups together, % of one core
	hostBusyPct  float64 // the whole host (/proc/stat), % of one core
	perCPU       []float64
	memPer       []int64 // each sandbox's anonymous + shared memory (bytes)
	hostUsedGrow int64   // MemTotal-MemAvailable now, less before the first create
	note         string
}

// idleRun is one daemon's series of steps.
type idleRun struct {
	label string
	steps []idleStep
	err   error
}

// cgroupFiles finds the cgroup of sandbox id through one of its host
// processes and returns how to read its CPU time and memory.
func cgroupFiles(id string) (cpu func() (time.Duration, error), mem func() (int64, error), err error) {
	for _, pid := range harness.HostProcesses(id) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			continue
		}
		var v1cpu, v1mem, v2 string
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 || !strings.Contains(parts[2], id) {
				continue
			}
			for _, c := range strings.Split(parts[1], ",") {
				switch c {
				case "cpuacct":
					v1cpu = filepath.Join("/sys/fs/cgroup", parts[1], parts[2])
				case "memory":
					v1mem = filepath.Join("/sys/fs/cgroup/memory", parts[2])
				}
			}
			if parts[0] == "0" && parts[1] == "" {
				v2 = filepath.Join("/sys/fs/cgroup", parts[2])
			}
		}
		switch {
		case v1cpu != "" && v1mem != "":
			return func() (time.Duration, error) {
					s, err := readInt(filepath.Join(v1cpu, "cpuacct.usage"))
					return time.Duration(s), err
				}, func() (int64, error) {
					st, err := statFile(filepath.Join(v1mem, "memory.stat"))
					return st["total_rss"] + st["total_shmem"], err
				}, nil
		case v2 != "":
			return func() (time.Duration, error) {
					st, err := statFile(filepath.Join(v2, "cpu.stat"))
					return time.Duration(st["usage_usec"]) * time.Microsecond, err
				}, func() (int64, error) {
					st, err := statFile(filepath.Join(v2, "memory.stat"))
					return st["anon"] + st["shmem"], err
				}, nil
		}
	}
	return nil, nil, fmt.Errorf("sandbox %s: no host process in a cgroup of its own", id)
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// statFile reads a cgroup "key value" file.
func statFile(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if n, err := strconv.ParseInt(v, 10, 64); ok && err == nil {
			out[k] = n
		}
	}
	return out, sc.Err()
}

// hostCPU is the host's busy and total jiffies (/proc/stat's first line).
func hostCPU() (busy, total int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, errors.New("/proc/stat: no cpu line")
	}
	for i, s := range f[1:] {
		n, _ := strconv.ParseInt(s, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}

// meminfo returns a /proc/meminfo field in bytes.
func meminfo(field string) int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n << 10
		}
	}
	return 0
}

// idleReserve is the host memory a step leaves free: a create that would
// go below it is not made (the machine must stay usable).
const idleReserve = 2 << 30

// measureIdle creates desktops up to each count in counts on one daemon,
// lets them settle, and measures them idle over window.
func measureIdle(ctx context.Context, imageDir, label string, args []string, counts []int, settle, window time.Duration) idleRun {
	run := idleRun{label: label}
	max := counts[len(counts)-1]
	args = append([]string{"--max-sandboxes", strconv.Itoa(max + 1), "--max-lifetime", "0"}, args...)
	run.err = withDaemon(ctx, imageDir, "gvisor", args, func(_ *harness.Daemon, c *client.Client) error {
		used0 := meminfo("MemTotal") - meminfo("MemAvailable")
		res := client.Resolution{Width: 1024, Height: 768}
		var ids []string
		defer func() {
			for _, id := range ids {
				_ = c.Destroy(context.Background(), id)
			}
		}()
		for _, n := range counts {
			note := ""
			for len(ids) < n {
				if avail := meminfo("MemAvailable"); avail < idleReserve {
					note = fmt.Sprintf("stopped at %d desktops: %d MiB of memory left", len(ids), avail>>20)
					break
				}
				sb, err := c.Create(ctx, client.CreateRequest{Template: "desktop", Resolution: &res})
				if err != nil {
					return fmt.Errorf("create %d: %w", len(ids)+1, err)
				}
				ids = append(ids, sb.ID)
			}
			log.Printf("idle %s: %d desktops; settling %v", label, len(ids), settle)
			time.Sleep(settle)
			st, err := sampleIdle(ids, window)
			if err != nil {
				return err
			}
			st.hostUsedGrow = meminfo("MemTotal") - meminfo("MemAvailable") - used0
			st.note = note
			log.Printf("idle %s: %d desktops: %.1f%% of a core together (host %.1f%%), %d MiB each (median)", label, st.n, st.cpuPct, st.hostBusyPct, median64(st.memPer)>>20)
			run.steps = append(run.steps, st)
			if note != "" {
				break
			}
		}
		return nil
	})
	return run
}

// sampleIdle measures ids' cgroups and the host over window.
func sampleIdle(ids []string, window time.Duration) (idleStep, error) {
	st := idleStep{n: len(ids)}
	type probe struct {
		cpu func() (time.Duration, error)
		mem func() (int64, error)
		t0  time.Duration
	}
	ps := make([]probe, len(ids))
	for i, id := range ids {
		cpu, mem, err := cgroupFiles(id)
		if err != nil {
			return st, err
		}
		t0, err := cpu()
		if err != nil {
			return st, err
		}
		ps[i] = probe{cpu: cpu, mem: mem, t0: t0}
	}
	b0, t0, err := hostCPU()
	if err != nil {
		return st, err
	}
	began := time.Now()
	time.Sleep(window)
	el := time.Since(began)
	b1, t1, err := hostCPU()
	if err != nil {
		return st, err
	}
	cores := float64(len(cpuList()))
	st.hostBusyPct = 100 * cores * float64(b1-b0) / float64(t1-t0)
	for _, p := range ps {
		t1, err := p.cpu()
		if err != nil {
			return st, err
		}
		pct := 100 * float64(t1-p.t0) / float64(el)
		st.perCPU = append(st.perCPU, pct)
		st.cpuPct += pct
		m, err := p.mem()
		if err != nil {
			return st, err
		}
		st.memPer = append(st.memPer, m)
	}
	return st, nil
}

// cpuList is the host's CPUs (one "cpuN" line each in /proc/stat).
func cpuList() []string {
	b, _ := os.ReadFile("/proc/stat")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "cpu") && f[0] != "cpu" {
			out = append(out, f[0])
		}
	}
	return out
}

func median64(v []int64) int64 { return medianOf(v) }

func medianF(v []float64) float64 { return medianOf(v) }

func medianOf[T int64 | float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// runIdle is `bench -only-idle`: idle XFCE desktops on gvisor at each of
// counts, as the daemon starts them by default (restored from a boot
// template); then, when compare > 0, that many booted cold on a daemon of
// their own, for what a template saves.
func runIdle(imageDir, out string, counts []int, compare int, settle, window time.Duration) error {
	defer harness.RemoveBuild()
	ctx := context.Background()
	runs := []idleRun{measureIdle(ctx, imageDir, "restored from a boot template (the default)", []string{"--boot-templates=true"}, counts, settle, window)}
	if compare > 0 {
		runs = append(runs, measureIdle(ctx, imageDir, "booted (--boot-templates=false)", []string{"--boot-templates=false"}, []int{compare}, settle, window))
	}
	return harness.ReplaceSection(out, "idle", idleReport(runs, settle, window))
}

// idleReport is the idle-desktops section of BENCHMARKS.md.
func idleReport(runs []idleRun, settle, window time.Duration) string {
	var b strings.Builder
	b.WriteString("## Idle desktops (`go run ./test/bench -only-idle`, " + time.Now().UTC().Format("2006-01-02") + ")\n\n")
	fmt.Fprintf(&b, "XFCE desktops (`desktop`, 1024×768, Chromium on its start page) on gvisor, created one after another on one daemon and left alone; %v after the last create, each sandbox's host cgroup is read over %v: its CPU time, and its memory (anonymous plus shared: the Sentry's memory file, which holds what the box's processes allocated; file pages of the image are the host's page cache, shared by all). Host: the machine's busy time over the same window (/proc/stat), and MemTotal − MemAvailable against before the first create. Host busy includes what else runs on the machine (the kernel's kdamond, the machine's own agents) and cubicled. Target (issue 26): 80 idle desktops in 24 GiB, together under half of 2 cores (100 %% of one core).\n\n", settle, window)
	b.WriteString("| desktops | how started | CPU, all sandboxes (% of one core) | per desktop p50 | max | memory per desktop p50 | max | host busy (% of one core) | host memory used, growth | per desktop |\n|---|---|---|---|---|---|---|---|---|---|\n")
	var notes []string
	for _, r := range runs {
		if r.err != nil {
			fmt.Fprintf(&b, "| — | %s | failed: %v ||||||||\n", r.label, r.err)
		}
		for _, s := range r.steps {
			maxC, maxM := 0.0, int64(0)
			for _, c := range s.perCPU {
				maxC = max(maxC, c)
			}
			for _, m := range s.memPer {
				maxM = max(maxM, m)
			}
			per := int64(0)
			if s.n > 0 {
				per = s.hostUsedGrow / int64(s.n)
			}
			fmt.Fprintf(&b, "| %d | %s | %.1f %% | %.2f %% | %.2f %% | %d MiB | %d MiB | %.1f %% | %.1f GiB | %d MiB |\n", s.n, r.label,
				s.cpuPct, medianF(s.perCPU), maxC, median64(s.memPer)>>20, maxM>>20, s.hostBusyPct, float64(s.hostUsedGrow)/(1<<30), per>>20)
			if s.note != "" {
				notes = append(notes, r.label+": "+s.note+".")
			}
		}
	}
	for _, n := range notes {
		b.WriteString("\n" + n + "\n")
	}
	b.WriteString("\nWhat an idle desktop no longer runs: x11vnc starts when a live view (or a recording) connects and stops 30 s after the last one leaves (`on_demand` in the image's session.json); with no viewer it polled the screen, the largest share of an idle desktop's CPU. Chromium runs as 4 processes instead of 9 (GPU and network services in the browser process, no zygotes, no spare renderer). Before (issue 26's own measure, on Debian's runsc of 2022 with x11vnc always on): 20 idle desktops held 99 % of the 2 cores, each Sentry 10–19 % of a core; on the pinned runsc with x11vnc running, 5 desktops measured here 1.3 % of a core each, of which x11vnc was about a third (its own CPU time in the box).\n")
	return b.String()
}
