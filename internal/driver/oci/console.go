package oci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

var (
	_ driver.Console = (*box)(nil)
	_ driver.Console = (*unsureBox)(nil)
)

// OpenConsole opens console.log, where the container's stdout and stderr
// go (the runtime's own complaints too).
func (b *box) OpenConsole() (*os.File, error) { return openConsole(b.data) }

// OpenConsole opens the console log of a box the runtime could not yet
// tell about: the file is there whatever the runtime says.
func (u *unsureBox) OpenConsole() (*os.File, error) { return openConsole(u.data) }

func openConsole(data boxData) (*os.File, error) {
	f, err := os.Open(filepath.Join(data.Dir, "console.log"))
	if err != nil {
		// The path is the daemon's business, not the error's reader's.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("box %s: open console log: %w", data.ID, err)
	}
	return f, nil
}
