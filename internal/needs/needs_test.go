package needs

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records whether a gate skipped or failed
// it. Like the real one, Skip and Fatal end the calling goroutine.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}

func (r *recorder) Skip(args ...any) {
	r.skipped, r.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// gate runs g on a recorder in a goroutine of its own (Goexit ends it).
func gate(g func(testing.TB)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		g(r)
	}()
	<-done
	return r
}

func TestGates(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-file")
	tests := []struct {
		name string
		gate func(testing.TB)
		met  bool   // the precondition holds on every machine
		want string // in the reason when it does not
	}{
		{"Path that exists", func(tb testing.TB) { Path(tb, t.TempDir()) }, true, ""},
		{"Path that does not", func(tb testing.TB) { Path(tb, missing) }, false, missing},
		{"Command on PATH", func(tb testing.TB) { Command(tb, "sh") }, true, ""},
		{"Command not on PATH", func(tb testing.TB) { Command(tb, "cubicle-no-such-command") }, false, "cubicle-no-such-command"},
		{"Env unset", func(tb testing.TB) { Env(tb, "CUBICLE_NEEDS_TEST_UNSET") }, false, "CUBICLE_NEEDS_TEST_UNSET"},
		{"Long", func(tb testing.TB) { Long(tb, "starts a desktop") }, !testing.Short(), "starts a desktop"},
	}
	for _, tt := range tests {
		for _, required := range []string{"", "1"} {
			t.Run(fmt.Sprintf("%s/%s=%s", tt.name, RequireEnv, required), func(t *testing.T) {
				t.Setenv(RequireEnv, required)
				r := gate(tt.gate)
				switch {
				case tt.met && (r.skipped || r.failed):
					t.Errorf("met precondition: skipped %v, failed %v (%s)", r.skipped, r.failed, r.msg)
				case !tt.met && required == "1" && !r.failed:
					t.Errorf("unmet precondition with %s=1: skipped %v, failed %v; want a failure", RequireEnv, r.skipped, r.failed)
				case !tt.met && required == "" && (!r.skipped || r.failed):
					t.Errorf("unmet precondition: skipped %v, failed %v; want a skip", r.skipped, r.failed)
				case !tt.met && !strings.Contains(r.msg, tt.want):
					t.Errorf("reason %q does not name %q", r.msg, tt.want)
				}
			})
		}
	}
}
