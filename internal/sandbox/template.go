package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/consolelog"
	"github.com/cubicle-dev/cubicle/internal/driver"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// Boot templates. A desktop's session takes seconds to become usable
// after its screen first answers (XFCE's panel, desktop and window
// manager, then Chromium on its page: about 7 s under gVisor on a quiet
// 2-core machine, far more under load), and keys an agent types before
// then are lost. So the first create of an image and shape on a backend
// that can snapshot boots a template box, waits until its desktop is
// usable, snapshots it and stops it; that create and every later one, and
// the warm pool's refills, restore the snapshot and make the copy their
// own: the identity a fork gets (token, hostname, machine-id, entropy,
// address), then the create's session (its environment for every command,
// its start URL as a navigation of the running browser). The clock is the
// host's after a restore.
//
// A template is booted with no create's session at all, so nothing of any
// API key's (its environment, its secrets, its start URL) is in it; it
// belongs to no owner, counts against no quota and is never listed. It is
// rebuilt when its image changes (the image resolver names another
// version), and lives as long as the daemon: a daemon's start removes the
// templates a previous one left, and builds them again on demand.
//
// What a template cannot give boots cold, as before: volumes (mounted at
// boot), DevTools turned off (the agent reads it at its start), a backend
// that cannot snapshot, and any create while its template's last build
// failed (retried after templateRetry).

// templateRetry is how long a failed template build is not retried:
// creates meanwhile boot cold.
const templateRetry = time.Minute

// templateSettle and templateSettleMax bound the wait for a template's
// screen to be quiet before it is saved (milliseconds): shorter than a
// caret's blink, which never stops.
const (
	templateSettle    = 400
	templateSettleMax = 10000
)

// TemplateEnv marks the boot of a template box (agent.TemplateEnv).
const templateEnvName = "CUBICLE_TEMPLATE"

// tmplKey is what a template serves: every create with the same key
// restores the same snapshot.
type tmplKey struct {
	backend, template  string
	width, height, dpi int
	vcpus, memoryMB    int
}

func (k tmplKey) String() string {
	return fmt.Sprintf("%s/%s:%dx%d@%d,%dcpu,%dMiB", k.backend, k.template, k.width, k.height, k.dpi, k.vcpus, k.memoryMB)
}

// tmpl is one boot template.
type tmpl struct {
	key    tmplKey
	rootfs string // the image version it was booted from
	id     string // its directory under DataDir/templates
	built  chan struct{}
	// After built is closed: what the build gave, or why it failed.
	err      error
	failedAt time.Time
	state    driver.State
	token    string // the template box's agent token: what a restore's re-key replaces
	ip       string // and its address
	desktop  bool
	users    int  // restores of it in progress
	stale    bool // replaced or failed: removed once users is 0
	// bootLog is what the template box printed up to its snapshot (its
	// session's start), booted at bootedAt: the first lines of every
	// copy's log, since a copy's own console begins at its restore.
	bootLog  []byte
	bootedAt time.Time
}

// maxTemplateLog bounds the boot log a template keeps for its copies.
const maxTemplateLog = 256 << 10

func (m *Manager) templateDir(id string) string {
	return filepath.Join(m.cfg.DataDir, "templates", id)
}

// sweepTemplates removes what a previous daemon's templates left: no
// template outlives its daemon.
func (m *Manager) sweepTemplates() {
	if err := os.RemoveAll(filepath.Join(m.cfg.DataDir, "templates")); err != nil {
		m.log.Warn("remove old boot templates", "err", err)
	}
}

// templateKeyOf is the template that could serve req on d, and the
// Snapshotter that would restore it; ok is false when none can (see the
// file comment for what boots cold).
func (m *Manager) templateKeyOf(ctx context.Context, req CreateRequest, d driver.Driver) (tmplKey, driver.Snapshotter, bool) {
	if m.cfg.NoTemplates || len(req.Volumes) > 0 || !devTools(req) {
		return tmplKey{}, nil, false
	}
	sn, ok := d.(driver.Snapshotter)
	if !ok || sn.CanSnapshot(ctx) != nil {
		return tmplKey{}, nil, false
	}
	dpi := req.DPI
	if dpi == 0 {
		dpi = defaultDPI
	}
	return tmplKey{
		backend: d.Name(), template: req.Template,
		width: req.Resolution.Width, height: req.Resolution.Height, dpi: dpi,
		vcpus: req.VCPUs, memoryMB: req.MemoryMB,
	}, sn, true
}

// template returns the built template of k, booted from rootfs, building
// it first when there is none (one build at a time per key, which every
// create of the key waits for). release ends the caller's use of it.
func (m *Manager) template(ctx context.Context, k tmplKey, rootfs string, d driver.Driver, sn driver.Snapshotter) (t *tmpl, release func(), err error) {
	m.mu.Lock()
	t = m.tmpls[k]
	if t != nil && isClosed(t.built) && (t.rootfs != rootfs || t.err != nil && m.cfg.Clock.Now().Sub(t.failedAt) >= templateRetry) {
		// Its image changed, or its failure is old enough to retry.
		m.dropTemplateLocked(t)
		t = nil
	}
	if t == nil {
		if m.closing {
			m.mu.Unlock()
			return nil, nil, errors.New("the daemon is closing")
		}
		t = &tmpl{key: k, rootfs: rootfs, id: newID(), built: make(chan struct{})}
		m.tmpls[k] = t
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.buildTemplate(t, d, sn)
		}()
	}
	t.users++
	m.mu.Unlock()
	release = func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		t.users--
		if t.stale && t.users == 0 {
			m.removeTemplateLocked(t)
		}
	}
	select {
	case <-t.built:
	case <-ctx.Done():
		release()
		return nil, nil, fmt.Errorf("wait for the boot template: %w", ctx.Err())
	}
	if t.err != nil {
		release()
		return nil, nil, t.err
	}
	return t, release, nil
}

// dropTemplateLocked takes t out of use; its files go once no restore
// reads them.
func (m *Manager) dropTemplateLocked(t *tmpl) {
	if m.tmpls[t.key] == t {
		delete(m.tmpls, t.key)
	}
	t.stale = true
	if t.users == 0 {
		m.removeTemplateLocked(t)
	}
}

func (m *Manager) removeTemplateLocked(t *tmpl) {
	if err := os.RemoveAll(m.templateDir(t.id)); err != nil {
		m.log.Warn("remove boot template", "template", t.key.String(), "err", err)
	}
}

// buildTemplate boots t's box with no create's session, waits until its
// desktop is usable, snapshots it into t's directory and stops it. It
// always closes t.built.
func (m *Manager) buildTemplate(t *tmpl, d driver.Driver, sn driver.Snapshotter) {
	t0 := time.Now()
	log := m.log.With("template", t.key.String())
	err := m.bootTemplate(t, d, sn)
	m.mu.Lock()
	if err != nil {
		t.err = fmt.Errorf("boot template %s: %w", t.key, err)
		t.failedAt = m.cfg.Clock.Now()
		t.stale = true
	}
	close(t.built)
	m.mu.Unlock()
	if err != nil {
		os.RemoveAll(m.templateDir(t.id))
		log.Warn("boot template failed; creates boot cold meanwhile", "err", err, "retry_in", templateRetry)
		return
	}
	log.Info("boot template built", "ms", time.Since(t0).Milliseconds())
}

func (m *Manager) bootTemplate(t *tmpl, d driver.Driver, sn driver.Snapshotter) error {
	k := t.key
	now := m.cfg.Clock.Now()
	res := Resolution{Width: k.width, Height: k.height}
	rec := &record{
		Sandbox: Sandbox{
			ID: newID(), State: StateStarting, Template: k.template,
			Backend: d.Name(), Isolation: d.Isolation(), Resolution: res,
			CreatedAt: now, LastActiveAt: now, Metadata: map[string]string{},
		},
		Request: CreateRequest{
			Template: k.template, Backend: k.backend, Resolution: res, DPI: k.dpi,
			VCPUs: k.vcpus, MemoryMB: k.memoryMB, Env: map[string]string{templateEnvName: "1"},
		},
		Token: newToken(),
		Pool:  "template " + k.String(), // as a pool box: never stored, listed or counted
	}
	if err := m.roomToSave(rec, "booting a template of"); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(m.ctx, m.cfg.ReadyTimeout)
	defer cancel()
	e := &entry{rec: rec, lastActive: now, cancel: cancel, started: make(chan struct{}), ending: make(chan struct{}), stopped: make(chan struct{})}
	spec := driver.Spec{
		ID:      rec.Sandbox.ID,
		Shape:   driver.Shape{Image: t.rootfs, VCPUs: k.vcpus, MemoryMB: k.memoryMB},
		Session: sessionOf(rec),
	}
	m.start(sctx, e, d, spec, nil, bootCold(d, true))
	defer m.teardownPoolBox(e, "template_built")
	m.mu.Lock()
	running, box := e.rec.Sandbox.State == StateRunning, e.box
	t.token, t.ip = rec.Token, rec.Sandbox.IP
	t.desktop = rec.Sandbox.Desktop == nil || *rec.Sandbox.Desktop
	m.mu.Unlock()
	if !running {
		return fmt.Errorf("its boot failed: %s", rec.Sandbox.Error)
	}
	// Usable means the windows are up and the browser takes keys; its
	// first paint may still be on its way. A template saved before it
	// would make every copy paint it again after its restore, and a
	// screenshot taken at once would show an empty window. So the save
	// waits, a little, for the screen to be quiet.
	if t.desktop {
		m.mu.Lock()
		c := e.client
		m.mu.Unlock()
		quiet := time.Now()
		shot, err := c.Desktop.Screenshot(sctx, connect.NewRequest(&desktoppb.ScreenshotRequest{
			Region: &desktoppb.Region{X: 0, Y: 0, W: 1, H: 1}, SettleMs: templateSettle, SettleMaxMs: templateSettleMax,
		}))
		if err != nil {
			// Not worth losing the template for: its copies paint.
			m.log.Warn("boot template: wait for the screen to settle", "template", k.String(), "err", err)
		} else {
			m.log.Debug("boot template: screen settled", "template", k.String(), "settled", shot.Msg.GetSettled(), "ms", time.Since(quiet).Milliseconds())
		}
	}
	t.bootLog, t.bootedAt = consoleBytes(box), rec.Sandbox.CreatedAt
	dir := m.templateDir(t.id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	saved, err := sn.Snapshot(sctx, box, dir)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	t.state = saved.State
	return nil
}

// templateBoot is the boot of a create that a template can serve: the
// template's snapshot restored and made the sandbox's own, then, unless
// the box is for the warm pool (whose claim does it), the create's
// session applied. When there is no template to be had, or its restore
// fails, the box boots cold instead: a template makes a create faster,
// never impossible.
func (m *Manager) templateBoot(d driver.Driver, sn driver.Snapshotter, k tmplKey, rootfs string, e *entry, apply bool) bootFunc {
	cold := bootCold(d, apply)
	return func(ctx context.Context, spec driver.Spec) (driver.Box, *agentclient.Client, bool, error) {
		log := m.log.With("sandbox", spec.ID, "template", k.String())
		t, release, err := m.template(ctx, k, rootfs, d, sn)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, false, err
			}
			log.Info("no boot template; booting cold", "err", err)
			return cold(ctx, spec)
		}
		defer release()
		box, c, err := m.restoreTemplate(ctx, sn, t, e, spec, apply)
		if err == nil {
			m.seedLog(e, t)
			return box, c, t.desktop, nil
		}
		if ctx.Err() != nil {
			return nil, nil, false, err
		}
		log.Warn("boot template would not restore; booting cold", "err", err)
		return cold(ctx, spec)
	}
}

func (m *Manager) restoreTemplate(ctx context.Context, sn driver.Snapshotter, t *tmpl, e *entry, spec driver.Spec, apply bool) (driver.Box, *agentclient.Client, error) {
	box, c, err := m.restoreRekeyed(ctx, sn, t.state, m.templateDir(t.id), spec, record{Token: t.token, Sandbox: Sandbox{IP: t.ip}}, e)
	if err != nil || !apply {
		return box, c, err
	}
	m.mu.Lock()
	req := &desktoppb.ApplySessionRequest{Token: e.rec.Token, Env: e.rec.Request.Env, StartUrl: e.rec.Request.StartURL}
	m.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_, err = c.Desktop.ApplySession(actx, connect.NewRequest(req))
	cancel()
	if err != nil {
		c.Close()
		return nil, nil, stopAfter(ctx, box, fmt.Errorf("apply session: %w", err))
	}
	return box, c, nil
}

// consoleBytes is the last maxTemplateLog bytes box printed, or nil.
func consoleBytes(box driver.Box) []byte {
	c, ok := box.(driver.Console)
	if !ok {
		return nil
	}
	f, err := c.OpenConsole()
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(fi.Size()-maxTemplateLog, 0)
	b := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(b, off)
	return b[:n]
}

// seedLog begins e's log with t's boot log and a note of the daemon's
// saying where the sandbox came from: its own console starts at its
// restore, and a user reading its log should still see how its
// session came up.
func (m *Manager) seedLog(e *entry, t *tmpl) {
	tail := m.tailOf(e)
	now := m.cfg.Clock.Now()
	tail.mu.Lock()
	defer tail.mu.Unlock()
	if len(t.bootLog) > 0 {
		tail.ring.Write(t.bootLog, now, t.bootedAt)
		tail.ring.Flush(now, t.bootedAt)
	}
	tail.ring.Note(consolelog.LevelInfo, now, "started from the boot template %s, booted at %s: the lines before this one are that boot's", t.key, t.bootedAt.UTC().Format(time.RFC3339))
}
