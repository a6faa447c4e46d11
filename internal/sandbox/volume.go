package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Volume is the API view of a volume (API.md "Volumes"): a persistent
// disk of one API key that outlives the sandboxes it is attached to.
type Volume struct {
	Name      string    `json:"name"`
	SizeMB    int       `json:"size_mb"`
	CreatedAt time.Time `json:"created_at"`
	// AttachedTo is the sandbox that holds the volume now, if any.
	AttachedTo string `json:"attached_to,omitempty"`
	// UsedMB is the host disk the volume's sparse file takes now.
	UsedMB int `json:"used_mb"`
}

// VolumeMount is one volume of a create: the volume's name and where the
// sandbox sees it.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Limits of volumes.
const (
	MaxVolumeName       = 63
	MinVolumeMB         = 16
	MaxVolumesPerCreate = 8
	// DefaultMaxVolumeMB and DefaultMaxVolumesPerOwner are Config's
	// defaults.
	DefaultMaxVolumeMB        = 100 << 10
	DefaultMaxVolumesPerOwner = 32
)

var volumeName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// reservedPaths are where a volume may not go: what the box itself
// mounts or the agent lives in, and the root.
var reservedPaths = []string{"/proc", "/sys", "/dev", "/run/cubicle", "/tmp", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64"}

// CheckVolumeName checks a volume name (field is the request member
// named in the error).
func CheckVolumeName(field, name string) error {
	if name == "" || len(name) > MaxVolumeName || !volumeName.MatchString(name) || strings.Contains(name, "..") {
		return fieldErr(field, " %q is not a valid volume name: 1 to %d of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", truncate(name, MaxVolumeName), MaxVolumeName)
	}
	return nil
}

// checkVolumeMounts checks a create's "volumes".
func checkVolumeMounts(vs []VolumeMount) error {
	if len(vs) > MaxVolumesPerCreate {
		return fieldErr("volumes", " has %d entries; at most %d", len(vs), MaxVolumesPerCreate)
	}
	names, paths := map[string]bool{}, map[string]bool{}
	for i, v := range vs {
		if err := CheckVolumeName(fmt.Sprintf("volumes[%d].name", i), v.Name); err != nil {
			return err
		}
		p := v.Path
		if len(p) > 256 || !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" || strings.ContainsAny(p, "\x00\n") {
			return fieldErr(fmt.Sprintf("volumes[%d].path", i), " %q must be an absolute, clean path other than /", truncate(p, 64))
		}
		for _, r := range reservedPaths {
			if p == r || strings.HasPrefix(p, r+"/") {
				return fieldErr(fmt.Sprintf("volumes[%d].path", i), " %q is under %s, which the sandbox needs for itself", p, r)
			}
		}
		if names[v.Name] {
			return fieldErr("volumes", " names %q twice", v.Name)
		}
		for q := range paths {
			if q == p || strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/") {
				return fieldErr("volumes", " mounts %q and %q, one inside the other", q, p)
			}
		}
		names[v.Name], paths[p] = true, true
	}
	return nil
}

// volume is the manager's record of one volume.
type volume struct {
	Owner      string
	Name       string
	SizeMB     int
	CreatedAt  time.Time
	AttachedTo string
	creating   bool // its file is being made; not stored
}

func volumeKey(owner, name string) string { return owner + "\x00" + name }

// view is the API view of v; file is its filesystem image, whose blocks
// say how much host disk it takes.
func (v *volume) view(file string) Volume {
	out := Volume{Name: v.Name, SizeMB: v.SizeMB, CreatedAt: v.CreatedAt, AttachedTo: v.AttachedTo}
	var st syscall.Stat_t
	if syscall.Stat(file, &st) == nil {
		out.UsedMB = int((st.Blocks*512 + 1<<20 - 1) >> 20)
	}
	return out
}

// volumeFile is where a volume's filesystem image lives: DATADIR/volumes/
// OWNER/NAME.ext4 (OWNER is a key digest, "_" without keys).
func (m *Manager) volumeFile(owner, name string) string {
	if owner == "" {
		owner = "_"
	}
	return filepath.Join(m.cfg.DataDir, "volumes", owner, name+".ext4")
}

// CreateVolume makes an empty volume of sizeMB for owner. The file is
// sparse: it takes host disk only as sandboxes write to it.
func (m *Manager) CreateVolume(ctx context.Context, owner, name string, sizeMB int) (Volume, error) {
	if err := CheckVolumeName("name", name); err != nil {
		return Volume{}, err
	}
	if sizeMB < MinVolumeMB || sizeMB > m.cfg.MaxVolumeMB {
		return Volume{}, fieldErr("size_mb", " must be %d..%d, not %d", MinVolumeMB, m.cfg.MaxVolumeMB, sizeMB)
	}
	key := volumeKey(owner, name)
	v := &volume{Owner: owner, Name: name, SizeMB: sizeMB, CreatedAt: m.cfg.Clock.Now().UTC(), creating: true}
	m.mu.Lock()
	if _, ok := m.volumes[key]; ok {
		m.mu.Unlock()
		return Volume{}, errdefs.Conflict("volume %s already exists", name)
	}
	n := 0
	for _, o := range m.volumes {
		if o.Owner == owner {
			n++
		}
	}
	if n >= m.cfg.MaxVolumesPerOwner {
		m.mu.Unlock()
		return Volume{}, errdefs.New(errdefs.ErrQuota, "this API key already has %d volumes, its limit", n)
	}
	m.volumes[key] = v
	m.mu.Unlock()

	file := m.volumeFile(owner, name)
	err := makeVolumeFile(ctx, file, sizeMB)
	if err == nil {
		c := *v
		c.creating = false
		err = m.store.putVolume(&c)
	}
	if err != nil {
		os.Remove(file)
		m.mu.Lock()
		delete(m.volumes, key)
		m.mu.Unlock()
		if errors.Is(err, syscall.ENOSPC) || diskFull(m.cfg.DataDir) {
			return Volume{}, errFull
		}
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v.creating = false
	m.log.Info("volume created", "volume", name, "size_mb", sizeMB)
	return v.view(m.volumeFile(v.Owner, v.Name)), nil
}

// makeVolumeFile makes a sparse file of sizeMB holding an empty ext4
// filesystem. Unlike a box's layer, a volume keeps its journal: it
// outlives boxes and must come through a host crash.
func makeVolumeFile(ctx context.Context, file string, sizeMB int) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(sizeMB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ListVolumes returns owner's volumes by name.
func (m *Manager) ListVolumes(ctx context.Context, owner string) []Volume {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Volume
	for _, v := range m.volumes {
		if v.Owner == owner && !v.creating {
			out = append(out, v.view(m.volumeFile(v.Owner, v.Name)))
		}
	}
	slices.SortFunc(out, func(a, b Volume) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// GetVolume returns one of owner's volumes; another key's is not found.
func (m *Manager) GetVolume(ctx context.Context, owner, name string) (Volume, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.volumes[volumeKey(owner, name)]
	if !ok || v.creating {
		return Volume{}, errdefs.NotFound("volume %s not found", name)
	}
	return v.view(m.volumeFile(v.Owner, v.Name)), nil
}

// DeleteVolume removes one of owner's volumes and its data. A volume a
// sandbox holds is refused.
func (m *Manager) DeleteVolume(ctx context.Context, owner, name string) error {
	key := volumeKey(owner, name)
	m.mu.Lock()
	v, ok := m.volumes[key]
	switch {
	case !ok || v.creating:
		m.mu.Unlock()
		return errdefs.NotFound("volume %s not found", name)
	case v.AttachedTo != "":
		m.mu.Unlock()
		return errdefs.Conflict("volume %s is attached to sandbox %s; destroy the sandbox first", name, v.AttachedTo)
	}
	v.creating = true // hidden, and not attachable, while it goes
	m.mu.Unlock()
	err := m.store.deleteVolume(owner, name)
	if err == nil {
		err = os.Remove(m.volumeFile(owner, name))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		v.creating = false
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	delete(m.volumes, key)
	m.log.Info("volume deleted", "volume", name)
	return nil
}

// attachVolumesLocked gives sandbox id the volumes its create names, all
// or none: each must be owner's, exist and be free. It returns what the
// driver needs; the caller persists the volumes.
func (m *Manager) attachVolumesLocked(id, owner string, mounts []VolumeMount) ([]driver.Volume, []*volume, error) {
	var (
		out  []driver.Volume
		took []*volume
	)
	for _, vm := range mounts {
		v, ok := m.volumes[volumeKey(owner, vm.Name)]
		if !ok || v.creating {
			return nil, nil, errdefs.NotFound("volume %s not found", vm.Name)
		}
		if v.AttachedTo != "" {
			return nil, nil, errdefs.Conflict("volume %s is attached to sandbox %s; a volume is attached to one sandbox at a time", vm.Name, v.AttachedTo)
		}
		out = append(out, driver.Volume{Name: vm.Name, File: m.volumeFile(owner, vm.Name), Path: vm.Path})
		took = append(took, v)
	}
	for _, v := range took {
		v.AttachedTo = id
	}
	return out, took, nil
}

// releaseVolumes frees the volumes sandbox id holds: its box is gone, so
// nothing has them mounted.
func (m *Manager) releaseVolumes(id string) {
	m.mu.Lock()
	var freed []*volume
	for _, v := range m.volumes {
		if v.AttachedTo == id {
			v.AttachedTo = ""
			c := *v
			freed = append(freed, &c)
		}
	}
	m.mu.Unlock()
	for _, v := range freed {
		if err := m.store.putVolume(v); err != nil {
			m.log.Warn("persist released volume", "volume", v.Name, "err", err)
		}
	}
}

// holdsVolumesLocked reports whether an entry's box may still have its
// volumes mounted: it is live, or its teardown failed and is retried.
func holdsVolumesLocked(e *entry) bool {
	return e.rec.Sandbox.State.holdsSlot() || e.rec.Sandbox.State == StatePaused || e.stopFailed
}

// reconcileVolumes frees every volume whose holder is gone or holds
// nothing any more; recovery runs it once the entries are known.
func (m *Manager) reconcileVolumes() {
	m.mu.Lock()
	var gone []string
	for _, v := range m.volumes {
		if v.AttachedTo == "" {
			continue
		}
		if e, ok := m.entries[v.AttachedTo]; !ok || !holdsVolumesLocked(e) {
			gone = append(gone, v.AttachedTo)
		}
	}
	m.mu.Unlock()
	for _, id := range gone {
		m.releaseVolumes(id)
	}
}

// sweepVolumeFiles removes the files under DATADIR/volumes that no
// volume record names: what a daemon killed while it made or deleted a
// volume left. It runs at start, before any create.
func (m *Manager) sweepVolumeFiles() {
	files, _ := filepath.Glob(filepath.Join(m.cfg.DataDir, "volumes", "*", "*"))
	known := make(map[string]bool, len(m.volumes))
	for _, v := range m.volumes {
		known[m.volumeFile(v.Owner, v.Name)] = true
	}
	for _, f := range files {
		if known[f] {
			continue
		}
		if err := os.Remove(f); err != nil {
			m.log.Warn("remove orphan volume file", "file", f, "err", err)
			continue
		}
		m.log.Info("removed a volume file no volume names", "file", f)
	}
}
