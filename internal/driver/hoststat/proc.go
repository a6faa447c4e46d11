package hoststat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// userHZ is the unit of /proc's CPU times: USER_HZ, fixed at 100 in the
// kernel's ABI whatever CONFIG_HZ is.
const userHZ = 100

// ProcStat is the part of /proc/PID/stat read here.
type ProcStat struct {
	UTime, STime uint64 // CPU time in clock ticks (userHZ)
	StartTime    uint64 // start time in clock ticks after boot, against pid reuse
	RSSPages     int64  // resident set, in pages
}

// CPUSeconds is the process's user and system time in seconds.
func (p ProcStat) CPUSeconds() float64 { return float64(p.UTime+p.STime) / userHZ }

// ParseProcStat parses /proc/PID/stat. Its second field is the
// command's name in parentheses, which may hold spaces and parentheses
// itself (a process names itself), so the fields are counted from the
// last ')'.
func ParseProcStat(data []byte) (ProcStat, error) {
	var p ProcStat
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return p, errors.New("proc stat: no ')' after the command name")
	}
	// Fields from the third (state) on; field n of proc(5) is f[n-3].
	f := bytes.Fields(data[i+1:])
	if len(f) < 22 {
		return p, fmt.Errorf("proc stat: %d fields after the command name, want at least 22", len(f))
	}
	var err error
	num := func(n int) uint64 {
		v, perr := strconv.ParseUint(string(f[n-3]), 10, 64)
		if perr != nil && err == nil {
			err = fmt.Errorf("proc stat: field %d: %q is not a number", n, truncate(string(f[n-3]), 32))
		}
		return v
	}
	p.UTime, p.STime, p.StartTime = num(14), num(15), num(22)
	rss, perr := strconv.ParseInt(string(f[24-3]), 10, 64)
	if perr != nil && err == nil {
		err = fmt.Errorf("proc stat: field 24: %q is not a number", truncate(string(f[24-3]), 32))
	}
	p.RSSPages = max(rss, 0)
	return p, err
}

// Proc is what one process uses.
type Proc struct {
	CPUSeconds float64
	RSSBytes   int64
}

// ReadProc reads process pid's CPU time and resident memory. A
// startTime other than 0 must match the process's (/proc/PID/stat
// field 22), so that a pid reused by another process is not measured.
func ReadProc(pid int, startTime uint64) (Proc, error) {
	if pid <= 0 {
		return Proc{}, fmt.Errorf("no process (pid %d)", pid)
	}
	data, err := readFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Proc{}, fmt.Errorf("process %d: %w", pid, err)
	}
	st, err := ParseProcStat(data)
	if err != nil {
		return Proc{}, fmt.Errorf("process %d: %w", pid, err)
	}
	if startTime != 0 && st.StartTime != startTime {
		return Proc{}, fmt.Errorf("process %d: %w (the pid was reused)", pid, os.ErrNotExist)
	}
	return Proc{CPUSeconds: st.CPUSeconds(), RSSBytes: st.RSSPages * int64(os.Getpagesize())}, nil
}
