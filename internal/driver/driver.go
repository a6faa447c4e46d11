// Package driver defines the seam between the sandbox manager and the isolation
// backends (gVisor, runc, QEMU, Firecracker). The manager owns this contract and
// imports only this package; each backend is an adapter in a subpackage,
// registered by name in cmd/cubicled.
package driver

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
)

// Isolation kinds reported to users for each sandbox.
const (
	IsolationVM        = "vm"
	IsolationGVisor    = "gvisor"
	IsolationNamespace = "namespace"
)

// ErrUnavailable is wrapped by Available and Create when the backend cannot run
// on this host.
var ErrUnavailable = errors.New("backend unavailable")

// Driver starts sandboxes of one backend.
type Driver interface {
	// Name is the backend name used in the API ("gvisor", "runc", ...).
	Name() string
	// Isolation is the isolation kind the backend gives.
	Isolation() string
	// Available returns nil, or an error saying precisely why the backend is
	// unusable on this host.
	Available(ctx context.Context) error
	// Create starts a box from spec. The box must outlive ctx (ctx bounds only
	// the start-up); on error nothing of the box is left behind.
	Create(ctx context.Context, spec Spec) (Box, error)
	// Adopt re-attaches to a box started by an earlier daemon process.
	Adopt(ctx context.Context, state State) (Box, error)
	// Cleanup removes everything the driver owns under its state directory or
	// in the runtime that is not one of keep (sandbox IDs); it is run at start
	// to remove orphans.
	Cleanup(ctx context.Context, keep map[string]bool) error
}

// Runtime is the program a backend runs its sandboxes with, for GET
// /v1/info and `cubicle info`: an operator reads which runsc a host runs
// there.
type Runtime struct {
	Name    string // "runsc", "runc", "qemu-system-x86_64"
	Path    string
	Version string // as the program says it; "" when it did not run
}

// RuntimeReporter is implemented by backends that run a runtime program.
type RuntimeReporter interface {
	Runtime() Runtime
}

// Accelerator is implemented by VM backends that can run with or without
// hardware acceleration; "auto" backend choice skips a driver whose
// Accelerated reports false (QEMU under TCG is correct but far too slow to be
// anyone's default).
type Accelerator interface {
	Accelerated(ctx context.Context) bool
}

// Prober is implemented by backends whose host checks cannot tell whether a
// guest will boot here (Firecracker: a KVM that hangs guests passes every
// check). Probe boots a small guest and returns why it could not, or nil;
// the backend caches the answer and bounds the boot itself (a boot that ctx
// cut short is no answer and is not kept). The manager picks such a backend, for
// "auto" and by name, only once Probe has succeeded; Available stays about
// binaries and devices, so that orphan cleanup at start never waits for a
// boot or is skipped because one failed.
type Prober interface {
	Probe(ctx context.Context) error
}

// Spec says what box to start: the box's shape, and the session it
// starts with.
type Spec struct {
	ID string // sandbox ID, [a-z0-9]
	Shape
	Session
}

// Shape is what makes a box what it is, fixed for its life: a box of a
// warm pool is made to a shape before anyone asks for it, and a fork has
// the shape of its parent.
type Shape struct {
	Image     string // rootfs directory of the image (read-only, shared)
	VCPUs     int    // 0 = driver default
	MemoryMB  int    // 0 = driver default
	PidsLimit int    // 0 = driver default
	Net       *Net   // nil: no network at all (loopback only)
	// Volumes are persistent disks the box mounts; only a driver that
	// is a VolumeAttacher is given any.
	Volumes []Volume
}

// Volume is a persistent disk of a box: an ext4 filesystem image on the
// host that the box mounts read-write at Path. The manager sees to it
// that one live box at most holds a volume.
type Volume struct {
	Name string // the volume's name, [a-z0-9._-]
	File string // host path of the filesystem image
	Path string // absolute, clean mount path in the box
}

// VolumeAttacher is implemented by backends that can mount volumes; the
// manager refuses a create with volumes on any other.
type VolumeAttacher interface {
	AttachesVolumes() bool
}

// Pauser is implemented by backends that can pause a box to disk: its
// memory and device state are written next to its files and its
// processes end, so a paused box holds no CPU and no memory; Resume
// brings back exactly what was there, processes and all.
type Pauser interface {
	// CanPause returns nil, or why boxes of this backend cannot pause
	// on this host (shown in GET /v1/info).
	CanPause(ctx context.Context) error
	// Pause saves box b and ends it. On success b is dead (its Wait is
	// closed, its Stop does nothing) and Paused is what Resume and
	// Discard take. On error b runs on as before when its Wait is
	// open, and what the attempt wrote is removed.
	Pause(ctx context.Context, b Box) (Paused, error)
	// Resume starts the box saved as p and waits until its agent
	// answers. On error nothing of the attempt is left and p is kept,
	// so that Resume may be tried again.
	Resume(ctx context.Context, p Paused) (Box, error)
	// Discard removes what a paused box holds (its files). It is safe
	// to call more than once.
	Discard(ctx context.Context, p Paused) error
	// Settle decides a pause that an earlier daemon's death cut short,
	// from the State of the box it was pausing: it waits for what that
	// pause left going, and returns the box running again, or its saved
	// state when the pause got far enough, or neither when the box is
	// gone (the caller then frees what is left, as of a dead box).
	Settle(ctx context.Context, st State) (Box, *Paused, error)
}

// Forker is implemented by backends that can fork a running box: copy it
// as it is, memory, processes and disk, into new boxes while it runs on.
type Forker interface {
	// CanFork returns nil, or why boxes of this backend cannot fork on
	// this host.
	CanFork(ctx context.Context) error
	// Fork makes one box of each of children (their own IDs and
	// networks; the parent's shape), each a copy of parent at the
	// moment of the call, and waits until their agents answer. A copy's
	// agent still has the parent's identity (token, hostname,
	// machine-id, random state, address): the caller re-keys it before
	// it lets anyone reach it. parent runs on, paused for the time the
	// copy takes. On error no child is left and parent runs on.
	Fork(ctx context.Context, parent Box, children []Spec) ([]Box, error)
}

// Snapshotter is implemented by backends that can save a running box as
// a stored snapshot — memory, processes and disk — from which any number
// of new boxes start later, long after the box itself is gone.
type Snapshotter interface {
	// CanSnapshot returns nil, or why boxes of this backend cannot be
	// snapshotted on this host.
	CanSnapshot(ctx context.Context) error
	// Snapshot saves box b into dir, a new, empty directory that the
	// caller owns (and removes with everything in it once the snapshot
	// is deleted or the call failed), and returns what Restore takes. b
	// runs on, paused for the time the copy takes; on error too.
	Snapshot(ctx context.Context, b Box, dir string) (Snapshot, error)
	// Restore starts a new box of spec from the snapshot s saved in dir
	// and waits until its agent answers. The box has the saved box's
	// shape whatever spec says (its memory image fits no other); its own
	// ID and network come from spec. Its agent still has the saved box's
	// identity (token, hostname, machine-id, random state, address): the
	// caller re-keys it before it lets anyone reach it. On error nothing
	// of the new box is left; the snapshot is never changed.
	Restore(ctx context.Context, s State, dir string, spec Spec) (Box, error)
}

// Snapshot is a box saved by Snapshotter.Snapshot.
type Snapshot struct {
	State State // versioned, as Box.State; kept by the manager's store
	Bytes int64 // what it takes on the host's disk
	// VCPUs and MemoryMB are the shape the box had (defaults filled
	// in), which every box from the snapshot has; 0 when unknown.
	VCPUs, MemoryMB int
}

// ErrCannotCopy is wrapped by a Fork or Snapshot refused for good for
// what the box is (a box started by a daemon that could not copy it, an
// image that is gone): the box runs on, and asking again will not help.
var ErrCannotCopy = errors.New("the box cannot be copied")

// ErrSnapshotStale is wrapped by a Restore refused because what the
// snapshot was taken on is gone or changed (its image was rebuilt): no
// box can ever start from it again.
var ErrSnapshotStale = errors.New("the snapshot's image has changed since it was taken")

// ErrNotPausableNow is wrapped by a Pause refused before anything was
// done, for what the box holds at the moment (gVisor: an open TCP
// connection): the box runs on, and a later pause may succeed.
var ErrNotPausableNow = errors.New("the box cannot be paused as it is now")

// ErrResumeLost is wrapped by a Resume that failed after the box ran
// again: its saved state is behind its disk now and cannot be resumed.
var ErrResumeLost = errors.New("the box ran again before its resume failed; its saved state is lost")

// Paused is a box saved to disk by Pauser.Pause.
type Paused struct {
	State State // versioned, as Box.State; kept by the manager's store
	Bytes int64 // what it takes on the host's disk
}

// Session is what belongs to one user's use of a box: today a box starts
// with it; a box taken from a warm pool or forked from another gets a new
// one in place.
type Session struct {
	Token    string            // agent token the agent must check
	Env      map[string]string // environment for every process in the box
	Width    int               // screen
	Height   int
	DPI      int
	StartURL string
}

// Net is a sandbox's network attachment, prepared by the manager (via
// internal/netpool) before Create and released after Stop. OCI boxes join
// Netns, where the guest side of a veth already carries Addr; VMs attach
// TAP (created in Netns, or in the host namespace when Netns is "") and are
// told Addr, Gateway and DNS on the kernel command line.
type Net struct {
	Netns   string       // path of the network namespace to join, e.g. /run/netns/cubicle-ID
	TAP     string       // TAP device for VMs ("" for OCI boxes)
	MAC     string       // guest MAC address
	Addr    netip.Prefix // guest address and prefix length
	Gateway netip.Addr
	DNS     []netip.Addr
}

// State is the opaque, versioned handle a driver needs to Adopt a box again.
type State struct {
	Version int             `json:"version"`
	Driver  string          `json:"driver"`
	Data    json.RawMessage `json:"data"`
}

// Box is one running sandbox.
type Box interface {
	// DialAgent opens a new byte stream to the agent inside the box.
	DialAgent(ctx context.Context) (net.Conn, error)
	// State is what the store must keep so Adopt can re-attach.
	State() State
	// Wait is closed when the box has died.
	Wait() <-chan struct{}
	// Stop stops the box and frees every resource it holds. It is safe to call
	// more than once and after the box died.
	Stop(ctx context.Context) error
}
