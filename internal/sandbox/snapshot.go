package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Snapshot is the API view of a stored snapshot (API.md "Snapshots"): a
// running sandbox saved as it was — memory, programs, page, disk — that
// any number of new sandboxes start from (CreateRequest.FromSnapshot),
// long after the sandbox itself is gone. It belongs to the API key that
// took it.
type Snapshot struct {
	ID string `json:"id"`
	// Name is the optional name it was given, unique among its key's
	// snapshots; creates may name it instead of the ID.
	Name       string            `json:"name,omitempty"`
	SandboxID  string            `json:"sandbox_id"` // the sandbox it was taken of
	Template   string            `json:"template"`
	Backend    string            `json:"backend"`
	Resolution Resolution        `json:"resolution"`
	VCPUs      int               `json:"vcpus,omitempty"`
	MemoryMB   int               `json:"memory_mb,omitempty"`
	SizeBytes  int64             `json:"size_bytes"` // host disk it takes
	CreatedAt  time.Time         `json:"created_at"`
	Metadata   map[string]string `json:"metadata"`
}

// DefaultMaxSnapshotsPerOwner is Config.MaxSnapshotsPerOwner's default.
const DefaultMaxSnapshotsPerOwner = 16

// MaxSnapshotName bounds a snapshot's name.
const MaxSnapshotName = 63

var (
	snapshotName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	// snapshotIDForm is the form of the IDs the daemon gives (newID):
	// a name of that form could stand for another snapshot's ID.
	snapshotIDForm = regexp.MustCompile(`^[a-z2-7]{26}$`)
)

// CheckSnapshotRef checks what names a snapshot in a request: its ID or
// its name (field names it in the error).
func CheckSnapshotRef(field, ref string) error {
	if ref == "" || len(ref) > MaxSnapshotName || !snapshotName.MatchString(ref) || strings.Contains(ref, "..") {
		return fieldErr(field, " %q is not a snapshot ID or name", truncate(ref, MaxSnapshotName))
	}
	return nil
}

// CheckSnapshotName checks a new snapshot's name: the rules of volume
// names, and not of the form of an ID.
func CheckSnapshotName(field, name string) error {
	if CheckSnapshotRef(field, name) != nil {
		return fieldErr(field, " %q is not a valid snapshot name: 1 to %d of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", truncate(name, MaxSnapshotName), MaxSnapshotName)
	}
	if snapshotIDForm.MatchString(name) {
		return fieldErr(field, " %q has the form of a snapshot ID, which a name may not", name)
	}
	return nil
}

// snapshotBound bounds taking a snapshot in the driver: a VM's memory is
// written at disk speed and synced.
const snapshotBound = 5 * time.Minute

// snap is the manager's record of one snapshot.
type snap struct {
	Snapshot
	Owner string
	// Token is the agent token of the sandbox it was taken of: the
	// agent of a box started from it has that token until re-keyed.
	Token string
	// IP is that sandbox's address, which the copy's guest holds until
	// re-keyed.
	IP      string
	Desktop *bool
	// Isolation and Request are the saved sandbox's: the shape a box
	// from the snapshot has.
	Isolation string
	Request   CreateRequest
	Driver    driver.State

	creating  bool // its files are being written: not listed, not stored
	deleting  bool // going: not listed, not usable
	restoring int  // creates from it in progress: it cannot be deleted
}

// snapshotDir is where snapshot id's files live: DATADIR/snapshots/ID.
func (m *Manager) snapshotDir(id string) string {
	return filepath.Join(m.cfg.DataDir, "snapshots", id)
}

// snapshotter returns backend's Snapshotter, or why it has none here.
func (m *Manager) snapshotter(ctx context.Context, backend string) (driver.Snapshotter, error) {
	s, ok := m.cfg.Drivers[backend].(driver.Snapshotter)
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotSupported, "the %s backend cannot snapshot sandboxes; qemu and gvisor can", backend)
	}
	if err := s.CanSnapshot(ctx); err != nil {
		return nil, errdefs.New(errdefs.ErrNotSupported, "the %s backend cannot snapshot sandboxes on this host: %v", backend, err)
	}
	return s, nil
}

// SnapshotInfo reports whether sandboxes of backend can be snapshotted
// (and forked) here, and why not; GET /v1/info shows it.
func (m *Manager) SnapshotInfo(ctx context.Context, backend string) (bool, string) {
	if _, err := m.snapshotter(ctx, backend); err != nil {
		return false, errdefs.UserMessage(err)
	}
	return true, ""
}

// CreateSnapshot saves the running sandbox id as a snapshot of owner. The
// sandbox runs on, stopped for the time the copy takes. name is optional
// ("" for none). A sandbox holding volumes is refused: what a box from
// the snapshot would see of them is another sandbox's by then.
func (m *Manager) CreateSnapshot(ctx context.Context, id, owner, name string, metadata map[string]string) (Snapshot, error) {
	if name != "" {
		if err := CheckSnapshotName("name", name); err != nil {
			return Snapshot{}, err
		}
	}
	if err := checkMetadata(metadata); err != nil {
		return Snapshot{}, err
	}
	e, err := m.entry(id)
	if err != nil {
		return Snapshot{}, err
	}
	sn, err := m.snapshotter(ctx, e.rec.Sandbox.Backend)
	if err != nil {
		return Snapshot{}, err
	}
	e.op.Lock() // no pause, resume or stop of the sandbox meanwhile
	defer e.op.Unlock()

	now := m.cfg.Clock.Now().UTC()
	m.mu.Lock()
	src := *e.rec
	switch {
	case src.Sandbox.State != StateRunning:
		m.mu.Unlock()
		return Snapshot{}, errdefs.Conflict("sandbox %s is %s; only a running sandbox can be snapshotted", id, src.Sandbox.State)
	case len(src.Request.Volumes) > 0:
		m.mu.Unlock()
		return Snapshot{}, errdefs.Conflict("sandbox %s holds volumes, which a snapshot cannot take along; snapshot a sandbox without volumes", id)
	case name != "" && m.snapByNameLocked(owner, name) != nil:
		m.mu.Unlock()
		return Snapshot{}, errdefs.Conflict("this API key already has a snapshot named %s", name)
	}
	if n := m.snapshotsOfLocked(owner); n >= m.cfg.MaxSnapshotsPerOwner {
		m.mu.Unlock()
		return Snapshot{}, errdefs.New(errdefs.ErrQuota, "this API key already has %d snapshots, its limit; delete one first", n)
	}
	if err := m.roomToSave(&src, "snapshotting"); err != nil {
		m.mu.Unlock()
		return Snapshot{}, err
	}
	if metadata == nil {
		metadata = map[string]string{}
	}
	s := &snap{
		Snapshot: Snapshot{
			ID: newID(), Name: name, SandboxID: id, Template: src.Sandbox.Template, Backend: src.Sandbox.Backend,
			Resolution: src.Sandbox.Resolution, VCPUs: src.Request.VCPUs, MemoryMB: src.Request.MemoryMB,
			CreatedAt: now, Metadata: maps.Clone(metadata),
		},
		Owner: owner, Token: src.Token, IP: src.Sandbox.IP, Desktop: src.Sandbox.Desktop,
		Isolation: src.Sandbox.Isolation, Request: src.Request,
		creating: true,
	}
	s.Request.Owner, s.Request.Metadata = "", nil
	m.snaps[s.ID] = s
	box := e.box
	m.mu.Unlock()

	log := m.log.With("sandbox", id, "snapshot", s.ID)
	dir := m.snapshotDir(s.ID)
	t0 := time.Now()
	fail := func(err error) (Snapshot, error) {
		os.RemoveAll(dir)
		m.mu.Lock()
		delete(m.snaps, s.ID)
		m.mu.Unlock()
		log.Error("snapshot failed", "err", err)
		switch {
		case errors.Is(err, syscall.ENOSPC) || diskFull(m.cfg.DataDir):
			return Snapshot{}, errFull
		case errors.Is(err, driver.ErrCannotCopy):
			return Snapshot{}, errdefs.Conflict("sandbox %s cannot be snapshotted: %v", id, err)
		case isClosed(box.Wait()):
			return Snapshot{}, errdefs.New(errdefs.ErrUnavailable, "snapshot sandbox %s: %v; nothing was kept, and the sandbox could not run on: it is gone", id, err)
		}
		return Snapshot{}, errdefs.New(errdefs.ErrUnavailable, "snapshot sandbox %s: %v; nothing was kept, and the sandbox runs on", id, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotBound)
	saved, err := sn.Snapshot(sctx, box, dir)
	cancel()
	if err != nil {
		return fail(err)
	}
	m.mu.Lock()
	s.Driver, s.SizeBytes = saved.State, saved.Bytes
	if saved.VCPUs > 0 && saved.MemoryMB > 0 {
		// What the box had, defaults filled in: what a create from the
		// snapshot may name.
		s.VCPUs, s.MemoryMB = saved.VCPUs, saved.MemoryMB
		s.Request.VCPUs, s.Request.MemoryMB = saved.VCPUs, saved.MemoryMB
	}
	c := *s
	m.mu.Unlock()
	// The record is the commit: a daemon killed before it leaves a
	// directory that the next start sweeps away.
	if err := m.store.putSnapshot(&c); err != nil {
		return fail(fmt.Errorf("persist: %w", err))
	}
	m.mu.Lock()
	s.creating = false
	out := s.view()
	m.mu.Unlock()
	log.Info("snapshot taken", "ms", time.Since(t0).Milliseconds(), "bytes", saved.Bytes)
	return out, nil
}

// view is the API view of s; the caller holds m.mu.
func (s *snap) view() Snapshot {
	v := s.Snapshot
	v.Metadata = maps.Clone(s.Metadata)
	if v.Metadata == nil {
		v.Metadata = map[string]string{}
	}
	return v
}

// snapshotsOfLocked counts owner's snapshots, those being taken too.
func (m *Manager) snapshotsOfLocked(owner string) int {
	n := 0
	for _, s := range m.snaps {
		if s.Owner == owner {
			n++
		}
	}
	return n
}

func (m *Manager) snapByNameLocked(owner, name string) *snap {
	for _, s := range m.snaps {
		if s.Owner == owner && s.Name == name {
			return s
		}
	}
	return nil
}

// snapLocked finds owner's usable snapshot by its ID or its name; another
// key's is not found.
func (m *Manager) snapLocked(owner, ref string) (*snap, error) {
	s, ok := m.snaps[ref]
	if !ok || s.Owner != owner {
		s = m.snapByNameLocked(owner, ref)
	}
	if s == nil || s.creating || s.deleting {
		return nil, errdefs.NotFound("snapshot %s not found", truncate(ref, 64))
	}
	return s, nil
}

// ListSnapshots returns owner's snapshots, oldest first; with sandboxID,
// only those taken of that sandbox.
func (m *Manager) ListSnapshots(ctx context.Context, owner, sandboxID string) []Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Snapshot
	for _, s := range m.snaps {
		if s.Owner == owner && !s.creating && !s.deleting && (sandboxID == "" || s.SandboxID == sandboxID) {
			out = append(out, s.view())
		}
	}
	slices.SortFunc(out, func(a, b Snapshot) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// GetSnapshot returns one of owner's snapshots, by ID or name.
func (m *Manager) GetSnapshot(ctx context.Context, owner, ref string) (Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.snapLocked(owner, ref)
	if err != nil {
		return Snapshot{}, err
	}
	return s.view(), nil
}

// DeleteSnapshot removes one of owner's snapshots and its files. One that
// a create is starting a sandbox from is refused; the sandboxes started
// from it before do not need it.
func (m *Manager) DeleteSnapshot(ctx context.Context, owner, ref string) error {
	m.mu.Lock()
	s, err := m.snapLocked(owner, ref)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	if s.restoring > 0 {
		m.mu.Unlock()
		return errdefs.Conflict("snapshot %s is in use: %d sandboxes are starting from it", s.ID, s.restoring)
	}
	s.deleting = true
	m.mu.Unlock()
	if err := m.store.deleteSnapshot(s.ID); err != nil {
		m.mu.Lock()
		s.deleting = false
		m.mu.Unlock()
		return fmt.Errorf("delete snapshot %s: %w", s.ID, err)
	}
	// Gone from the store, the snapshot is gone: files that cannot be
	// removed now are swept at the next start (loadSnapshots).
	if err := os.RemoveAll(m.snapshotDir(s.ID)); err != nil {
		m.log.Warn("remove a deleted snapshot's files", "snapshot", s.ID, "err", err)
	}
	m.mu.Lock()
	delete(m.snaps, s.ID)
	m.mu.Unlock()
	m.log.Info("snapshot deleted", "snapshot", s.ID)
	return nil
}

// fromSnapshot fills a create from a snapshot with the snapshot's shape
// and takes the snapshot for it (release gives it back). What the
// request says of the shape must be what the snapshot has: a memory image
// fits only the box it was taken of. The session's start URL and
// environment are the snapshot's too (its programs run already), so a
// request that sets them is refused rather than ignored. A request that
// says nothing of egress gets the snapshot's policy, as a fork gets its
// parent's: the page in the snapshot was loaded under it.
func (m *Manager) fromSnapshot(ctx context.Context, req CreateRequest) (CreateRequest, *snap, func(), error) {
	m.mu.Lock()
	s, err := m.snapLocked(req.Owner, req.FromSnapshot)
	if err != nil {
		m.mu.Unlock()
		return req, nil, nil, err
	}
	c := *s
	m.mu.Unlock()
	q := c.Request
	for _, f := range []struct {
		name string
		bad  bool
	}{
		{"template", req.Template != "" && req.Template != c.Template},
		{"backend", req.Backend != "" && req.Backend != c.Backend},
		{"resolution", req.Resolution != (Resolution{}) && req.Resolution != c.Resolution},
		{"dpi", req.DPI != 0 && req.DPI != q.DPI},
		{"vcpus", req.VCPUs != 0 && req.VCPUs != q.VCPUs},
		{"memory_mb", req.MemoryMB != 0 && req.MemoryMB != q.MemoryMB},
	} {
		if f.bad {
			return req, nil, nil, fieldErr(f.name, " differs from the snapshot's; a sandbox from a snapshot has the shape of the sandbox it was taken of (leave %s out)", f.name)
		}
	}
	switch {
	case req.StartURL != "":
		return req, nil, nil, fieldErr("start_url", " cannot be set for a sandbox from a snapshot: its browser runs already, on the snapshot's page")
	case len(req.Env) > 0:
		return req, nil, nil, fieldErr("env", " cannot be set for a sandbox from a snapshot: its programs run already with the snapshot's environment (give a command its env in exec)")
	case len(req.Volumes) > 0:
		return req, nil, nil, fieldErr("volumes", " cannot be attached to a sandbox from a snapshot")
	}
	if m.cfg.Network != nil && c.IP == "" {
		return req, nil, nil, errdefs.Conflict("snapshot %s was taken of a sandbox without a network, and this daemon gives every sandbox one; it cannot be restored here", c.ID)
	}
	if m.cfg.Network == nil && c.IP != "" {
		return req, nil, nil, errdefs.Conflict("snapshot %s was taken of a sandbox with a network, and this daemon runs sandboxes without one (start cubicled with --net); it cannot be restored here", c.ID)
	}
	if _, err := m.snapshotter(ctx, c.Backend); err != nil {
		return req, nil, nil, err
	}
	req.Template, req.Backend, req.Resolution = c.Template, c.Backend, c.Resolution
	req.DPI, req.VCPUs, req.MemoryMB = q.DPI, q.VCPUs, q.MemoryMB
	req.StartURL, req.Env = q.StartURL, maps.Clone(q.Env)
	if req.Network.Egress == "" && req.Network.Allow == nil {
		req.Network = q.Network
	}
	req.FromSnapshot = c.ID
	m.mu.Lock()
	if s.deleting { // deleted since
		m.mu.Unlock()
		return req, nil, nil, errdefs.NotFound("snapshot %s not found", c.ID)
	}
	s.restoring++
	m.mu.Unlock()
	release := func() {
		m.mu.Lock()
		s.restoring--
		m.mu.Unlock()
	}
	return req, &c, release, nil
}

// restoreBoot is the boot of a sandbox of rec from snapshot s: the
// driver's restore, then the re-key that gives the copy its own identity
// before anyone can reach it.
func (m *Manager) restoreBoot(sn driver.Snapshotter, s *snap, e *entry) bootFunc {
	return func(ctx context.Context, spec driver.Spec) (driver.Box, *agentclient.Client, bool, error) {
		box, c, err := m.restoreRekeyed(ctx, sn, s.Driver, m.snapshotDir(s.ID), spec, record{Token: s.Token, Sandbox: Sandbox{IP: s.IP}}, e)
		if err != nil {
			return nil, nil, false, fmt.Errorf("snapshot %s: %w", s.ID, err)
		}
		return box, c, s.Desktop == nil || *s.Desktop, nil
	}
}

// restoreRekeyed restores the box saved in dir (state is the driver's
// own, from the save) for e and re-keys it as a fork is: the copy
// answers to src's token until then. A box that cannot be re-keyed is
// stopped: what is restored from a snapshot or a boot template is never
// left with another sandbox's identity.
func (m *Manager) restoreRekeyed(ctx context.Context, sn driver.Snapshotter, state driver.State, dir string, spec driver.Spec, src record, e *entry) (driver.Box, *agentclient.Client, error) {
	box, err := sn.Restore(ctx, state, dir, spec) // its errors say "restore: …"
	if err != nil {
		return nil, nil, err
	}
	c, err := m.rekey(ctx, box, src, e, spec.Net)
	if err != nil {
		return nil, nil, stopAfter(ctx, box, err)
	}
	return box, c, nil
}

// stopAfter stops box after err, which it returns with the stop's own
// failure joined.
func stopAfter(ctx context.Context, box driver.Box, err error) error {
	if serr := box.Stop(context.WithoutCancel(ctx)); serr != nil {
		err = errors.Join(err, fmt.Errorf("stop box: %w", serr))
	}
	return err
}

// loadSnapshots reads the stored snapshots and removes the directories
// none of them names: what a daemon killed while it took or deleted a
// snapshot left. It runs at start, before any create.
func (m *Manager) loadSnapshots() error {
	snaps, err := m.store.allSnapshots()
	if err != nil {
		return err
	}
	for _, s := range snaps {
		m.snaps[s.ID] = s
	}
	dirs, _ := filepath.Glob(filepath.Join(m.cfg.DataDir, "snapshots", "*"))
	for _, d := range dirs {
		if _, ok := m.snaps[filepath.Base(d)]; ok {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			m.log.Warn("remove orphan snapshot directory", "dir", d, "err", err)
			continue
		}
		m.log.Info("removed a snapshot directory no snapshot names", "dir", d)
	}
	return nil
}
