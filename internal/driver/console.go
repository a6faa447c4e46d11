package driver

import "os"

// Console is implemented by boxes whose backend keeps what the box prints
// on its console in a file on the host: the init's stdout and stderr of
// an OCI box (the agent's own log and what the session's programs print),
// the serial console of a VM. The manager reads it for the sandbox's logs
// (GET /v1/sandboxes/{id}/logs); the file's path stays in the driver, so
// no answer can name a host path.
type Console interface {
	// OpenConsole opens the box's console log for reading. It is only
	// appended to while the box runs; a box started again from saved
	// state (a resumed VM) may start it again from empty.
	OpenConsole() (*os.File, error)
}
