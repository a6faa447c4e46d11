package session

import (
	"context"
	"image"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/internal/agent/desktop"
)

// This file is the only place that knows the desktop package's API.

// Sink receives the supervisor's X connection: desktop.Service satisfies
// it. SetDesktop(nil) takes the connection away while Xvfb restarts.
type Sink interface {
	SetDesktop(*desktop.Desktop)
}

// openDisplay connects to display.
func openDisplay(display string) (*desktop.Desktop, error) { return desktop.Open(display) }

// probe takes a one-pixel screenshot: the desktop is ready when it works.
func probe(ctx context.Context, d *desktop.Desktop) error {
	_, err := d.Screenshot(ctx, action.ScreenshotOptions{Format: action.FormatPNG, Region: image.Rect(0, 0, 1, 1)})
	return err
}
