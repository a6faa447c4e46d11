package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// A gVisor box reaches the host's agent socket through runsc's gofer
// (--host-uds): each connection the daemon opens is a unix stream socket
// the gofer accepts in its own network namespace and hands to the
// sandbox. runsc 20221219 cannot checkpoint a sandbox that still holds
// one ("encoding error at object transport.connectionedEndpoint"), and
// the failed checkpoint ends the sandbox. After the agent has let go of
// its channel, the sandbox lets go of those sockets on its own time
// (under load, more than the 100 ms the driver once waited: a soak lost
// a box that way), so the driver watches them go in the gofer's table.

// heldStreams counts the unix stream sockets in a /proc/PID/net/unix
// table other than listening ones: the connections to host sockets,
// accepted or still queued on the listener (a daemon request that dialled
// just before the pause). The listening socket (flag __SO_ACCEPTCON,
// 00010000) and the gofer's own channels to the sandbox (seqpacket, type
// 0005) do not count. A line it cannot read is an error: a misread table
// must not let a checkpoint that will fail go ahead.
func heldStreams(table string) (int, error) {
	n := 0
	for i, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || (i == 0 && f[0] == "Num") {
			continue
		}
		// Num RefCount Protocol Flags Type St Inode [Path]
		if len(f) < 7 || !strings.HasSuffix(f[0], ":") || len(f[4]) != 4 || len(f[5]) != 2 {
			return 0, fmt.Errorf("unix socket table line %d: %q", i+1, truncateLine(line))
		}
		if f[4] == "0001" && f[3] != "00010000" {
			n++
		}
	}
	return n, nil
}

func truncateLine(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// gofers returns the runsc gofer processes of the box whose bundle is
// bundle.
func gofers(bundle string) ([]procwatch.Process, error) {
	return procwatch.FindOwn(func(argv []string) bool {
		return slices.Contains(argv, "gofer") && slices.Contains(argv, bundle)
	})
}

// waitLetGo waits until the sandbox of b holds no connection to a host
// socket, for at most bound. It answers errNoGofer when it cannot tell
// (no gofer found, or its table unreadable).
func (b *box) waitLetGo(ctx context.Context, bound time.Duration) error {
	ps, err := gofers(filepath.Join(b.data.Dir, "bundle"))
	if err != nil || len(ps) != 1 {
		return fmt.Errorf("%w (%d found: %v)", errNoGofer, len(ps), err)
	}
	table := fmt.Sprintf("/proc/%d/net/unix", ps[0].Pid)
	deadline := time.Now().Add(bound)
	// None held three reads in a row, 20 ms apart: a connection the
	// gofer accepts is in flight to the sandbox for a moment.
	quiet := 0
	for {
		raw, err := os.ReadFile(table)
		if err != nil {
			return fmt.Errorf("%w: %v", errNoGofer, err)
		}
		n, err := heldStreams(string(raw))
		if err != nil {
			return fmt.Errorf("%w: %v", errNoGofer, err)
		}
		if quiet = quiet + 1; n > 0 {
			quiet = 0
		}
		if quiet == 3 {
			return nil
		}
		if n > 0 && time.Now().After(deadline) {
			return fmt.Errorf("the sandbox still holds %d connection(s) to the agent's host socket after %s", n, bound)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.dead:
			return errors.New("the box ended")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// errNoGofer says that waitLetGo could not watch the sandbox's
// connections.
var errNoGofer = errors.New("cannot read the gofer's unix socket table")
