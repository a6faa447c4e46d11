package firecracker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

var _ driver.Console = (*box)(nil)

// OpenConsole opens console.log, the guest's serial console. It is
// emptied when it grows past Config.ConsoleMaxBytes (boundConsole); a
// reader sees it shrink and starts again from its beginning.
func (b *box) OpenConsole() (*os.File, error) {
	f, err := os.Open(filepath.Join(b.data.JailDir, consoleName))
	if err != nil {
		// The path is the daemon's business, not the error's reader's.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("vm %s: open console log: %w", b.data.ID, err)
	}
	return f, nil
}
