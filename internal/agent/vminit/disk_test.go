package vminit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// fakeDisk is one virtio-blk disk as the guest kernel shows it: the
// serial file in /sys/block/NAME (what the VMM answered to the device-ID
// request) and the device's contents at /dev/NAME.
type fakeDisk struct {
	name, serial string
	content      []byte
}

// diskTree lays disks out under a fake /sys and /dev and returns the
// finder for them.
func diskTree(t *testing.T, disks []fakeDisk) diskFinder {
	t.Helper()
	root := t.TempDir()
	f := diskFinder{sys: filepath.Join(root, "sys"), dev: filepath.Join(root, "dev")}
	for _, d := range disks {
		blk := filepath.Join(f.sys, "block", d.name)
		if err := os.MkdirAll(blk, 0o755); err != nil {
			t.Fatal(err)
		}
		// The kernel prints the ID up to its first NUL, with a newline.
		if err := os.WriteFile(filepath.Join(blk, "serial"), []byte(d.serial+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(f.dev, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(f.dev, d.name), d.content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// ext4Image returns an ext4 file system labelled label, made by
// mkfs.ext4 as internal/image makes a VM's disk (mkfs.ext4 -L).
func ext4Image(t *testing.T, label string) []byte {
	t.Helper()
	needs.Command(t, "mkfs.ext4")
	p := filepath.Join(t.TempDir(), "disk.ext4")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 8<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", label, p).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b[:64<<10] // the superblock is at 1024; the rest does not matter here
}

// firecrackerID is the ID Firecracker answers the virtio-blk GET_ID
// request with: the decimal st_dev, st_rdev and st_ino of the drive's
// backing file, concatenated (kvmtool's scheme), truncated to the 20 bytes
// of VIRTIO_BLK_ID_BYTES — never the drive_id of PUT /drives.
func firecrackerID(dev, rdev, ino uint64) string {
	s := strings.Join([]string{u(dev), u(rdev), u(ino)}, "")
	if len(s) > 20 {
		s = s[:20]
	}
	return s
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

// TestFindDisks checks that the guest finds its root and config disks
// under both VMMs: under QEMU by the serials the driver sets, under
// Firecracker — which sets no serial and answers the device-ID request
// with an ID of its own making — by what is on them.
func TestFindDisks(t *testing.T) {
	root := ext4Image(t, RootLabel)
	other := ext4Image(t, "data")
	cfg, err := EncodeConfig(Config{Token: "feedface", Hostname: "cubicle-x"})
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox's environment can make the config span many blocks.
	bigCfg, err := EncodeConfig(Config{Token: "feedface", Env: map[string]string{"BIG": strings.Repeat("x", 3*headSize)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name              string
		disks             []fakeDisk
		wantRoot, wantCfg string // device names; "" = not found
	}{
		{"firecracker: generated IDs", []fakeDisk{
			{"vda", firecrackerID(66306, 0, 1835017), root},
			{"vdb", firecrackerID(66306, 0, 1835019), cfg},
		}, "vda", "vdb"},
		{"firecracker: config drive first", []fakeDisk{
			{"vda", firecrackerID(2049, 0, 12), cfg},
			{"vdb", firecrackerID(2049, 0, 13), root},
		}, "vdb", "vda"},
		{"firecracker: long IDs truncated to 20 bytes", []fakeDisk{
			{"vda", firecrackerID(18446744073709551, 0, 18446744073709551615), root},
			{"vdb", firecrackerID(18446744073709551, 0, 18446744073709551614), cfg},
		}, "vda", "vdb"},
		{"firecracker: a config of several blocks", []fakeDisk{
			{"vda", firecrackerID(2049, 0, 12), root},
			{"vdb", firecrackerID(2049, 0, 13), bigCfg},
		}, "vda", "vdb"},
		{"qemu: serials", []fakeDisk{
			{"vda", RootSerial, root},
			{"vdb", ConfigSerial, cfg},
		}, "vda", "vdb"},
		{"qemu: the serial decides over the contents", []fakeDisk{
			{"vda", ConfigSerial, cfg},
			{"vdb", RootSerial, root},
			{"vdc", "", root},
		}, "vdb", "vda"},
		{"no serials at all", []fakeDisk{
			{"vda", "", root},
			{"vdb", "", cfg},
		}, "vda", "vdb"},
		{"an ext4 that is not cubicle's root", []fakeDisk{
			{"vda", firecrackerID(1, 0, 2), other},
			{"vdb", firecrackerID(1, 0, 3), cfg},
		}, "", "vdb"},
		{"a raw disk that is not a config", []fakeDisk{
			{"vda", firecrackerID(1, 0, 2), root},
			{"vdb", firecrackerID(1, 0, 3), []byte(`{"token":""}`)},
		}, "vda", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := diskTree(t, tc.disks)
			for _, k := range []struct {
				kind diskKind
				want string
			}{{rootDisk, tc.wantRoot}, {configDisk, tc.wantCfg}} {
				got, err := f.wait(k.kind, 300*time.Millisecond)
				if k.want == "" {
					if err == nil {
						t.Errorf("disk %v: found %s, want none", k.kind, got)
					}
					continue
				}
				if err != nil {
					t.Errorf("disk %v: %v, want %s", k.kind, err, k.want)
				} else if want := filepath.Join(f.dev, k.want); got != want {
					t.Errorf("disk %v: %s, want %s", k.kind, got, want)
				}
			}
		})
	}
}

// TestFindDisksWaits: a disk whose driver probes it late is still found.
func TestFindDisksWaits(t *testing.T) {
	f := diskTree(t, nil)
	root := ext4Image(t, RootLabel)
	go func() {
		time.Sleep(200 * time.Millisecond)
		blk := filepath.Join(f.sys, "block", "vda")
		os.MkdirAll(blk, 0o755)
		os.MkdirAll(f.dev, 0o755)
		os.WriteFile(filepath.Join(f.dev, "vda"), root, 0o644)
		os.WriteFile(filepath.Join(blk, "serial"), []byte(firecrackerID(2049, 0, 7)+"\n"), 0o444)
	}()
	got, err := f.wait(rootDisk, 10*time.Second)
	if want := filepath.Join(f.dev, "vda"); err != nil || got != want {
		t.Fatalf("wait = %q, %v; want %s", got, err, want)
	}
}

// TestFindDisksSaysWhatItSaw: when a disk is missing, the error (which the
// guest prints on its console before it powers off) names every disk and
// what was on it.
func TestFindDisksSaysWhatItSaw(t *testing.T) {
	f := diskTree(t, []fakeDisk{
		{"vda", firecrackerID(1, 0, 2), ext4Image(t, "data")},
		{"vdb", ConfigSerial, nil},
	})
	_, err := f.wait(rootDisk, 50*time.Millisecond)
	if err == nil {
		t.Fatal("found a root disk among none")
	}
	for _, w := range []string{"root disk", `vda serial "102"`, `ext4 labelled "data"`, `vdb serial "cubicle-config"`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}
