package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// runc boxes would pause with `runc checkpoint`, which is CRIU. Whether
// CRIU can run at all on a host is what `criu check` answers; on this
// project's machines it cannot: Debian 12's CRIU 3.17.1 does not know the
// vDSO layout of their 6.x kernels and stops before it looks at anything
// else ("vdso: Unexpected rt vDSO area bounds ... Could not initialize
// kernel features detection"), and `runc checkpoint` of a box fails the
// same way (TestRuncCheckpointHere shows both). So runc pause is not
// driven; CanPause gives CRIU's own words, and says so too where CRIU
// does run, since nothing here could test a runc pause.

// criuCheck is the once-asked answer of `criu check`.
type criuCheck struct {
	mu   sync.Mutex
	done bool
	err  error
}

// check returns why runc boxes cannot pause on this host.
func (c *criuCheck) check(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return c.err
	}
	err := runCRIUCheck(ctx)
	if ctx.Err() != nil {
		return err // not an answer: ask again next time
	}
	c.done, c.err = true, err
	return err
}

// runCRIUCheck runs `criu check` and returns what it means for runc
// pause.
func runCRIUCheck(ctx context.Context) error {
	bin, err := exec.LookPath("criu")
	if err != nil {
		return errors.New("runc boxes pause with CRIU (runc checkpoint), and criu is not installed")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ver, _ := exec.CommandContext(ctx, bin, "--version").Output() //depcheck:runs criu
	version := strings.TrimSpace(strings.TrimPrefix(firstLine(ver), "Version:"))
	out, err := exec.CommandContext(ctx, bin, "check").CombinedOutput() //depcheck:runs criu
	if err != nil {
		return fmt.Errorf("runc boxes pause with CRIU (runc checkpoint), and CRIU %s cannot run on this kernel (%s): `criu check`: %s", version, kernelRelease(), criuErrors(out, err))
	}
	return fmt.Errorf("runc boxes would pause with CRIU (runc checkpoint), which cubicle does not drive yet (CRIU %s passes `criu check` here); gvisor and qemu pause", version)
}

// criuErrors is the gist of CRIU's output: its error lines without the
// source locations, or the exit status.
func criuErrors(out []byte, err error) string {
	var msgs []string
	for _, l := range strings.Split(string(out), "\n") {
		// "Error (file.c:N): msg", in a log after a "(00.021860) " time.
		i := strings.Index(l, "Error (")
		if i < 0 {
			continue
		}
		l = strings.TrimSpace(l[i:])
		if _, msg, ok := strings.Cut(l, "): "); ok {
			l = msg
		}
		if l != "exited, status=1" {
			msgs = append(msgs, l)
		}
	}
	if len(msgs) == 0 {
		return err.Error()
	}
	return strings.Join(msgs, "; ")
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return string(line)
}

// kernelRelease is uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}
