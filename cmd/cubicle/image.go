package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/images"
	"github.com/cubicle-dev/cubicle/internal/image"
)

// imageOps performs the image subcommands; localImages is the real one and
// tests substitute a fake, since the real one needs root.
type imageOps interface {
	Build(ctx context.Context, name string, recipe fs.FS, imageDir, cacheDir string, progress io.Writer) (image.Image, error)
	Import(ctx context.Context, name string, r io.Reader, imageDir string, opts image.ImportOptions) (image.Image, error)
	List(imageDir string) ([]image.Image, error)
	Remove(imageDir, name string) error
	// NeedRoot reports an error when this process may not change images.
	NeedRoot() error
}

// localImages runs the image subcommands on this machine with package image.
type localImages struct{}

func (localImages) Build(ctx context.Context, name string, recipe fs.FS, imageDir, cacheDir string, progress io.Writer) (image.Image, error) {
	return image.Build(ctx, name, recipe, imageDir, cacheDir, progress)
}

func (localImages) Import(ctx context.Context, name string, r io.Reader, imageDir string, opts image.ImportOptions) (image.Image, error) {
	return image.Import(ctx, name, r, imageDir, opts)
}

func (localImages) List(imageDir string) ([]image.Image, error) { return image.List(imageDir) }

func (localImages) Remove(imageDir, name string) error { return image.Remove(imageDir, name) }

func (localImages) NeedRoot() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("this needs root (debootstrap, chroot and mounts); try sudo")
	}
	return nil
}

func imageCmd(a *app) *cobra.Command {
	var imageDir, cacheDir string
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build, import, list and remove sandbox images (local; needs root)",
		Long: `Manage the images sandboxes boot from, on this machine: they live in
--image-dir, which must be the daemon's --image-dir. These commands do not talk
to the daemon; build, import and rm need root.`,
	}
	dir := a.getenv("CUBICLE_IMAGE_DIR")
	if dir == "" {
		dir = image.DefaultDir
	}
	cmd.PersistentFlags().StringVar(&imageDir, "image-dir", dir, "image directory (env CUBICLE_IMAGE_DIR)")

	var recipeDir string
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build an image from a recipe (embedded, e.g. desktop, or --recipe DIR)",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			var recipe fs.FS
			if recipeDir != "" {
				recipe = os.DirFS(recipeDir)
			} else {
				r, ok := images.Recipe(name)
				if !ok {
					return usagef("no built-in recipe %q (built in: %s); use --recipe DIR", name, strings.Join(images.Names(), ", "))
				}
				recipe = r
			}
			if err := a.images.NeedRoot(); err != nil {
				return err
			}
			start := time.Now()
			// A recipe that extends a built-in image brings that image
			// up to date first (a no-op when it is cached), so
			// "image build desktop" is one command on a fresh machine.
			installed, err := a.images.List(imageDir)
			if err != nil {
				return err
			}
			for _, p := range builtinParents(recipe, name) {
				// An operator's own image under a built-in name
				// (imported) is theirs: extend it as it is.
				if i := slices.IndexFunc(installed, func(img image.Image) bool { return img.Name == p }); i >= 0 && installed[i].Source != "recipe" {
					continue
				}
				pr, _ := images.Recipe(p)
				if _, err := a.images.Build(cmd.Context(), p, pr, imageDir, cacheDir, a.errOut); err != nil {
					return fmt.Errorf("build %s, which %s extends: %w", p, name, err)
				}
			}
			img, err := a.images.Build(cmd.Context(), name, recipe, imageDir, cacheDir, a.errOut)
			if err != nil {
				return err
			}
			if a.jsonOut {
				return writeJSONValue(a.out, img)
			}
			state := "built"
			if img.Cached {
				state = "up to date"
			}
			fmt.Fprintf(a.out, "%s %s in %s (%s)\n", img.Name, state, time.Since(start).Round(time.Second), humanBytes(img.SizeBytes))
			return nil
		},
	}
	build.Flags().StringVar(&recipeDir, "recipe", "", "build from this recipe directory instead of a built-in one")
	build.Flags().StringVar(&cacheDir, "cache-dir", image.DefaultCacheDir, "package download cache")

	var kernelFrom string
	imp := &cobra.Command{
		Use:   "import NAME [FILE|-]",
		Short: "Import an image from a `docker export` tarball (FILE, or standard input)",
		Long: `Import a root filesystem tarball, such as the output of
` + "`docker export $(docker create my-image) | cubicle image import my-image`" + `,
as the image NAME. The tarball is read from FILE, or from standard input when
FILE is "-" or missing. The image needs nothing of cubicle: sandboxes run the
desktop it has (Xvfb or Xvnc, a session such as XFCE or openbox, Chromium or
Firefox, x11vnc), and one without an X server is headless (commands and files
only). VM backends boot it with the kernel of the image --kernel names.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("import takes NAME and an optional FILE (- or none: standard input), got %d argument(s)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.images.NeedRoot(); err != nil {
				return err
			}
			var r io.Reader = a.in
			if len(args) == 2 && args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			img, err := a.images.Import(cmd.Context(), args[0], r, imageDir, image.ImportOptions{KernelFrom: kernelFrom})
			if err != nil {
				return err
			}
			if a.jsonOut {
				return writeJSONValue(a.out, img)
			}
			fmt.Fprintf(a.out, "%s imported (%s): %s\n", img.Name, humanBytes(img.SizeBytes), describeImage(img))
			return nil
		},
	}
	imp.Flags().StringVar(&kernelFrom, "kernel", "", "boot it on VM backends with the kernel of this installed image (default: "+image.DefaultKernelFrom+", when installed)")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List installed images",
		Args:    exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			imgs, err := a.images.List(imageDir)
			if err != nil {
				return err
			}
			if a.jsonOut {
				if imgs == nil {
					imgs = []image.Image{}
				}
				return writeJSONValue(a.out, imgs)
			}
			tw := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSOURCE\tSIZE\tCREATED")
			for _, img := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", img.Name, orDash(img.Source), humanBytes(img.SizeBytes), age(img.CreatedAt))
			}
			return tw.Flush()
		},
	}

	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove images (sandboxes running from them break)",
		Args:  minArgs(1, "at least one image name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.images.NeedRoot(); err != nil {
				return err
			}
			for _, name := range args {
				if err := a.images.Remove(imageDir, name); err != nil {
					return err
				}
				fmt.Fprintln(a.out, name)
			}
			return nil
		},
	}
	cmd.AddCommand(build, imp, ls, rm)
	return cmd
}

// describeImage says in a line what sandboxes of img will have.
func describeImage(img image.Image) string {
	var parts []string
	switch d := img.Desktop; {
	case d == nil:
	case d.Config:
		parts = append(parts, "desktop from its own session config")
	case !d.Desktop():
		parts = append(parts, "headless (no X server): commands and files only")
	default:
		desk := "desktop: " + path.Base(d.XServer)
		for _, p := range []string{d.Session, d.Browser, d.VNC} {
			if p != "" {
				desk += ", " + path.Base(p)
			}
		}
		if d.VNC == "" && path.Base(d.XServer) == "Xvfb" {
			desk += " (no x11vnc: no live view)"
		}
		parts = append(parts, desk)
	}
	if img.KernelFrom != "" {
		parts = append(parts, "VM kernel from "+img.KernelFrom)
	} else if img.Source == "import" {
		if _, err := image.LookupVM(img.Dir); err != nil {
			parts = append(parts, "no VM kernel: container backends only (build desktop first, or --kernel)")
		}
	}
	return strings.Join(parts, "; ")
}

func writeJSONValue(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// humanBytes renders n as 12.3 MiB.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// builtinParents returns the chain of built-in images the recipe extends,
// farthest first ("desktop-lite" for desktop). It stops at the first
// parent that is not built in: that one must be installed already, and
// Build says so.
func builtinParents(recipe fs.FS, name string) []string {
	var chain []string
	seen := map[string]bool{name: true}
	for {
		r, err := image.LoadRecipe(recipe)
		if err != nil || r.From == "" || seen[r.From] {
			break
		}
		next, ok := images.Recipe(r.From)
		if !ok {
			break
		}
		seen[r.From] = true
		chain = append([]string{r.From}, chain...)
		recipe = next
	}
	return chain
}
