package oci

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// The runtime's state and lock files live off the data disk. They were in
// STATEDIR/runtime-root, and the soak's "data dir full" fault showed why
// that is wrong: a checkpoint or restore that met a full disk left runsc's
// state file truncated ("unexpected end of JSON input"), after which no
// runsc call on the box worked — not the resume, not the SIGUSR2 that has
// the agent listen again, not the delete — and the box's sandbox and gofer
// were left running with nobody able to reach or end them. The runtime's
// records are a few kilobytes per box and mean nothing after a reboot
// (no box survives one), which is what /run is for; runc's and runsc's own
// defaults (/run/runc, /var/run/runsc) and containerd's
// (/run/containerd/runc) live there too.

// RuntimeRootBase holds one runtime root per state directory.
const RuntimeRootBase = "/run/cubicle/oci"

// rootOwnerFile, in a runtime root, names the state directory it serves,
// so that a root whose state directory is gone can be told and removed.
const rootOwnerFile = "state-dir"

// DefaultRuntimeRoot is the runtime root of the driver whose state
// directory is stateDir: RuntimeRootBase/HASH, HASH naming stateDir, so
// that daemons with different data directories (tests start many) keep
// apart, and a daemon's successor on the same directory finds its boxes.
func DefaultRuntimeRoot(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return filepath.Join(RuntimeRootBase, hex.EncodeToString(sum[:8]))
}

// legacyRoot reports whether STATEDIR/runtime-root still records a
// container (a state file, or runc's directory of one): the boxes of a
// daemon from before the move, which its successor must adopt where they
// are. Once none is left there, the next daemon uses the new root.
func legacyRoot(stateDir string) bool {
	return records(filepath.Join(stateDir, "runtime-root"))
}

// claimRoot makes the runtime root and marks it with the state directory
// it serves; a legacy root (under the state directory) needs no mark.
func (d *Driver) claimRoot() error {
	root := d.runtimeRoot()
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	if filepath.Dir(root) != RuntimeRootBase {
		return nil
	}
	owner := filepath.Join(root, rootOwnerFile)
	if b, err := os.ReadFile(owner); err == nil && string(b) == filepath.Clean(d.cfg.StateDir) {
		return nil
	}
	return os.WriteFile(owner, []byte(filepath.Clean(d.cfg.StateDir)), 0o600)
}

// pruneRoots removes the runtime roots under RuntimeRootBase whose state
// directory is gone and that record no container: what daemons on
// temporary data directories (tests, trials) leave behind. A root that
// still records a container is left: its box may be running.
func pruneRoots() error {
	ents, err := os.ReadDir(RuntimeRootBase)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		root := filepath.Join(RuntimeRootBase, e.Name())
		owner, err := os.ReadFile(filepath.Join(root, rootOwnerFile))
		if err != nil || !filepath.IsAbs(string(owner)) {
			continue // not one of ours, or being made
		}
		if _, err := os.Stat(string(owner)); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if records(root) {
			continue
		}
		if err := os.RemoveAll(root); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// records reports whether runtime root holds a container's state: a runsc
// state file or a runc container directory.
func records(root string) bool {
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".state") || (e.IsDir() && validID(e.Name()) == nil) {
			return true
		}
	}
	return false
}
