package firecracker

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// TestAvailableHere runs Available on this very machine and checks that
// it names every reason the host has for not running Firecracker — on the
// development and CI machines: no firecracker binary, no vmx/svm, PVM.
func TestAvailableHere(t *testing.T) {
	d := New(Config{ChrootBase: t.TempDir()})
	err := d.Available(context.Background())
	_, fcErr := exec.LookPath("firecracker")
	_, jErr := exec.LookPath("jailer")
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	_, pvmErr := os.Stat("/sys/module/kvm_pvm")
	_, kvmErr := os.Stat("/dev/kvm")
	var want []string
	if fcErr != nil {
		want = append(want, "firecracker binary: firecracker not found")
	}
	if jErr != nil {
		want = append(want, "jailer binary: jailer not found")
	}
	if !hasVirtFlag(cpuinfo) {
		want = append(want, "neither vmx nor svm")
	}
	if pvmErr == nil {
		want = append(want, "/dev/kvm is PVM")
	}
	if kvmErr != nil {
		want = append(want, "no /dev/kvm")
	}
	if len(want) == 0 {
		// A KVM host with Firecracker installed: Available may still fail
		// (not root), but must not be vague about it.
		t.Logf("Available on a capable host: %v", err)
		return
	}
	if err == nil {
		t.Fatalf("Available = nil on a host lacking: %v", want)
	}
	if !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("error %v does not wrap driver.ErrUnavailable", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Available error %q does not say %q", err, w)
		}
	}
	t.Logf("Available here: %v", err)
}

func TestCheckKVM(t *testing.T) {
	intel := []byte("processor\t: 0\nflags\t\t: fpu vme de pse vmx ept\n")
	amd := []byte("flags\t\t: fpu svm npt\n")
	none := []byte("flags\t\t: fpu vme hypervisor\n")
	for _, tc := range []struct {
		name    string
		cpuinfo []byte
		pvm     bool
		kvmErr  error
		want    []string // substrings; none = nil error
	}{
		{"intel", intel, false, nil, nil},
		{"amd", amd, false, nil, nil},
		{"pvm here", none, true, nil, []string{"neither vmx nor svm", "PVM"}},
		{"pvm with flags", intel, true, nil, []string{"PVM"}},
		{"no kvm", intel, false, os.ErrNotExist, []string{"no /dev/kvm"}},
		{"no permission", intel, false, os.ErrPermission, []string{"cannot be opened"}},
		{"vmx in another field", []byte("model name\t: vmx svm\nflags\t: fpu\n"), false, nil, []string{"neither vmx nor svm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkKVM(tc.cpuinfo, tc.pvm, tc.kvmErr)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("checkKVM = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("checkKVM = nil, want %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("checkKVM = %q, want it to say %q", err, w)
				}
			}
		})
	}
}

func TestAvailableNames(t *testing.T) {
	d := New(Config{FirecrackerBin: "/nonexistent/fc", JailerBin: "/nonexistent/jailer"})
	err := d.Available(context.Background())
	if err == nil || !strings.Contains(err.Error(), `contain "firecracker"`) || !strings.Contains(err.Error(), "/nonexistent/jailer not found") {
		t.Errorf("Available = %v", err)
	}
	if d.Name() != "firecracker" || d.Isolation() != driver.IsolationVM || !d.Accelerated(context.Background()) {
		t.Errorf("Name/Isolation/Accelerated = %s/%s/%v", d.Name(), d.Isolation(), d.Accelerated(context.Background()))
	}
}
