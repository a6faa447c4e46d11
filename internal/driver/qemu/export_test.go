package qemu

import (
	"context"
	"path/filepath"
)

// QMPCommand runs a QMP command without arguments on box id's QEMU under
// stateDir, for tests that act on a VM behind the driver's back.
func QMPCommand(ctx context.Context, stateDir, id, command string) error {
	return qmpCommand(ctx, filepath.Join(stateDir, id, "qmp.sock"), command)
}
