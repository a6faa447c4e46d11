package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// maxConsoleRead bounds what one catch-up reads of a console log. A box
// that printed more since the last read (every UsageInterval, and on
// each query) loses the older part, with a note in its log saying so:
// the ring would not keep more anyway.
const maxConsoleRead = consolelog.DefaultMaxBytes

// LogEntry is one line of a sandbox's log (GET /v1/sandboxes/{id}/logs).
type LogEntry struct {
	// Timestamp is when the line was printed: the time a structured line
	// gives (no later than its reading), else when cubicled read it (within
	// Config.UsageInterval of its printing). Times are unique and follow
	// the order of printing.
	Timestamp time.Time `json:"timestamp"`
	// Level is debug, info, warn or error (lines of programs are info).
	Level string `json:"level"`
	// Source is "agent" (the sandbox's agent: session programs starting
	// and exiting), "console" (what the programs and, in a VM, the
	// kernel print) or "cubicled" (the daemon's notes, such as skipped
	// output). "agent" and Level are read from the line itself, which
	// any program in the sandbox can print: they say how a line looks,
	// not that the agent wrote it (only "cubicled" is the daemon's own).
	Source  string            `json:"source"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
}

// consoleTail is what the manager has read of one sandbox's console: the
// ring of its entries and where reading stopped. It lives on the
// sandbox's entry, so it goes when the entry does (Config.Retention after
// the sandbox stopped).
type consoleTail struct {
	mu   sync.Mutex
	ring *consolelog.Ring
	// file is the console file read last and off how much of it; a box
	// resumed or started anew may have a new file, or the same one
	// begun again from empty.
	file os.FileInfo
	off  int64
	// done is set once the box's final lines were read at its stop.
	done bool
}

// tailOf returns e's console tail, made on first use.
func (m *Manager) tailOf(e *entry) *consoleTail {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.logs == nil {
		hide := []string{m.cfg.DataDir}
		if real, err := filepath.EvalSymlinks(m.cfg.DataDir); err == nil && real != m.cfg.DataDir {
			hide = append(hide, real)
		}
		e.logs = &consoleTail{ring: consolelog.NewRing(consolelog.Options{Hide: hide})}
	}
	return e.logs
}

// readConsole reads what e's box printed since the last read into its
// tail. With final, the box is about to go: an unfinished last line is
// taken as it is, and nothing is read after. A box without a console
// (a backend that keeps none) or one going away as it is read adds
// nothing.
func (m *Manager) readConsole(e *entry, final bool) {
	m.mu.Lock()
	box, created, id := e.box, e.rec.Sandbox.CreatedAt, e.rec.Sandbox.ID
	m.mu.Unlock()
	c, ok := box.(driver.Console)
	if !ok {
		return
	}
	t := m.tailOf(e)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	now := m.cfg.Clock.Now()
	if err := t.catchUp(c, now, created); err != nil {
		m.log.Debug("read console log", "sandbox", id, "err", err)
	}
	if final {
		t.ring.Flush(now, now)
		t.done = true
	}
}

// catchUp reads the console's new bytes into the ring. t.mu is held.
func (t *consoleTail) catchUp(c driver.Console, now, created time.Time) error {
	f, err := c.OpenConsole()
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat console log: %w", err)
	}
	// Lines of a backlog nobody read yet (a new sandbox, or one adopted
	// after a restart) carry no time of their own; they get their
	// sandbox's creation, raised to just after the structured line
	// before them. Lines read later are stamped with the read.
	rawAt := now
	switch {
	case t.file == nil:
		rawAt = created
	case !os.SameFile(t.file, fi) || fi.Size() < t.off:
		// A new file, or the same begun again: what was unfinished of
		// the old one ends there.
		t.ring.Flush(now, now)
		t.off = 0
	}
	t.file = fi
	n := fi.Size() - t.off
	if n <= 0 {
		return nil
	}
	if n > maxConsoleRead {
		t.ring.Skip(n-maxConsoleRead, now)
		t.off += n - maxConsoleRead
		n = maxConsoleRead
	}
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, t.off)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read console log: %w", err)
	}
	t.ring.Write(buf[:got], now, rawAt)
	t.off += int64(got)
	return nil
}

// readConsoles catches up with the console of every running sandbox,
// from the usage loop: lines are stamped at most one interval late
// even when nobody asks for them.
func (m *Manager) readConsoles() {
	m.mu.Lock()
	var running []*entry
	for _, e := range m.entries {
		if e.rec.Sandbox.State == StateRunning && e.box != nil {
			running = append(running, e)
		}
	}
	m.mu.Unlock()
	for _, e := range running {
		if m.ctx.Err() != nil {
			return
		}
		m.readConsole(e, false)
	}
}

// Logs returns the lines sandbox id printed that q selects: what its
// console log held, read up to now, of a live sandbox, and of a stopped
// one while its record is kept (Config.Retention). owner is the asker
// (KeyOwner of the API key; "" when the daemon has no keys): another
// owner's sandbox is not found, as an unknown one. Backends that keep no
// console log answer no lines.
func (m *Manager) Logs(ctx context.Context, id, owner string, q consolelog.Query) ([]LogEntry, error) {
	m.mu.Lock()
	e, ok := m.entries[id]
	found := ok && (owner == "" || e.rec.Request.Owner == owner)
	var st State
	if ok {
		st = e.rec.Sandbox.State
	}
	m.mu.Unlock()
	if !found {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	if st == StateRunning {
		m.readConsole(e, false)
	}
	t := m.tailOf(e)
	t.mu.Lock()
	got := t.ring.Select(q)
	t.mu.Unlock()
	out := make([]LogEntry, len(got))
	for i, g := range got {
		out[i] = LogEntry{Timestamp: g.Time, Level: g.Level.String(), Source: g.Source, Message: g.Message, Fields: g.Fields}
	}
	return out, nil
}
