package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestVolumes checks volumes through the manager: creating them (a real
// mkfs.ext4 on a sparse file), refusing bad and duplicate ones and those
// beyond the key's quota, attaching one to one sandbox at a time, keeping
// other keys out, and freeing a volume when its sandbox ends, fails or did
// not survive a restart.
func TestVolumes(t *testing.T) {
	needs.Command(t, "mkfs.ext4")
	d := newFakeDriver(t)
	dir := t.TempDir()
	m := newTestManager(t, d, dir, wallClock{})
	m.cfg.MaxSandboxes = 8
	m.cfg.MaxVolumesPerOwner = 2
	ctx := context.Background()
	const alice, bob = "key-alice", "key-bob"

	for _, tt := range []struct {
		name string
		size int
		kind error
	}{
		{"", 64, errdefs.ErrInvalid},
		{"Profile", 64, errdefs.ErrInvalid},
		{"../x", 64, errdefs.ErrInvalid},
		{strings.Repeat("a", 64), 64, errdefs.ErrInvalid},
		{"ok", 15, errdefs.ErrInvalid},
		{"ok", DefaultMaxVolumeMB + 1, errdefs.ErrInvalid},
	} {
		if _, err := m.CreateVolume(ctx, alice, tt.name, tt.size); !errors.Is(err, tt.kind) {
			t.Errorf("CreateVolume(%q, %d) = %v, want %v", tt.name, tt.size, err, tt.kind)
		}
	}
	if vs := m.ListVolumes(ctx, alice); len(vs) != 0 {
		t.Fatalf("bad creates made volumes: %+v", vs)
	}

	v, err := m.CreateVolume(ctx, alice, "profile", 1024)
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "profile" || v.SizeMB != 1024 || v.AttachedTo != "" || v.UsedMB <= 0 || v.UsedMB >= 64 {
		t.Errorf("created %+v; want 1024 MiB, free, a few MiB used on the host", v)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(m.volumeFile(alice, "profile"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 1024<<20 || st.Blocks*512 > 64<<20 {
		t.Errorf("volume file: size %d, %d bytes on disk; want 1 GiB, sparse", st.Size, st.Blocks*512)
	}
	if _, err := m.CreateVolume(ctx, alice, "profile", 64); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate: %v, want conflict", err)
	}
	if _, err := m.CreateVolume(ctx, alice, "second", 64); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateVolume(ctx, alice, "third", 64); !errors.Is(err, errdefs.ErrQuota) {
		t.Errorf("beyond the quota: %v, want quota", err)
	}
	if _, err := m.CreateVolume(ctx, bob, "profile", 64); err != nil {
		t.Errorf("bob's own volume of the same name: %v", err)
	}
	if _, err := m.GetVolume(ctx, bob, "second"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob gets alice's volume: %v, want not found", err)
	}
	if err := m.DeleteVolume(ctx, bob, "second"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob deletes alice's volume: %v, want not found", err)
	}

	mounts := []VolumeMount{{Name: "profile", Path: "/home/user"}}
	sb, err := m.Create(ctx, CreateRequest{Owner: alice, Volumes: mounts}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Volumes) != 1 || sb.Volumes[0] != mounts[0] {
		t.Errorf("sandbox volumes %+v", sb.Volumes)
	}
	d.mu.Lock()
	got := d.specs[sb.ID].Volumes
	d.mu.Unlock()
	if len(got) != 1 || got[0].File != m.volumeFile(alice, "profile") || got[0].Path != "/home/user" {
		t.Errorf("driver was given %+v", got)
	}
	if v, _ := m.GetVolume(ctx, alice, "profile"); v.AttachedTo != sb.ID {
		t.Errorf("attached to %q, want %s", v.AttachedTo, sb.ID)
	}

	// Refused, and nothing made: a busy volume, another key's, a missing
	// one, a backend that cannot attach.
	live, n := d.live(), len(m.List(ctx, Filter{}))
	for _, tt := range []struct {
		owner string
		vols  []VolumeMount
		kind  error
	}{
		{alice, mounts, errdefs.ErrConflict},
		{bob, []VolumeMount{{Name: "second", Path: "/data"}}, errdefs.ErrNotFound},
		{alice, []VolumeMount{{Name: "nope", Path: "/data"}}, errdefs.ErrNotFound},
		{alice, []VolumeMount{{Name: "second", Path: "/data"}, {Name: "profile", Path: "/home/user"}}, errdefs.ErrConflict},
	} {
		if _, err := m.Create(ctx, CreateRequest{Owner: tt.owner, Volumes: tt.vols}, true); !errors.Is(err, tt.kind) {
			t.Errorf("create with %+v as %s: %v, want %v", tt.vols, tt.owner, err, tt.kind)
		}
	}
	d.noVolumes = true
	if _, err := m.Create(ctx, CreateRequest{Owner: alice, Volumes: []VolumeMount{{Name: "second", Path: "/data"}}}, true); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("backend without volumes: %v, want not supported", err)
	}
	d.noVolumes = false
	if d.live() != live || len(m.List(ctx, Filter{})) != n {
		t.Errorf("refused creates left boxes or sandboxes: %d → %d boxes, %d → %d sandboxes", live, d.live(), n, len(m.List(ctx, Filter{})))
	}
	if v, _ := m.GetVolume(ctx, alice, "second"); v.AttachedTo != "" {
		t.Errorf("a refused create left %q attached to %s", v.Name, v.AttachedTo)
	}
	if err := m.DeleteVolume(ctx, alice, "profile"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete an attached volume: %v, want conflict", err)
	}

	// A failed create frees what it took.
	d.failErr = errors.New("boom")
	if _, err := m.Create(ctx, CreateRequest{Owner: alice, Volumes: []VolumeMount{{Name: "second", Path: "/data"}}}, true); err == nil {
		t.Fatal("create succeeded with a failing driver")
	}
	d.failErr = nil
	if v, _ := m.GetVolume(ctx, alice, "second"); v.AttachedTo != "" {
		t.Errorf("a failed create left the volume attached to %s", v.AttachedTo)
	}

	// Destroy ends the programs gracefully first (what a browser holds
	// reaches the volume), and frees the volume; a new sandbox takes it.
	plain, err := m.Create(ctx, CreateRequest{Owner: alice}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, plain.ID); err != nil {
		t.Fatal(err)
	}
	if n := d.shutdowns.Load(); n != 0 {
		t.Errorf("destroying a sandbox without volumes asked its agent to shut down (%d)", n)
	}
	if err := m.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if n := d.shutdowns.Load(); n != 1 {
		t.Errorf("destroying a sandbox with a volume: %d graceful shutdowns, want 1", n)
	}
	if v, _ := m.GetVolume(ctx, alice, "profile"); v.AttachedTo != "" {
		t.Errorf("after destroy, attached to %s", v.AttachedTo)
	}
	sb2, err := m.Create(ctx, CreateRequest{Owner: alice, Volumes: mounts}, true)
	if err != nil {
		t.Fatalf("attach after the holder's destroy: %v", err)
	}
	sb3, err := m.Create(ctx, CreateRequest{Owner: alice, Volumes: []VolumeMount{{Name: "second", Path: "/data"}}}, true)
	if err != nil {
		t.Fatal(err)
	}

	// Restart: volumes and attachments survive; the volume of a sandbox
	// that died meanwhile is free.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	dead := d.boxes[sb3.ID]
	delete(d.boxes, sb3.ID)
	d.mu.Unlock()
	dead.crash()
	// A file no volume names (a daemon killed while making one) goes.
	stray := m.volumeFile(alice, "half-made")
	if err := os.WriteFile(stray, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	m2 := newTestManager(t, d, dir, wallClock{})
	defer m2.Close()
	if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an orphan volume file after restart: %v, want removed", err)
	}
	for _, name := range []string{"profile", "second"} {
		if _, err := os.Stat(m2.volumeFile(alice, name)); err != nil {
			t.Errorf("volume %s's file after restart: %v", name, err)
		}
	}
	if vs := m2.ListVolumes(ctx, alice); len(vs) != 2 {
		t.Fatalf("after restart alice has %+v", vs)
	}
	if v, _ := m2.GetVolume(ctx, alice, "profile"); v.AttachedTo != sb2.ID {
		t.Errorf("after restart profile is attached to %q, want %s", v.AttachedTo, sb2.ID)
	}
	if v, _ := m2.GetVolume(ctx, alice, "second"); v.AttachedTo != "" {
		t.Errorf("after restart the dead sandbox still holds %q", v.Name)
	}
	if err := m2.DeleteVolume(ctx, alice, "second"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m2.volumeFile(alice, "second")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("deleted volume's file: %v", err)
	}
	if _, err := m2.GetVolume(ctx, alice, "second"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleted volume: %v", err)
	}
}

// FuzzVolumeMounts checks the rules of a create's "volumes" on any
// input: what is refused is a FieldError naming its field, and what is
// accepted has valid names and absolute, clean paths, none reserved,
// none inside another.
func FuzzVolumeMounts(f *testing.F) {
	f.Add("profile", "/home/user", "data", "/data")
	f.Add("v", "/proc/x", "v", "/")
	f.Add("../x", "home", "A", "/home/../etc")
	f.Add("a", "/a", "b", "/a/b")
	f.Fuzz(func(t *testing.T, n1, p1, n2, p2 string) {
		vs := []VolumeMount{{Name: n1, Path: p1}, {Name: n2, Path: p2}}
		err := checkVolumeMounts(vs)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" || !strings.HasPrefix(err.Error(), fe.Field) {
				t.Fatalf("error %#v is not a FieldError naming its field", err)
			}
			return
		}
		for _, v := range vs {
			if CheckVolumeName("name", v.Name) != nil || strings.Contains(v.Name, "/") {
				t.Fatalf("accepted the name %q", v.Name)
			}
			if !strings.HasPrefix(v.Path, "/") || filepath.Clean(v.Path) != v.Path || v.Path == "/" {
				t.Fatalf("accepted the path %q", v.Path)
			}
			for _, r := range reservedPaths {
				if v.Path == r || strings.HasPrefix(v.Path, r+"/") {
					t.Fatalf("accepted the reserved path %q", v.Path)
				}
			}
		}
		if p1 == p2 || strings.HasPrefix(p1, p2+"/") || strings.HasPrefix(p2, p1+"/") || n1 == n2 {
			t.Fatalf("accepted %+v: the same name, or one path inside the other", vs)
		}
	})
}
