package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/needs"
)

// fakeJailerScript is a FAKE jailer (no Firecracker or jailer can run
// here): it answers --version and otherwise runs --exec-file with the
// arguments after "--" in the directory the jailer would chroot into
// (BASE/NAME/ID/root) — no chroot, namespaces or change of user.
const fakeJailerScript = `#!/bin/sh
# FAKE jailer for tests.
if [ "$1" = --version ]; then echo "Jailer %s"; exit 0; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --id) id=$2; shift 2 ;;
    --exec-file) exe=$2; shift 2 ;;
    --chroot-base-dir) base=$2; shift 2 ;;
    --) shift; break ;;
    *) shift ;;
  esac
done
cd "$base/$(basename "$exe")/$id/root" || exit 1
exec "$exe" "$@"
`

// fakeBinaries writes a FAKE firecracker (answering --version with
// version, else running body) and a FAKE jailer of jailerVersion into a
// fresh directory and returns their paths.
func fakeBinaries(t *testing.T, version, jailerVersion, body string) (fc, jailer string) {
	t.Helper()
	needs.Command(t, "sh")
	dir := t.TempDir()
	fc, jailer = filepath.Join(dir, "firecracker"), filepath.Join(dir, "jailer")
	fcScript := "#!/bin/sh\n# FAKE firecracker for tests.\nif [ \"$1\" = --version ]; then echo \"Firecracker " + version + "\"; exit 0; fi\n" + body + "\n"
	if err := os.WriteFile(fc, []byte(fcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jailer, []byte(strings.Replace(fakeJailerScript, "%s", jailerVersion, 1)), 0o755); err != nil {
		t.Fatal(err)
	}
	return fc, jailer
}

// kvmHost points d's host checks at files describing a KVM host with
// vmx and no PVM, so that Available gets past them on this machine
// (whose /dev/kvm is PVM) to what a test is about.
func kvmHost(t *testing.T, d *Driver) {
	t.Helper()
	dir := t.TempDir()
	cpuinfo, kvm := filepath.Join(dir, "cpuinfo"), filepath.Join(dir, "kvm")
	os.WriteFile(cpuinfo, []byte("processor\t: 0\nflags\t\t: fpu vme vmx ept\n"), 0o644)
	os.WriteFile(kvm, nil, 0o666)
	d.host = hostFacts{cpuinfo: cpuinfo, kvm: kvm, pvm: filepath.Join(dir, "no-kvm_pvm")}
}

// probeFiles is an image's VM form as the probe sees it (fake files: the
// fake firecracker does not boot them).
func probeFiles(t *testing.T) func(string) (BootFiles, error) {
	dir := filepath.Dir(testImage(t))
	return func(string) (BootFiles, error) {
		return BootFiles{Kernel: dir + "/vmlinux", Initrd: dir + "/initramfs", Disk: dir + "/disk.ext4"}, nil
	}
}

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want version
		ok   bool
	}{
		{"Firecracker v1.10.1\n\n", version{1, 10, 1}, true},
		{"Jailer v1.8.0", version{1, 8, 0}, true},
		{"Firecracker v1.9.0-dev\nmore", version{1, 9, 0}, true},
		{"Firecracker v0.25.2", version{0, 25, 2}, true},
		{"Firecracker 1.10", version{}, false},
		{"Firecracker vX.Y.Z", version{}, false},
		{"", version{}, false},
	} {
		got, err := parseVersion(tc.out)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseVersion(%q) = %v, %v; want %v ok=%v", tc.out, got, err, tc.want, tc.ok)
		}
	}
	if !(version{1, 7, 9}).less(minVersion) || (version{1, 8, 0}).less(minVersion) || (version{2, 0, 0}).less(minVersion) {
		t.Error("version order")
	}
}

// TestAvailableChecksVersion: Available refuses a Firecracker older than
// minVersion, or a jailer of another release, saying so.
func TestAvailableChecksVersion(t *testing.T) {
	needs.Root(t)
	for _, tc := range []struct {
		name, fc, jailer string
		want             []string // in the reason
	}{
		{"too old", "v1.7.0", "v1.7.0", []string{"is v1.7.0", "v1.8.0 or newer", "ACPI"}},
		{"mixed releases", "v1.10.1", "v1.9.1", []string{"firecracker v1.10.1 and jailer v1.9.1 are from different releases"}},
		{"no version", "(development build)", "v1.10.1", []string{"not a release number"}},
		{"supported: the probe decides", "v1.10.1", "v1.10.1", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc, jailer := fakeBinaries(t, tc.fc, tc.jailer, "exit 1")
			d := New(Config{FirecrackerBin: fc, JailerBin: jailer, ChrootBase: t.TempDir(), UID: vmmUID, GID: vmmGID})
			kvmHost(t, d)
			err := d.Available(context.Background())
			if tc.want == nil {
				// Binaries, root and KVM are fine: Available is nil,
				// and only the probe boot can say more.
				if err != nil {
					t.Fatalf("Available = %v, want nil", err)
				}
				if perr := d.Probe(context.Background()); !errors.Is(perr, driver.ErrUnavailable) || !strings.Contains(perr.Error(), "no probe image configured") {
					t.Errorf("Probe = %v, want unavailable: no probe image configured", perr)
				}
				return
			}
			if !errors.Is(err, driver.ErrUnavailable) {
				t.Fatalf("Available = %v, want ErrUnavailable", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Available = %q, want it to say %q", err, w)
				}
			}
		})
	}
}

// TestProbeBoot: Probe is nil only once a probe boot through the jailer
// has reached the guest's init (its console says vminit.ProbeOK); a
// Firecracker that cannot boot, or a guest that never gets there, makes the
// backend unavailable with the console's last words, and the answer is
// kept; a boot a caller cut short is not kept. Nothing of a probe is left
// behind.
func TestProbeBoot(t *testing.T) {
	needs.Root(t)
	for _, tc := range []struct {
		name string
		body string // the FAKE firecracker's boot
		want string // "" = available, else in the reason
	}{
		{"boots", `cat probe.json > "$OUT/config.json"; echo "$@" > "$OUT/args"; echo $$ > "$OUT/pid"
echo "[    0.000000] Linux version 6.1.0 (FAKE)"; echo ` + vminit.ProbeOK + `; exec sleep 600`, ""},
		{"cannot boot", `echo $$ > "$OUT/pid"; echo "Error: FAKE: Kvm error: failed to set MSR 0x10a" >&2; exit 1`, "failed to set MSR 0x10a"},
		{"guest hangs", `echo $$ > "$OUT/pid"; echo "[    0.000000] Linux version 6.1.0 (FAKE)"; exec sleep 600`, "did not reach the guest's init within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			fc, jailer := fakeBinaries(t, "v1.10.1", "v1.10.1", "OUT="+out+"\n"+tc.body)
			d := New(Config{FirecrackerBin: fc, JailerBin: jailer, ChrootBase: t.TempDir(), UID: vmmUID, GID: vmmGID,
				ProbeImage: func() (string, error) { return "/desktop/rootfs", nil }, Resolve: probeFiles(t), ProbeTimeout: 3 * time.Second})
			kvmHost(t, d)
			if err := d.Available(context.Background()); err != nil {
				t.Fatalf("Available = %v: the probe is not its business", err)
			}
			// A caller that gives up cuts the boot short, and that is
			// not taken for the host's answer.
			cctx, ccancel := context.WithCancel(context.Background())
			ccancel()
			if err := d.Probe(cctx); err == nil || !strings.Contains(err.Error(), "cut short") {
				t.Errorf("Probe with a cancelled context = %v, want cut short", err)
			}
			start := time.Now()
			err := d.Probe(context.Background())
			took := time.Since(start)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Available = %v", err)
				}
				b, _ := os.ReadFile(filepath.Join(out, "config.json"))
				var v any
				if json.Unmarshal(b, &v) != nil {
					t.Fatalf("probe config %q", b)
				}
				if probs := checkValue("config-file", ref("FullVmConfiguration"), v); len(probs) > 0 {
					t.Errorf("probe config: %q", probs)
				}
				if !strings.Contains(string(b), vminit.ProbeParam) {
					t.Errorf("probe config %s lacks %s", b, vminit.ProbeParam)
				}
				if args, _ := os.ReadFile(filepath.Join(out, "args")); strings.TrimSpace(string(args)) != "--no-api --config-file /probe.json" {
					t.Errorf("firecracker args %q", args)
				}
			} else if !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Probe = %v, want unavailable saying %q", err, tc.want)
			}
			t.Logf("Probe after %v: %v", took.Round(time.Millisecond), err)
			b, _ := os.ReadFile(filepath.Join(out, "pid"))
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr != nil {
				t.Errorf("the fake never ran: %q", b)
			} else if _, alive := processStart(pid); alive {
				t.Errorf("probe VMM %d still running", pid)
			}
			if ents, _ := os.ReadDir(filepath.Join(d.probeBase(), d.execName())); len(ents) > 0 {
				t.Errorf("probe jails left: %v", ents)
			}
			// The answer is kept: no second boot.
			os.Remove(filepath.Join(out, "pid"))
			if err2 := d.Probe(context.Background()); (err2 == nil) != (err == nil) {
				t.Errorf("second Probe = %v, first %v", err2, err)
			}
			if _, err := os.Stat(filepath.Join(out, "pid")); err == nil {
				t.Error("a second Probe booted again")
			}
		})
	}
}
