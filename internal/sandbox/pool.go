package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// PoolSpec is one warm pool: Size desktops of Template at Width×Height,
// booted on Backend ("" = the daemon's default backend) before anyone asks
// for them. A create that matches takes one and applies its session in
// place, so its create-to-ready is a claim, not a boot.
type PoolSpec struct {
	Backend  string
	Template string
	Width    int
	Height   int
	Size     int
}

// String is the spec in ParsePoolSpec's form, the pool's metric label.
func (p PoolSpec) String() string {
	s := fmt.Sprintf("%s:%dx%d=%d", p.Template, p.Width, p.Height, p.Size)
	if p.Backend != "" {
		s = p.Backend + "/" + s
	}
	return s
}

var poolSpecRE = regexp.MustCompile(`^(?:([a-z0-9-]+)/)?([a-z0-9][a-z0-9._-]*):([0-9]{1,5})x([0-9]{1,5})=([0-9]{1,4})$`)

// MaxPoolSize bounds one pool; the daemon's sandbox slots bound them all.
const MaxPoolSize = 1000

// ParsePoolSpec reads "[backend/]template:WIDTHxHEIGHT=SIZE", e.g.
// "desktop:1024x768=4" or "gvisor/desktop:1280x800=2" (cubicled --pool).
func ParsePoolSpec(s string) (PoolSpec, error) {
	m := poolSpecRE.FindStringSubmatch(s)
	if m == nil {
		return PoolSpec{}, errdefs.Invalid("pool %q: want [backend/]template:WIDTHxHEIGHT=SIZE, e.g. desktop:1024x768=4", s)
	}
	w, _ := strconv.Atoi(m[3])
	h, _ := strconv.Atoi(m[4])
	n, _ := strconv.Atoi(m[5])
	if w == 0 || h == 0 { // ValidateCreate reads 0x0 as "the default"
		return PoolSpec{}, errdefs.Invalid("pool %q: a screen of %dx%d", s, w, h)
	}
	p := PoolSpec{Backend: m[1], Template: m[2], Width: w, Height: h, Size: n}
	if p.Backend == "auto" {
		p.Backend = ""
	}
	if _, err := ValidateCreate(CreateRequest{Template: p.Template, Backend: p.Backend, Resolution: Resolution{Width: w, Height: h}}); err != nil {
		return PoolSpec{}, errdefs.Invalid("pool %q: %s", s, errdefs.UserMessage(err))
	}
	if n < 1 || n > MaxPoolSize {
		return PoolSpec{}, errdefs.Invalid("pool %q: size must be in [1, %d]", s, MaxPoolSize)
	}
	return p, nil
}

// pool is the state of one PoolSpec. Its boxes are entries like any
// sandbox's but not in Manager.entries: nobody can see, list or reach one
// until a create claims it, and none is in the store, so a daemon that
// dies leaves them as orphans the next one cleans. A box serves one
// create in its life and is never given back: what one user did in it
// cannot reach the next.
type pool struct {
	spec     PoolSpec
	boxes    []*entry // starting or running, unclaimed, oldest first
	booting  bool     // one boot at a time: the pool never crowds out creates
	failures int      // boots failed in a row
	retryAt  time.Time
}

// poolBackoff is how long a pool waits after n boots failed in a row.
func poolBackoff(n int) time.Duration {
	return min(time.Second<<min(n, 9), 5*time.Minute)
}

// poolSessionEnv marks a box booted for the pool (agent.PoolEnv).
var poolSessionEnv = map[string]string{"CUBICLE_POOLED": "1"}

// poolLoop keeps the pools full until the manager closes.
func (m *Manager) poolLoop() {
	defer m.wg.Done()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		m.fillPools()
		select {
		case <-m.ctx.Done():
			return
		case <-m.poolKick:
		case <-t.C:
		}
	}
}

// kickPools makes the pool loop look again now (a box was claimed or a
// slot freed).
func (m *Manager) kickPools() {
	select {
	case m.poolKick <- struct{}{}:
	default:
	}
}

// fillPools boots one box for each pool that lacks one, within the
// daemon's slots.
func (m *Manager) fillPools() {
	for _, p := range m.pools {
		d, err := m.resolveBackend(m.ctx, p.spec.Backend)
		if err != nil {
			m.mu.Lock()
			m.prunePoolLocked(p)
			m.mu.Unlock()
			continue
		}
		m.mu.Lock()
		m.prunePoolLocked(p)
		now := m.cfg.Clock.Now()
		if m.closing || p.booting || len(p.boxes) >= p.spec.Size || now.Before(p.retryAt) || m.activeLocked() >= m.cfg.MaxSandboxes {
			m.mu.Unlock()
			continue
		}
		rootfs, err := m.cfg.Images(p.spec.Template)
		if err != nil {
			p.failures++
			p.retryAt = now.Add(poolBackoff(p.failures))
			m.mu.Unlock()
			m.log.Warn("warm pool: image", "pool", p.spec.String(), "err", err)
			continue
		}
		res := Resolution{Width: p.spec.Width, Height: p.spec.Height}
		rec := &record{
			Sandbox: Sandbox{
				ID: newID(), State: StateStarting, Template: p.spec.Template,
				Backend: d.Name(), Isolation: d.Isolation(), Resolution: res,
				CreatedAt: now, LastActiveAt: now, Metadata: map[string]string{},
			},
			Request: CreateRequest{Template: p.spec.Template, Backend: p.spec.Backend, Resolution: res, Env: poolSessionEnv},
			Token:   newToken(),
			Pool:    p.spec.String(),
		}
		sctx, cancel := context.WithTimeout(m.ctx, m.cfg.ReadyTimeout)
		e := &entry{rec: rec, lastActive: now, cancel: cancel, started: make(chan struct{}), ending: make(chan struct{}), stopped: make(chan struct{})}
		p.boxes = append(p.boxes, e)
		p.booting = true
		m.mu.Unlock()
		spec := driver.Spec{ID: rec.Sandbox.ID, Shape: driver.Shape{Image: rootfs}, Session: sessionOf(rec)}
		// A refill restores the boot template when there is one: its
		// box is usable the moment a create claims it, browser and all.
		boot := bootCold(d, false)
		if k, sn, ok := m.templateKeyOf(m.ctx, rec.Request, d); ok {
			boot = m.templateBoot(d, sn, k, rootfs, e, false)
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			defer cancel()
			m.start(sctx, e, d, spec, nil, boot)
			m.mu.Lock()
			p.booting = false
			if e.rec.Sandbox.State == StateRunning {
				p.failures = 0
			} else if !isClosed(e.ending) { // a failed boot, not one ended on purpose
				p.failures++
				p.retryAt = m.cfg.Clock.Now().Add(poolBackoff(p.failures))
			}
			m.updatePoolGaugeLocked(p)
			m.mu.Unlock()
			m.kickPools()
		}()
	}
}

// teardownPoolBox destroys a box taken out of its pool. One whose stop
// failed becomes an entry like a sandbox's, a failed one, so that the
// reaper tries again and its slot stays held until it is free.
func (m *Manager) teardownPoolBox(e *entry, reason string) {
	m.teardown(e, reason)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keepStopFailedLocked(e)
}

// keepStopFailedLocked moves a pool box whose stop failed into entries.
func (m *Manager) keepStopFailedLocked(e *entry) {
	if !e.stopFailed {
		return
	}
	e.rec.Pool = ""
	m.entries[e.rec.Sandbox.ID] = e
	m.updateGaugesLocked()
}

// prunePoolLocked drops the boxes of p that died or failed to boot.
func (m *Manager) prunePoolLocked(p *pool) {
	live := p.boxes[:0]
	for _, e := range p.boxes {
		if s := e.rec.Sandbox.State; s == StateStarting || s == StateRunning || s == StateStopping {
			live = append(live, e) // a stopping box still holds its slot
			continue
		}
		m.keepStopFailedLocked(e)
	}
	clear(p.boxes[len(live):])
	p.boxes = live
	m.updatePoolGaugeLocked(p)
}

func (m *Manager) updatePoolGaugeLocked(p *pool) {
	n := 0
	for _, e := range p.boxes {
		if e.rec.Sandbox.State == StateRunning {
			n++
		}
	}
	m.m.PoolReady.WithLabelValues(p.spec.String()).Set(float64(n))
}

// poolBoxesLocked counts the pools' boxes and the claims in progress:
// they hold slots like sandboxes do.
func (m *Manager) poolBoxesLocked() int {
	n := m.claiming
	for _, p := range m.pools {
		n += len(p.boxes)
	}
	return n
}

// poolFor is the pool whose boxes can serve req on backend d: same
// backend, template and screen, the default DPI and shape, and nothing
// only a boot can give (volumes).
func (m *Manager) poolFor(req CreateRequest, d driver.Driver) *pool {
	if len(req.Volumes) > 0 || req.VCPUs != 0 || req.MemoryMB != 0 || (req.DPI != 0 && req.DPI != defaultDPI) || !devTools(req) {
		return nil
	}
	for _, p := range m.pools {
		if p.spec.Template != req.Template || p.spec.Width != req.Resolution.Width || p.spec.Height != req.Resolution.Height {
			continue
		}
		if pd, err := m.resolveBackend(m.ctx, p.spec.Backend); err == nil && pd.Name() == d.Name() {
			return p
		}
	}
	return nil
}

// DevToolsEnv, "0" in a create's environment, turns off Chromium's
// DevTools in the sandbox (agent.DevToolsEnv); it is on otherwise. The
// agent reads it when it starts, so a pool box, started with DevTools,
// cannot serve a create that turns it off.
const DevToolsEnv = "CUBICLE_DEVTOOLS"

func devTools(req CreateRequest) bool { return req.Env[DevToolsEnv] != "0" }

// defaultDPI is the screen's DPI when a create names none (the agent's
// default), the DPI of every pool box.
const defaultDPI = 96

// claim serves a create from pool p: it takes the oldest booted box,
// gives it rec's session (the agent swaps its token, takes the
// environment and starts the browser at the start URL), applies the
// egress policy, and makes it the sandbox rec describes, under the box's
// own ID. ok is false when p had no box ready or the box would not take
// the session (then it is destroyed, and the caller boots one cold).
func (m *Manager) claim(ctx context.Context, p *pool, rec *record, allow []netip.Prefix) (sb Sandbox, ok bool, err error) {
	t0 := time.Now()
	owner := rec.Request.Owner
	m.mu.Lock()
	m.prunePoolLocked(p)
	i := -1
	for j, e := range p.boxes {
		if e.rec.Sandbox.State == StateRunning {
			i = j
			break
		}
	}
	if i < 0 {
		m.mu.Unlock()
		m.m.PoolClaims.WithLabelValues(p.spec.String(), "miss").Inc()
		return Sandbox{}, false, nil
	}
	// The quotas are checked as a cold create's are; the box already
	// holds its slot.
	if owner != "" && m.cfg.MaxPerOwner > 0 && m.activeOfLocked(owner) >= m.cfg.MaxPerOwner {
		m.mu.Unlock()
		return Sandbox{}, true, errdefs.New(errdefs.ErrQuota, "this API key already has %d live sandboxes, its limit", m.cfg.MaxPerOwner)
	}
	e := p.boxes[i]
	p.boxes = append(p.boxes[:i], p.boxes[i+1:]...)
	m.claiming++
	m.claims[owner]++
	m.updatePoolGaugeLocked(p)
	box, poolClient, id := e.box, e.client, e.rec.Sandbox.ID
	m.mu.Unlock()
	m.kickPools()
	done := func() {
		m.claiming--
		if m.claims[owner]--; m.claims[owner] == 0 {
			delete(m.claims, owner)
		}
	}
	// broken gives up on the box: counted (done) unless counted is
	// set, destroyed, and the create boots cold.
	broken := func(err error, counted bool) (Sandbox, bool, error) {
		m.log.Warn("warm pool: box would not take a session; destroyed, booting one cold", "pool", p.spec.String(), "sandbox", id, "err", err)
		m.m.PoolClaims.WithLabelValues(p.spec.String(), "miss").Inc()
		if !counted {
			m.mu.Lock()
			done()
			m.mu.Unlock()
		}
		m.teardownPoolBox(e, "pool_broken")
		return Sandbox{}, false, nil
	}

	token := newToken()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = poolClient.Desktop.ApplySession(actx, connect.NewRequest(&desktoppb.ApplySessionRequest{
		Token: token, Env: rec.Request.Env, StartUrl: rec.Request.StartURL,
	}))
	cancel()
	if err != nil {
		return broken(fmt.Errorf("apply session: %w", err), false)
	}
	if len(allow) > 0 {
		if err := m.cfg.Network.SetEgress(ctx, id, allow); err != nil {
			return broken(fmt.Errorf("egress policy: %w", err), false)
		}
	}

	client := agentclient.New(box.DialAgent, token)
	m.mu.Lock()
	done()
	if e.rec.Sandbox.State != StateRunning || isClosed(box.Wait()) || m.closing {
		m.mu.Unlock()
		client.Close()
		return broken(errors.New("the box ended, or the daemon began to close, during the claim"), true)
	}
	now := m.cfg.Clock.Now()
	old := e.rec
	if !rec.Sandbox.ExpiresAt.IsZero() { // the lifetime runs from the claim
		rec.Sandbox.ExpiresAt = now.Add(rec.Sandbox.ExpiresAt.Sub(rec.Sandbox.CreatedAt))
	}
	rec.Sandbox.ID = id
	rec.Sandbox.State = StateRunning
	rec.Sandbox.Backend, rec.Sandbox.Isolation = old.Sandbox.Backend, old.Sandbox.Isolation
	rec.Sandbox.IP, rec.Sandbox.Desktop = old.Sandbox.IP, old.Sandbox.Desktop
	rec.Sandbox.CreatedAt, rec.Sandbox.LastActiveAt = now, now
	rec.Token = token
	rec.DriverState = old.DriverState
	e.rec, e.client, e.lastActive = rec, client, now
	m.entries[id] = e
	m.updateGaugesLocked()
	m.mu.Unlock()
	poolClient.Close()
	if err := m.persist(e); err != nil {
		// Unknown to the store, the box would be an orphan after a
		// restart: the create fails and leaves nothing.
		m.teardown(e, "")
		m.forget(id)
		if derr := m.store.delete(id); derr != nil {
			m.log.Warn("delete the record of a claim that failed", "sandbox", id, "err", derr)
		}
		if errors.Is(err, syscall.ENOSPC) || diskFull(m.cfg.DataDir) {
			return Sandbox{}, true, errFull
		}
		return Sandbox{}, true, fmt.Errorf("persist new sandbox: %w", err)
	}
	m.m.PoolClaims.WithLabelValues(p.spec.String(), "hit").Inc()
	m.m.ClaimDuration.WithLabelValues(rec.Sandbox.Backend).Observe(time.Since(t0).Seconds())
	m.log.Info("sandbox ready from the warm pool", "sandbox", id, "pool", p.spec.String(), "ms", time.Since(t0).Milliseconds())
	return m.snapshot(e), true, nil
}

// evictPoolBox destroys one pool box, the youngest, so that a create that
// no pool serves can have its slot; it reports whether there was one.
func (m *Manager) evictPoolBox() bool {
	m.mu.Lock()
	var victim *entry
	for _, p := range m.pools {
		if n := len(p.boxes); n > 0 && victim == nil {
			victim = p.boxes[n-1]
			p.boxes = p.boxes[:n-1]
			m.updatePoolGaugeLocked(p)
		}
	}
	m.mu.Unlock()
	if victim == nil {
		return false
	}
	m.teardownPoolBox(victim, "pool_evicted")
	return true
}

// drainPools destroys every pool box (the daemon is closing: unclaimed,
// they are not worth keeping, and the next daemon would clean them).
func (m *Manager) drainPools() {
	m.mu.Lock()
	var all []*entry
	for _, p := range m.pools {
		all = append(all, p.boxes...)
		p.boxes = nil
	}
	m.mu.Unlock()
	for _, e := range all {
		m.teardownPoolBox(e, "")
	}
}

// PoolInfo is the state of one warm pool, as /v1/info reports it.
type PoolInfo struct {
	Pool     string `json:"pool"`
	Backend  string `json:"backend"`
	Template string `json:"template"`
	Width    int    `json:"width"`
	Height   int    `json:"height"`
	Size     int    `json:"size"`
	Ready    int    `json:"ready"`
}

// Pools reports the warm pools.
func (m *Manager) Pools() []PoolInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PoolInfo, 0, len(m.pools))
	for _, p := range m.pools {
		pi := PoolInfo{Pool: p.spec.String(), Backend: p.spec.Backend, Template: p.spec.Template,
			Width: p.spec.Width, Height: p.spec.Height, Size: p.spec.Size}
		for _, e := range p.boxes {
			if e.rec.Sandbox.State == StateRunning {
				pi.Ready++
			}
			if pi.Backend == "" {
				pi.Backend = e.rec.Sandbox.Backend
			}
		}
		if pi.Backend == "" {
			pi.Backend = m.cfg.DefaultBackend
		}
		out = append(out, pi)
	}
	return out
}
