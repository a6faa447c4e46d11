// Package images carries the image recipes compiled into the cubicle binaries,
// so `cubicle image build desktop` works without a source checkout. A recipe
// is a directory holding recipe.json and a files/ tree copied into the
// rootfs; internal/image reads it. Embedded files carry no modes: the recipe
// lists the modes of files that need more than 0644.
package images

import (
	"embed"
	"io/fs"
)

//go:embed desktop
var recipes embed.FS

// Desktop returns the desktop image recipe: recipe.json at the root of the
// returned FS and the rootfs overlay under files/.
func Desktop() fs.FS {
	sub, err := fs.Sub(recipes, "desktop")
	if err != nil {
		panic(err) // the embedded path is fixed at compile time
	}
	return sub
}

// Recipe returns the embedded recipe called name ("desktop"), or false.
func Recipe(name string) (fs.FS, bool) {
	if name != "desktop" {
		return nil, false
	}
	return Desktop(), true
}
