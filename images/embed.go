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

//go:embed desktop desktop-lite
var recipes embed.FS

// Names lists the built-in recipes: desktop (XFCE, extends desktop-lite)
// and desktop-lite (openbox, for density).
func Names() []string { return []string{"desktop", "desktop-lite"} }

// Desktop returns the desktop image recipe: recipe.json at the root of the
// returned FS and the rootfs overlay under files/.
func Desktop() fs.FS {
	sub, _ := Recipe("desktop")
	return sub
}

// Recipe returns the embedded recipe called name ("desktop",
// "desktop-lite"), or false.
func Recipe(name string) (fs.FS, bool) {
	for _, n := range Names() {
		if n == name {
			sub, err := fs.Sub(recipes, name)
			if err != nil {
				panic(err) // the embedded paths are fixed at compile time
			}
			return sub, true
		}
	}
	return nil, false
}
