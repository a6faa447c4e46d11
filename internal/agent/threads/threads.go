// Package threads keeps OS threads in reserve for the agent, so that a
// sandbox whose pids limit is full (a fork bomb) cannot kill it.
//
// In a runc sandbox the agent is PID 1 and shares the sandbox's pids
// cgroup with everything the user runs. The Go runtime starts a new OS
// thread whenever every thread it has is blocked in a system call (a wait
// for a command, a file read) and a goroutine is ready to run; if the
// clone fails, the runtime does not wait or retry, it ends the process
// ("failed to create new OS thread"). A fork bomb fills the cgroup in a
// fraction of a second, so the agent, and with it the sandbox, died at
// the first moment it needed one more thread (a CI run lost a runc
// sandbox so).
//
// The runtime never ends an idle thread: it parks it and reuses it. So
// starting threads once, at start-up, while the cgroup has room, gives the
// agent a reserve that later needs draw on without a clone. A reserve does
// not make the agent unkillable; it makes the pids limit the user's
// problem, as the limit means it to be.
package threads

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Reserve starts about n more OS threads than the process has and leaves
// them idle for the runtime to reuse. Each blocks in a read of a pipe (a
// system call the runtime cannot hand to its poller, so it starts another
// thread for the next goroutine) until the process has n more threads or
// ctx ends; then the pipe closes and every reader returns. It answers the
// process's thread count afterwards.
func Reserve(ctx context.Context, n int) (int, error) {
	before, err := Count()
	if err != nil {
		return 0, err
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil { // blocking: no O_NONBLOCK
		return before, fmt.Errorf("reserve threads: pipe: %w", err)
	}
	r, w := p[0], p[1]
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			for {
				if _, err := unix.Read(r, b[:]); err != unix.EINTR {
					return
				}
			}
		}()
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		if now, err := Count(); err != nil || now >= before+n {
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	// EOF for every reader, then the pipe's read end goes once none can
	// be in a read of it (a closed descriptor number may be reused).
	unix.Close(w)
	wg.Wait()
	unix.Close(r)
	return Count()
}

// Count is the number of OS threads of this process.
func Count() (int, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("count threads: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, fmt.Errorf("count threads: %q: %w", line, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("count threads: no Threads line in /proc/self/status")
}
