package oci

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// TestRunscPathsAgree: the tests gate on the runsc the backend runs.
func TestRunscPathsAgree(t *testing.T) {
	if needs.RunscPath != DefaultRunscPath {
		t.Errorf("needs.RunscPath %q, DefaultRunscPath %q", needs.RunscPath, DefaultRunscPath)
	}
}

func TestCheckRunscVersion(t *testing.T) {
	for _, tc := range []struct {
		name, out, version, err string // err: a part of the refusal, "" for none
	}{
		{"pinned build", "runsc version v0.0.0-20260905035102-160fafc42237\nspec: 1.2.1\n", "v0.0.0-20260905035102-160fafc42237", ""},
		{"a later release", "runsc version release-20261101.0\nspec: 1.2.1\n", "release-20261101.0", ""},
		{"debian 12", "runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n", "0.0~20221219.0", "older than the oldest cubicle runs (20260905)"},
		{"an older release", "runsc version release-20260829.0\n", "release-20260829.0", "older than"},
		{"no version stamped", "runsc version VERSION_MISSING\nspec: 1.2.1\n", "VERSION_MISSING", "names no date"},
		{"not runsc", "Usage: something else\n", "", "not \"runsc version"},
		{"empty", "", "", "not \"runsc version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := checkRunscVersion(tc.out)
			if v != tc.version {
				t.Errorf("version %q, want %q", v, tc.version)
			}
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one saying %q", err, tc.err)
			}
		})
	}
}

// TestMinRunscDateFollowsThePin keeps MinRunscDate at the date of the
// runsc deploy/runsc/go.mod pins: the version the tests run is the oldest
// the backend accepts.
func TestMinRunscDateFollowsThePin(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/runsc/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*gvisor\.dev/gvisor v0\.0\.0-(\d{8})\d{6}-[0-9a-f]{12}\b`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("deploy/runsc/go.mod requires no gvisor.dev/gvisor pseudo-version:\n%s", b)
	}
	if string(m[1]) != MinRunscDate {
		t.Errorf("deploy/runsc/go.mod pins gVisor of %s, MinRunscDate is %s: move them together", m[1], MinRunscDate)
	}
}
