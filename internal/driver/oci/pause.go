package oci

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/hostfile"
	"github.com/cubicle-dev/cubicle/internal/procwatch"
)

// Pause and resume of gVisor boxes are runsc checkpoint and restore: the
// sandbox's whole kernel state (processes, memory, its network stack)
// goes to DIR/checkpoint and the sandbox ends; restore starts it again
// from the image in the same bundle, on the same rootfs, upper layer and
// volumes, which stay mounted while it is paused (they hold no CPU or
// memory, and a restore needs them exactly as they were). The sandbox is
// frozen (runsc pause) and saved with --leave-running, and ended only
// once the image is whole: a checkpoint that fails leaves it running as
// it was (TestPauseFailureLeavesTheBoxRunning), where a plain checkpoint
// ends the sandbox whether it succeeds or not.
//
// runsc cannot save a host socket, and the agent's channel is one
// (--host-uds): a checkpoint that meets one fails (under Debian's runsc
// of 2022 it also stopped the box). So the agent lets go of it first (agent.HostListener): the driver asks
// it (agentclient.PrepareCheckpoint), and after a restore (or a
// checkpoint that failed) sends the agent SIGUSR2 to listen again. While
// the agent has let go, runsc's gofer, which made the host socket, still
// holds it and accepts a connection to it — which the sandbox then holds,
// and the checkpoint fails on. So the socket file is moved aside first:
// no daemon connection can reach the box from then until it listens
// again (at the old path; the agent makes a new socket there).
//
// runc boxes would pause with CRIU (runc checkpoint); CanPause says
// why they do not (criu.go).
const checkpointDir = "checkpoint"

var _ driver.Pauser = (*Driver)(nil)

// CanPause returns nil for gVisor, and why not for runc.
func (d *Driver) CanPause(ctx context.Context) error {
	if !d.isRunsc() {
		return d.criu.check(ctx)
	}
	return nil
}

// token is the agent token of a box: the agent reads it from its
// environment, which the bundle's config.json holds (0600, like the rest
// of the box directory).
func (b *box) token() (string, error) {
	raw, err := os.ReadFile(filepath.Join(b.data.Dir, "bundle", "config.json"))
	if err != nil {
		return "", err
	}
	var sp struct {
		Process struct {
			Env []string `json:"env"`
		} `json:"process"`
	}
	if err := json.Unmarshal(raw, &sp); err != nil {
		return "", err
	}
	for _, kv := range sp.Process.Env {
		if v, ok := strings.CutPrefix(kv, "CUBICLE_AGENT_TOKEN="); ok {
			return v, nil
		}
	}
	return "", errors.New("the bundle names no agent token")
}

func (b *box) socketPath() string { return filepath.Join(b.data.Dir, "run", "agent.sock") }

// Pause checkpoints a gVisor box to DIR/checkpoint and ends it.
func (d *Driver) Pause(ctx context.Context, db driver.Box) (driver.Paused, error) {
	if err := d.CanPause(ctx); err != nil {
		return driver.Paused{}, err
	}
	b := d.boxOf(db)
	if b == nil {
		return driver.Paused{}, errors.New("pause: not a running box of this driver")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	id, dir := b.data.ID, b.data.Dir
	if b.stopped || isClosed(b.dead) {
		return driver.Paused{}, fmt.Errorf("pause %s: the box is not running", id)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	img := filepath.Join(dir, checkpointDir)
	if err := d.save(ctx, b, img); err != nil {
		return driver.Paused{}, fmt.Errorf("pause %s: %w", id, err)
	}
	aside := b.socketPath() + asideSuffix
	thaw := func(cause error) (driver.Paused, error) {
		return driver.Paused{}, fmt.Errorf("pause %s: %w", id, d.thaw(ctx, b, img, cause))
	}
	// Saved: end the frozen sandbox and delete what the runtime keeps of
	// it (its processes, state and cgroups), and nothing of the box; on
	// a context of its own, as a long checkpoint may have used up the
	// pause's. A delete that fails with the box still there leaves it
	// running on (the pause failed); one that ended the box, its image
	// whole, is a pause (Resume deletes what the runtime kept first).
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := d.deleteContainer(ectx, id); err != nil && !isClosed(b.dead) && alive(b.data.Pid) {
		return thaw(d.unfreezeIfFrozen(b, fmt.Errorf("delete the checkpointed container: %w", err)))
	}
	select {
	case <-b.dead:
	case <-time.After(10 * time.Second):
	}
	if alive(b.data.Pid) {
		return driver.Paused{}, fmt.Errorf("pause %s: sandbox pid %d still alive after the checkpoint and its delete", id, b.data.Pid)
	}
	os.Remove(aside)
	b.stopWatch()
	b.stopped = true // the directory is the paused box's now: Stop must not remove it
	data := b.data
	data.Paused, data.Pid = true, 0
	return driver.Paused{State: stateOf(d, data), Bytes: pausedBytes(dir)}, nil
}

// save checkpoints the running gVisor box b into img, a directory it
// makes, and leaves b frozen, its agent no longer listening: the caller
// ends it (a pause) or thaws it (a copy). On error b runs on as before,
// its agent listening again, and img is gone.
func (d *Driver) save(ctx context.Context, b *box, img string) error {
	token, err := b.token()
	if err != nil {
		return err
	}
	if err := os.RemoveAll(img); err != nil {
		return err
	}
	aside := b.socketPath() + asideSuffix
	if err := os.Rename(b.socketPath(), aside); err != nil {
		return err
	}
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", aside)
	}, token)
	err = c.PrepareCheckpoint(ctx)
	c.Close()
	if err != nil {
		return d.thaw(ctx, b, img, err)
	}
	// The agent closed its listener and every connection before the
	// answer's connection closed; the sandbox lets go of its ends of
	// those on its own time (hostconn.go).
	if err := b.waitLetGo(ctx, 10*time.Second); errors.Is(err, errCannotWatch) {
		time.Sleep(500 * time.Millisecond) // cannot watch: give it time
	} else if err != nil {
		return d.thaw(ctx, b, img, fmt.Errorf("%w: %v; the box runs on", driver.ErrNotPausableNow, err))
	}
	if err := os.Mkdir(img, 0o700); err != nil {
		return d.thaw(ctx, b, img, err)
	}
	// Frozen first, then saved with --leave-running: a checkpoint that
	// fails (a full disk, a kill of runsc, a fault of its own) then
	// leaves the sandbox as it was, instead of ending it as a plain
	// checkpoint does either way; and the sandbox cannot run between the
	// save and its end, so the disk holds nothing the saved memory does
	// not know of. The save's own pause of the kernel nests inside ours
	// (gVisor counts them), so the box stays frozen after it.
	if _, err := d.output(ctx, "pause", b.data.ID); err != nil {
		// A runsc pause killed midway may have frozen the box all the
		// same.
		return d.thaw(ctx, b, img, d.unfreezeIfFrozen(b, err))
	}
	if _, err := d.output(ctx, "checkpoint", "--leave-running", "--image-path", img, b.data.ID); err != nil {
		return d.thaw(ctx, b, img, d.unfreeze(b, err))
	}
	return nil
}

// thaw makes the agent of box b listen again after a save that failed
// with cause, or that b outlives (cause nil), and answers cause (with
// what failed here too). img is removed, unless it is "" (a save that
// is kept). It has a context of its own: the save's ending may be what
// failed it, and a box whose agent does not listen is one nobody
// reaches.
func (d *Driver) thaw(ctx context.Context, b *box, img string, cause error) error {
	if img != "" {
		os.RemoveAll(img)
	}
	if isClosed(b.dead) {
		os.Remove(b.socketPath() + asideSuffix)
		return fmt.Errorf("%w (the box ended)", cause)
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := d.relisten(tctx, b); err != nil {
		if cause == nil {
			return fmt.Errorf("agent after the copy: %w", err)
		}
		cause = errors.Join(cause, fmt.Errorf("agent after a failed pause: %w", err))
	}
	return cause
}

// unfreeze resumes box b after a checkpoint that failed with cause, and
// answers cause (with the resume's error too, when it failed). It runs
// even when the pause's ctx has ended, on a context of its own, and asks
// up to three times: a frozen box serves nobody.
func (d *Driver) unfreeze(b *box, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	for range 3 {
		if _, err = d.output(ctx, "resume", b.data.ID); err == nil {
			return cause
		}
		if cs, serr := d.state(ctx, b.data.ID); serr == nil && cs.Status != "paused" {
			return cause // it runs (or is gone): nothing to resume
		}
		time.Sleep(time.Second)
	}
	return errors.Join(cause, fmt.Errorf("resume the box the failed checkpoint left frozen: %w", err))
}

// unfreezeIfFrozen is unfreeze when the runtime says b is frozen, and
// cause alone otherwise.
func (d *Driver) unfreezeIfFrozen(b *box, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if cs, err := d.state(ctx, b.data.ID); err == nil && cs.Status == "paused" {
		return d.unfreeze(b, cause)
	}
	return cause
}

// waitServing waits until the agent answers GET /health on its socket
// (each try bounded by a second), the box dies, or ctx ends. After a
// pause the socket file accepting a connection says nothing: runsc's
// gofer holds a copy of the host socket the agent let go of, and
// accepts on it though nobody serves.
func (b *box) waitServing(ctx context.Context) error {
	var last error
	for {
		last = b.health(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not serving: %w (last: %v)", ctx.Err(), last)
		case <-b.dead:
			return fmt.Errorf("box ended before its agent served again (last: %v)", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// health sends one GET /health and reads the status line.
func (b *box) health(ctx context.Context) error {
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := dialAgent(hctx, b.data.Dir)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := hctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "HTTP/1.1 2") {
		return fmt.Errorf("agent health: %q", strings.TrimSpace(line))
	}
	return nil
}

// asideSuffix names the agent's socket file while a pause has moved it
// aside.
const asideSuffix = ".pausing"

// relisten makes the agent of box b listen on its socket's path again
// and waits until it answers. The host frees the path first (the socket
// file, or the one a pause moved aside): what is there may be the copy
// of the old socket that runsc's gofer holds, which accepts connections
// and serves nobody. Then SIGUSR2 (agent.ReopenSignal, to the box's
// init) has the agent bind a new one there, whether it had let go of
// the old one or not.
func (d *Driver) relisten(ctx context.Context, b *box) error {
	sock := b.socketPath()
	os.Remove(sock)
	os.Remove(sock + asideSuffix)
	if _, err := d.output(ctx, "kill", b.data.ID, "USR2"); err != nil {
		return err
	}
	return b.waitServing(ctx)
}

// Resume restores a paused gVisor box from its checkpoint.
func (d *Driver) Resume(ctx context.Context, p driver.Paused) (_ driver.Box, err error) {
	if err := d.CanPause(ctx); err != nil {
		return nil, err
	}
	data, err := d.decode(p.State)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	id, dir := data.ID, data.Dir
	if !data.Paused {
		return nil, fmt.Errorf("resume %s: the state is not of a paused box", id)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	img := filepath.Join(dir, checkpointDir)
	sock := filepath.Join(dir, "run", "agent.sock")
	nd := data
	nd.Paused = false
	// A resume a killed daemon left may have restored the box already:
	// then it is the box (its checkpoint is behind its disk now).
	if cs, v, _ := d.probe(ctx, id); v == verdictRunning {
		nd.Pid = cs.Pid
		b := newBox(d, nd)
		if err := d.relisten(ctx, b); err != nil {
			b.stopWatch()
			return nil, fmt.Errorf("resume %s: the box an earlier resume restored: %w", id, err)
		}
		os.RemoveAll(img)
		return b, nil
	}
	if _, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil {
		return nil, fmt.Errorf("resume %s: no checkpoint: %w", id, err)
	}
	if err := d.deleteContainer(ctx, id); err != nil { // what a failed restore left
		return nil, fmt.Errorf("resume %s: %w", id, err)
	}
	os.Remove(sock)
	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer console.Close()
	pidFile := filepath.Join(dir, "pid")
	os.Remove(pidFile)
	ran := false // the restored box ran: its checkpoint is behind its disk
	defer func() {
		if err == nil {
			return
		}
		_ = d.deleteContainer(context.WithoutCancel(ctx), id)
		if ran {
			os.RemoveAll(img)
			err = fmt.Errorf("%w: %w", driver.ErrResumeLost, err)
			return
		}
		err = fmt.Errorf("resume %s: %w\n%s", id, err, hostfile.Tail(filepath.Join(dir, "console.log"), 10))
	}()
	if data.Netns != "" && data.Addr != "" {
		addr, perr := netip.ParsePrefix(data.Addr)
		if perr != nil {
			return nil, fmt.Errorf("resume %s: address %q: %w", id, data.Addr, perr)
		}
		gw, _ := netip.ParseAddr(data.Gateway) // none: no default route
		if err := readdress(data.Netns, addr, gw); err != nil {
			return nil, fmt.Errorf("resume %s: %w", id, err)
		}
	}
	rctx, cancelRun := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancelRun()
	cmd := d.commandNet(rctx, data.Netns, "restore", "--detach", "--image-path", img, "--pid-file", pidFile, "--bundle", filepath.Join(dir, "bundle"), id)
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s restore: %w", d.cfg.Runtime, err)
	}
	ran = true
	pid, err := hostfile.ReadPid(pidFile)
	if err != nil {
		return nil, err
	}
	nd.Pid = pid
	b := newBox(d, nd)
	if err := d.relisten(ctx, b); err != nil {
		b.stopWatch()
		return nil, err
	}
	os.RemoveAll(img)
	return b, nil
}

// Discard removes a paused box: what the runtime may still hold of it,
// its mounts and its directory.
func (d *Driver) Discard(ctx context.Context, p driver.Paused) error {
	data, err := d.decode(p.State)
	if err != nil {
		return fmt.Errorf("discard: %w", err)
	}
	return deadBox(d, data).Stop(ctx)
}

// decode checks a State and returns its box data.
func (d *Driver) decode(st driver.State) (boxData, error) {
	var data boxData
	if st.Driver != d.Name() {
		return data, fmt.Errorf("state is for driver %q, not %q", st.Driver, d.Name())
	}
	if st.Version != stateVersion {
		return data, fmt.Errorf("unknown state version %d", st.Version)
	}
	if err := json.Unmarshal(st.Data, &data); err != nil {
		return data, err
	}
	if err := validID(data.ID); err != nil {
		return data, err
	}
	if data.Dir != d.boxDir(data.ID) {
		return data, fmt.Errorf("%s: directory %q is not under %s", data.ID, data.Dir, d.cfg.StateDir)
	}
	return data, nil
}

// stateOf is the versioned State of data.
func stateOf(d *Driver, data boxData) driver.State {
	raw, _ := json.Marshal(data) // plain struct: cannot fail
	return driver.State{Version: stateVersion, Driver: d.Name(), Data: raw}
}

// pausedBytes is what a paused box takes on the host's disk: its
// checkpoint, and its upper layer (the sparse disk file, or the
// directory when the root is unbounded). The image and the volumes are
// not the box's.
func pausedBytes(dir string) int64 {
	n := treeBytes(filepath.Join(dir, checkpointDir))
	if fileBytes(filepath.Join(dir, "disk.ext4")) > 0 {
		return n + fileBytes(filepath.Join(dir, "disk.ext4"))
	}
	return n + treeBytes(filepath.Join(dir, "layer", "upper"))
}

func fileBytes(path string) int64 {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

func treeBytes(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			n += fileBytes(path)
		}
		return nil
	})
	return n
}

// Settle decides a pause a killed daemon left. Its runsc checkpoint runs
// on without the daemon, so it is waited for first. A box that is still
// there, frozen or not, runs on: whether its checkpoint was complete
// cannot be told once the process that said so is gone, and the box is
// whole; it is resumed, its image removed, and its agent (which may have
// let go of its socket) told to listen again. A box that is gone, with a
// checkpoint image there, is paused (a pause that got as far as ending
// it); one without is gone.
func (d *Driver) Settle(ctx context.Context, st driver.State) (driver.Box, *driver.Paused, error) {
	data, err := d.decode(st)
	if err != nil {
		return nil, nil, fmt.Errorf("settle: %w", err)
	}
	if !d.isRunsc() || data.Paused {
		b, err := d.Adopt(ctx, st)
		return b, nil, err
	}
	img := filepath.Join(data.Dir, checkpointDir)
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ps, _ := procwatch.FindOwn(func(argv []string) bool {
			return slices.Contains(argv, "checkpoint") && slices.Contains(argv, img)
		})
		if len(ps) == 0 {
			break
		}
	}
	sock := filepath.Join(data.Dir, "run", "agent.sock")
	cs, v, _ := d.probe(ctx, data.ID)
	resumed := false
	if v != verdictRunning && cs.Status == "paused" && cs.Pid > 0 {
		// Frozen for its checkpoint when the daemon died.
		_, rerr := d.output(ctx, "resume", data.ID)
		resumed = rerr == nil
		cs, v, _ = d.probe(ctx, data.ID)
		if rerr != nil && cs.Status == "paused" {
			return nil, nil, fmt.Errorf("settle %s: resume the frozen box: %w", data.ID, rerr)
		}
		// A resume that failed because the box just went (a delete the
		// dead daemon started) falls through to its image below.
	}
	if v != verdictRunning && resumed {
		// It ran after its image was taken: never a pause now.
		return nil, nil, fmt.Errorf("settle %s: resumed the frozen box, but the runtime does not say it runs (%q)", data.ID, cs.Status)
	}
	if v == verdictRunning {
		os.RemoveAll(img)
		data.Pid = cs.Pid
		b := newBox(d, data)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := d.relisten(sctx, b); err != nil {
			b.stopWatch()
			return nil, nil, fmt.Errorf("settle %s: %w", data.ID, err)
		}
		return b, nil, nil
	}
	if fi, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil || fi.Size() == 0 {
		return nil, nil, nil
	}
	if err := d.deleteContainer(ctx, data.ID); err != nil {
		return nil, nil, fmt.Errorf("settle %s: delete the checkpointed container: %w", data.ID, err)
	}
	os.Remove(sock)
	os.Remove(sock + asideSuffix)
	data.Paused, data.Pid = true, 0
	return nil, &driver.Paused{State: stateOf(d, data), Bytes: pausedBytes(data.Dir)}, nil
}
