package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A gVisor box's agent listens on a host socket (--host-uds=create):
// each connection the daemon opens to it is a host unix stream socket
// that the sandbox (runsc's sentry process) holds. runsc cannot
// checkpoint a sandbox that still holds one ("encoding error at object
// transport.connectionedEndpoint" under Debian's runsc of 2022, whose
// failed checkpoint also ended the sandbox). After the agent has let go of its channel the sentry closes
// those sockets on its own time (under load, more than the 100 ms the
// driver once waited: a soak lost boxes so), so the driver watches them
// go. The server side of a unix connection lives in the network
// namespace of the client that connected (the daemon's own), named with
// the listener's address (the agent's socket path inside the sandbox).

// agentConns counts, in the unix socket table of the daemon's network
// namespace (/proc/self/net/unix), the stream sockets of the agent's
// address that are not listening and whose inode is in held (the
// sentry's sockets). A line it cannot read is an error: a misread table
// must not let a checkpoint that will fail go ahead.
func agentConns(table string, held map[uint64]bool) (int, error) {
	want := filepath.Join(RunDir, "agent.sock")
	n := 0
	for i, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || (i == 0 && f[0] == "Num") {
			continue
		}
		// Num RefCount Protocol Flags Type St Inode [Path]
		if len(f) < 7 || !strings.HasSuffix(f[0], ":") || len(f[3]) != 8 || len(f[4]) != 4 || len(f[5]) != 2 {
			return 0, fmt.Errorf("unix socket table line %d: %q", i+1, truncateLine(line))
		}
		ino, err := strconv.ParseUint(f[6], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unix socket table line %d: inode %q", i+1, f[6])
		}
		if f[4] == "0001" && f[3] != "00010000" && len(f) > 7 && f[7] == want && held[ino] {
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

// socketInodes returns the inodes of the sockets process pid holds.
func socketInodes(pid int) (map[uint64]bool, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[uint64]bool{}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if s, ok := strings.CutPrefix(link, "socket:["); ok {
			if ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil {
				out[ino] = true
			}
		}
	}
	return out, nil
}

// waitLetGo waits until the sandbox of b holds no connection to its
// agent's host socket, for at most bound. It answers errCannotWatch when
// it cannot tell.
func (b *box) waitLetGo(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	// None held three reads in a row, 20 ms apart: a connection being
	// accepted is in flight to the sandbox for a moment.
	quiet := 0
	for {
		held, err := socketInodes(b.data.Pid)
		if err != nil {
			return fmt.Errorf("%w: %v", errCannotWatch, err)
		}
		raw, err := os.ReadFile("/proc/self/net/unix")
		if err != nil {
			return fmt.Errorf("%w: %v", errCannotWatch, err)
		}
		n, err := agentConns(string(raw), held)
		if err != nil {
			return fmt.Errorf("%w: %v", errCannotWatch, err)
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

// errCannotWatch says that waitLetGo could not watch the sandbox's
// connections.
var errCannotWatch = errors.New("cannot read the sandbox's sockets")
