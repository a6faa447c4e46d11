package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// MaxForks bounds the copies one fork makes.
const MaxForks = 10

// forkBound bounds a whole fork: the copy, and every child's start and
// re-key (a VM's load under TCG takes seconds each).
const forkBound = 10 * time.Minute

// forker returns backend's Forker, or why it has none here.
func (m *Manager) forker(ctx context.Context, backend string) (driver.Forker, error) {
	f, ok := m.cfg.Drivers[backend].(driver.Forker)
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotSupported, "the %s backend cannot fork sandboxes; qemu and gvisor can", backend)
	}
	if err := f.CanFork(ctx); err != nil {
		return nil, errdefs.New(errdefs.ErrNotSupported, "the %s backend cannot fork sandboxes on this host: %v", backend, err)
	}
	return f, nil
}

// Fork copies the running sandbox id, as it is (its memory, programs,
// page, disk), into count new sandboxes of owner, and returns them
// running. Each copy gets an identity of its own before anyone can reach
// it: a new ID and agent token, hostname, machine-id, reseeded random
// state, and its own network address under the parent's egress policy.
// The parent runs on. The copies count as creates against every limit;
// on error none is left.
func (m *Manager) Fork(ctx context.Context, id, owner string, count int) ([]Sandbox, error) {
	if count < 1 || count > MaxForks {
		return nil, errdefs.Invalid("count must be 1..%d, not %d", MaxForks, count)
	}
	if err := m.allowOwnerCreate(ctx, owner); err != nil {
		return nil, err
	}
	e, err := m.entry(id)
	if err != nil {
		return nil, err
	}
	f, err := m.forker(ctx, e.rec.Sandbox.Backend)
	if err != nil {
		return nil, err
	}
	e.op.Lock() // no pause, resume or stop of the parent meanwhile
	defer e.op.Unlock()
	m.mu.Lock()
	was := *e.rec
	m.mu.Unlock()
	if err := m.roomToSave(&was, "forking"); err != nil {
		return nil, err // before anything is made
	}

	now := m.cfg.Clock.Now()
	m.mu.Lock()
	parent := *e.rec
	switch {
	case parent.Sandbox.State != StateRunning:
		m.mu.Unlock()
		return nil, errdefs.Conflict("sandbox %s is %s; only a running sandbox can be forked", id, parent.Sandbox.State)
	case len(parent.Request.Volumes) > 0:
		m.mu.Unlock()
		return nil, errdefs.Conflict("sandbox %s holds volumes, and a volume is attached to one sandbox at a time; fork a sandbox without volumes", id)
	case m.activeLocked()+count > m.cfg.MaxSandboxes:
		m.mu.Unlock()
		return nil, errdefs.New(errdefs.ErrCapacity, "%d forks do not fit: %d of %d sandbox slots are in use", count, m.activeLocked(), m.cfg.MaxSandboxes)
	case owner != "" && m.cfg.MaxPerOwner > 0 && m.activeOfLocked(owner)+count > m.cfg.MaxPerOwner:
		m.mu.Unlock()
		return nil, errdefs.New(errdefs.ErrQuota, "%d forks would take this API key past its limit of %d live sandboxes", count, m.cfg.MaxPerOwner)
	}
	box := e.box
	kids := make([]*entry, count)
	for i := range kids {
		req := parent.Request
		req.Owner, req.Volumes, req.AutoPause = owner, nil, parent.Request.AutoPause
		rec := &record{
			Sandbox: Sandbox{
				ID: newID(), State: StateStarting, Template: parent.Sandbox.Template,
				Backend: parent.Sandbox.Backend, Isolation: parent.Sandbox.Isolation, Resolution: parent.Sandbox.Resolution,
				CreatedAt: now, LastActiveAt: now, Metadata: maps.Clone(parent.Sandbox.Metadata), AutoPause: parent.Sandbox.AutoPause,
			},
			Request: req, Token: newToken(), IdleTimeout: parent.IdleTimeout,
		}
		if rec.Sandbox.Metadata == nil {
			rec.Sandbox.Metadata = map[string]string{}
		}
		if life := m.lifeOf(req); life >= 0 {
			rec.Sandbox.ExpiresAt = now.Add(life)
		}
		kids[i] = &entry{rec: rec, lastActive: now, cancel: func() {}, started: make(chan struct{}), ending: make(chan struct{}), stopped: make(chan struct{})}
		m.entries[rec.Sandbox.ID] = kids[i]
	}
	m.updateGaugesLocked()
	m.mu.Unlock()

	t0 := time.Now()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forkBound)
	defer cancel()
	log := m.log.With("sandbox", id)
	made := 0 // kids[:made] have a box
	var boxes []driver.Box
	fail := func(err error) ([]Sandbox, error) {
		log.Error("fork failed", "err", err)
		for i, k := range kids {
			if i < made && boxes[i] != nil {
				if serr := boxes[i].Stop(context.WithoutCancel(fctx)); serr != nil {
					log.Warn("stop a fork's box", "fork", k.rec.Sandbox.ID, "err", serr)
				}
			}
			if m.cfg.Network != nil {
				if derr := m.cfg.Network.Detach(context.WithoutCancel(fctx), k.rec.Sandbox.ID); derr != nil {
					log.Warn("detach a fork's network", "fork", k.rec.Sandbox.ID, "err", derr)
				}
			}
			if k.client != nil {
				k.client.Close()
			}
			// A fork destroyed meanwhile is its teardown's to finish.
			m.mu.Lock()
			mine := k.rec.Sandbox.State == StateStarting
			if mine {
				_ = m.transitionLocked(k, StateFailed) // starting → failed
			}
			m.mu.Unlock()
			close(k.started)
			if !mine {
				continue
			}
			close(k.stopped)
			m.forget(k.rec.Sandbox.ID)
			if derr := m.store.delete(k.rec.Sandbox.ID); derr != nil {
				log.Warn("delete a fork's record", "fork", k.rec.Sandbox.ID, "err", derr)
			}
		}
		m.updateNetGauge()
		if errors.Is(err, errdefs.ErrCapacity) {
			return nil, errdefs.New(errdefs.ErrCapacity, "fork sandbox %s: %s", id, errdefs.UserMessage(err))
		}
		return nil, errdefs.New(errdefs.ErrUnavailable, "fork sandbox %s: %v; no fork was left", id, err)
	}
	for _, k := range kids {
		// Known to the store first: a daemon killed from here on finds
		// them starting, and frees what they hold.
		if err := m.persist(k); err != nil {
			return fail(fmt.Errorf("persist: %w", err))
		}
	}
	rootfs, err := m.cfg.Images(parent.Sandbox.Template)
	if err != nil {
		return fail(err)
	}
	allow, _ := egressAllow(parent.Request.Network) // it was valid at the parent's create
	specs := make([]driver.Spec, count)
	for i, k := range kids {
		specs[i] = driver.Spec{ID: k.rec.Sandbox.ID,
			Shape:   driver.Shape{Image: rootfs, VCPUs: parent.Request.VCPUs, MemoryMB: parent.Request.MemoryMB},
			Session: sessionOf(k.rec)}
		if m.cfg.Network != nil && parent.Sandbox.IP != "" {
			n, err := m.cfg.Network.Attach(fctx, k.rec.Sandbox.ID, netKind(m.cfg.Drivers[parent.Sandbox.Backend]), allow)
			m.updateNetGauge()
			if err != nil {
				return fail(fmt.Errorf("attach network: %w", err))
			}
			specs[i].Net = n
			m.mu.Lock()
			k.rec.Sandbox.IP = n.Addr.Addr().String()
			m.mu.Unlock()
		}
	}
	boxes, err = f.Fork(fctx, box, specs)
	if err != nil {
		return fail(err)
	}
	made = len(boxes)
	tCopy := time.Since(t0)
	for i, k := range kids {
		c, err := m.rekey(fctx, boxes[i], parent, k, specs[i].Net)
		if err != nil {
			return fail(fmt.Errorf("fork %s: %w", k.rec.Sandbox.ID, err))
		}
		m.mu.Lock()
		k.client = c
		m.mu.Unlock()
	}
	out := make([]Sandbox, count)
	for i, k := range kids {
		st := boxes[i].State()
		m.mu.Lock()
		if k.rec.Sandbox.State != StateStarting { // destroyed meanwhile
			c := k.client
			k.client = nil
			m.mu.Unlock()
			c.Close()
			if err := boxes[i].Stop(context.WithoutCancel(fctx)); err != nil {
				log.Warn("stop a fork destroyed while it was made", "fork", k.rec.Sandbox.ID, "err", err)
			}
			if m.cfg.Network != nil {
				if err := m.cfg.Network.Detach(context.WithoutCancel(fctx), k.rec.Sandbox.ID); err != nil {
					log.Warn("detach a fork destroyed while it was made", "fork", k.rec.Sandbox.ID, "err", err)
				}
			}
			close(k.started)
			out[i] = m.snapshot(k)
			continue
		}
		k.box = boxes[i]
		k.rec.DriverState = &st
		k.rec.Sandbox.Desktop = parent.Sandbox.Desktop
		_ = m.transitionLocked(k, StateRunning) // starting → running
		m.mu.Unlock()
		close(k.started)
		if err := m.persist(k); err != nil {
			log.Warn("persist running fork", "fork", k.rec.Sandbox.ID, "err", err)
		}
		m.watch(k)
		out[i] = m.snapshot(k)
	}
	log.Info("sandbox forked", "forks", count, "copy_ms", tCopy.Milliseconds(), "ms", time.Since(t0).Milliseconds())
	return out, nil
}

// lifeOf is the lifetime a sandbox of req gets (-1: unlimited).
func (m *Manager) lifeOf(req CreateRequest) time.Duration {
	life := m.cfg.MaxLifetime
	if req.TimeoutSeconds > 0 {
		if t := time.Duration(req.TimeoutSeconds) * time.Second; life < 0 || t < life {
			life = t
		}
	}
	return life
}

// rekey gives copy k (a fork, or a sandbox from a snapshot), whose agent
// still holds parent's identity, its own, through the parent's token, and
// returns a client of its agent with its own.
func (m *Manager) rekey(ctx context.Context, box driver.Box, parent record, k *entry, n *driver.Net) (*agentclient.Client, error) {
	m.mu.Lock()
	id, token := k.rec.Sandbox.ID, k.rec.Token
	m.mu.Unlock()
	machineID := make([]byte, 16)
	entropy := make([]byte, 64)
	rand.Read(machineID)
	rand.Read(entropy)
	req := &desktoppb.RekeyRequest{
		Token: token, Hostname: guestHostname(id), MachineId: hex.EncodeToString(machineID), Entropy: entropy,
	}
	if n != nil && parent.Sandbox.IP != "" {
		old, err := netip.ParseAddr(parent.Sandbox.IP)
		if err != nil {
			return nil, fmt.Errorf("parent address %q: %w", parent.Sandbox.IP, err)
		}
		req.Mac, req.Addr, req.OldAddr = n.MAC, n.Addr.String(), netip.PrefixFrom(old, n.Addr.Bits()).String()
		if n.Gateway.IsValid() {
			req.Gateway = n.Gateway.String()
		}
	}
	pc := agentclient.New(box.DialAgent, parent.Token)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := pc.Desktop.Rekey(rctx, connect.NewRequest(req))
	cancel()
	pc.Close()
	if err != nil {
		return nil, fmt.Errorf("re-key: %w", err)
	}
	c := agentclient.New(box.DialAgent, token)
	if _, err := waitReady(ctx, c, box, false); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// guestHostname is the hostname of sandbox id's guest, as the VM
// backends give it at boot.
func guestHostname(id string) string {
	if len(id) > 12 {
		id = id[:12]
	}
	return "cubicle-" + id
}
