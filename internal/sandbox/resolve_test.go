package sandbox

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/metrics"
)

// backendFake is a fakeDriver (a test double: in-process boxes) under a
// backend name of its own, with the availability and acceleration a test
// gives it, counting the boxes it was asked to create.
type backendFake struct {
	*fakeDriver
	name, iso string
	availErr  error
	accel     *bool // set for VM backends, which are wrapped as accelFake
	creates   atomic.Int32
}

func (d *backendFake) Name() string                    { return d.name }
func (d *backendFake) Isolation() string               { return d.iso }
func (d *backendFake) Available(context.Context) error { return d.availErr }
func (d *backendFake) Create(ctx context.Context, spec driver.Spec) (driver.Box, error) {
	d.creates.Add(1)
	return d.fakeDriver.Create(ctx, spec)
}

// accelFake is a backendFake that is a driver.Accelerator, as the VM
// backends are.
type accelFake struct{ *backendFake }

func (d accelFake) Accelerated(context.Context) bool { return *d.accel }

var _ driver.Accelerator = accelFake{}

// backendSet describes the four backends of one case: nil error means
// available; kvm says whether the VM backends are accelerated.
type backendSet struct {
	fc, qemu, gvisor, runc error
	kvm                    bool
}

func (s backendSet) drivers(t *testing.T) (map[string]driver.Driver, map[string]*backendFake) {
	kvm := s.kvm
	fakes := map[string]*backendFake{
		"firecracker": {name: "firecracker", iso: driver.IsolationVM, availErr: s.fc, accel: &kvm},
		"qemu":        {name: "qemu", iso: driver.IsolationVM, availErr: s.qemu, accel: &kvm},
		"gvisor":      {name: "gvisor", iso: driver.IsolationGVisor, availErr: s.gvisor},
		"runc":        {name: "runc", iso: driver.IsolationNamespace, availErr: s.runc},
	}
	ds := map[string]driver.Driver{}
	for n, f := range fakes {
		// Not t.TempDir: the subtests' long names would make the boxes'
		// socket paths longer than a unix socket allows.
		dir, err := os.MkdirTemp("", "cubicle-resolve-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		f.fakeDriver = &fakeDriver{t: t, dir: dir, boxes: map[string]*fakeBox{}}
		if f.accel != nil {
			ds[n] = accelFake{f}
		} else {
			ds[n] = f
		}
	}
	return ds, fakes
}

var (
	errNoKVM   = errors.New("no usable /dev/kvm: kvm_pvm is not enough")
	errNoRunsc = errors.New(`"runsc" not found on PATH`)
	errNoRunc  = errors.New(`"runc" not found on PATH`)
	errNoQEMU  = errors.New(`"qemu-system-x86_64" not found on PATH`)
)

// TestBackendResolution checks the promise that cubicle never silently
// downgrades: "auto" takes the first usable backend in the order
// firecracker, accelerated qemu, gvisor, runc, and the sandbox reports the
// backend and isolation it actually got; a backend asked for by name (in
// the request or as the daemon's default) that cannot run fails as
// unavailable (503) with the backend's own reason and nothing is created
// on any backend.
func TestBackendResolution(t *testing.T) {
	tests := []struct {
		name           string
		set            backendSet
		defaultBackend string // "" = auto
		request        string
		wantBackend    string
		wantIsolation  string
		wantErr        error    // errdefs kind
		wantReasons    []string // in the error message
	}{
		{name: "auto: firecracker unavailable, qemu emulated, gets gvisor",
			set: backendSet{fc: errNoKVM}, wantBackend: "gvisor", wantIsolation: driver.IsolationGVisor},
		{name: "auto: only runc usable, reports namespace isolation",
			set: backendSet{fc: errNoKVM, qemu: errNoQEMU, gvisor: errNoRunsc}, wantBackend: "runc", wantIsolation: driver.IsolationNamespace},
		{name: "auto: accelerated qemu before gvisor",
			set: backendSet{fc: errNoKVM, kvm: true}, wantBackend: "qemu", wantIsolation: driver.IsolationVM},
		{name: "auto: firecracker first when it can run",
			set: backendSet{kvm: true}, wantBackend: "firecracker", wantIsolation: driver.IsolationVM},
		{name: "auto named in the request behaves as the default",
			set: backendSet{fc: errNoKVM}, defaultBackend: "runc", request: "auto", wantBackend: "gvisor", wantIsolation: driver.IsolationGVisor},
		{name: "auto: nothing usable fails with every reason",
			set:     backendSet{fc: errNoKVM, qemu: errNoQEMU, gvisor: errNoRunsc, runc: errNoRunc},
			wantErr: errdefs.ErrUnavailable, wantReasons: []string{errNoKVM.Error(), errNoQEMU.Error(), errNoRunsc.Error(), errNoRunc.Error()}},
		{name: "requested firecracker unavailable: 503 with its reason, no fallback",
			set: backendSet{fc: errNoKVM}, request: "firecracker",
			wantErr: errdefs.ErrUnavailable, wantReasons: []string{"firecracker", errNoKVM.Error()}},
		{name: "requested gvisor unavailable: no fallback to runc",
			set: backendSet{fc: errNoKVM, gvisor: errNoRunsc}, request: "gvisor",
			wantErr: errdefs.ErrUnavailable, wantReasons: []string{"gvisor", errNoRunsc.Error()}},
		{name: "default backend firecracker unavailable: no fallback",
			set: backendSet{fc: errNoKVM}, defaultBackend: "firecracker",
			wantErr: errdefs.ErrUnavailable, wantReasons: []string{"firecracker", errNoKVM.Error()}},
		{name: "requested emulated qemu is honoured, reported as a VM",
			set: backendSet{fc: errNoKVM}, request: "qemu", wantBackend: "qemu", wantIsolation: driver.IsolationVM},
		{name: "unknown backend is invalid, not a fallback",
			set: backendSet{}, request: "vmware", wantErr: errdefs.ErrInvalid, wantReasons: []string{"vmware"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds, fakes := tt.set.drivers(t)
			def := tt.defaultBackend
			if def == "" {
				def = "auto"
			}
			m, err := New(context.Background(), Config{
				DataDir: t.TempDir(), Drivers: ds, DefaultBackend: def,
				Images:       func(string) (string, error) { return "/nonexistent", nil },
				MaxSandboxes: 2, ReapInterval: time.Hour, Metrics: metrics.New(),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ctx := context.Background()
			sb, err := m.Create(ctx, CreateRequest{Backend: tt.request}, true)
			created := map[string]int32{}
			for n, f := range fakes {
				if c := f.creates.Load(); c > 0 {
					created[n] = c
				}
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("create: %v (sandbox %+v), want %v", err, sb, tt.wantErr)
				}
				for _, r := range tt.wantReasons {
					if !strings.Contains(err.Error(), r) {
						t.Errorf("error %q does not say %q", err, r)
					}
				}
				if len(created) > 0 {
					t.Errorf("a refused create still created boxes: %v", created)
				}
				if l := m.List(ctx, Filter{}); len(l) > 0 {
					t.Errorf("a refused create left records: %+v", l)
				}
				return
			}
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if sb.Backend != tt.wantBackend || sb.Isolation != tt.wantIsolation {
				t.Errorf("sandbox on %s (%s), want %s (%s)", sb.Backend, sb.Isolation, tt.wantBackend, tt.wantIsolation)
			}
			if want := map[string]int32{tt.wantBackend: 1}; len(created) != 1 || created[tt.wantBackend] != 1 {
				t.Errorf("boxes created per backend %v, want %v", created, want)
			}
			// What GET reports later is what the box got.
			got, err := m.Get(ctx, sb.ID)
			if err != nil || got.Backend != tt.wantBackend || got.Isolation != tt.wantIsolation {
				t.Errorf("get: %+v %v, want backend %s isolation %s", got, err, tt.wantBackend, tt.wantIsolation)
			}
			if err := m.Destroy(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestBackendsExplainWhy checks that /v1/info's backend list says why each
// backend "auto" passes over cannot or will not be chosen.
func TestBackendsExplainWhy(t *testing.T) {
	ds, _ := backendSet{fc: errNoKVM, runc: errNoRunc}.drivers(t)
	m, err := New(context.Background(), Config{
		DataDir: t.TempDir(), Drivers: ds,
		Images:       func(string) (string, error) { return "/nonexistent", nil },
		ReapInterval: time.Hour, Metrics: metrics.New(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got := map[string]BackendInfo{}
	for _, b := range m.Backends(context.Background()) {
		got[b.Name] = b
	}
	for _, tt := range []struct {
		name      string
		available bool
		reason    string // substring; "" = none expected
		isolation string
	}{
		{"firecracker", false, errNoKVM.Error(), driver.IsolationVM},
		{"qemu", true, "no hardware acceleration", driver.IsolationVM},
		{"gvisor", true, "", driver.IsolationGVisor},
		{"runc", false, errNoRunc.Error(), driver.IsolationNamespace},
	} {
		b, ok := got[tt.name]
		switch {
		case !ok:
			t.Errorf("%s not listed: %+v", tt.name, got)
		case b.Available != tt.available || b.Isolation != tt.isolation:
			t.Errorf("%s: %+v, want available %v, isolation %s", tt.name, b, tt.available, tt.isolation)
		case tt.reason == "" && b.Reason != "":
			t.Errorf("%s: reason %q, want none", tt.name, b.Reason)
		case !strings.Contains(b.Reason, tt.reason):
			t.Errorf("%s: reason %q, want it to say %q", tt.name, b.Reason, tt.reason)
		}
	}
}
