package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

func cpCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox",
		Long: `Copy one file between this machine and a sandbox. Exactly one side is a
sandbox path, written ID:/absolute/path. The local side may be - for standard
input (upload) or standard output (download). A destination ending in / (or
an existing local directory) receives the source's file name.`,
		Example: `  cubicle cp ./report.pdf abc123:/root/
  cubicle cp abc123:/root/screen.png .
  tar c dir | cubicle cp - abc123:/tmp/dir.tar`,
		Args: exactArgs("SRC", "DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := parseCopy(args[0], args[1])
			if err != nil {
				return usageError{err}
			}
			c := a.client()
			if spec.dir == upload {
				var r io.Reader = a.in
				if spec.local != "-" {
					f, err := os.Open(spec.local)
					if err != nil {
						return err
					}
					defer f.Close()
					r = f // an *os.File can be rewound, so the upload may be retried
					if strings.HasSuffix(spec.remote, "/") {
						spec.remote += filepath.Base(spec.local)
					}
				} else if strings.HasSuffix(spec.remote, "/") {
					return usagef("cp: uploading stdin needs a file name, not the directory %s", spec.remote)
				}
				fi, err := c.Upload(cmd.Context(), spec.id, spec.remote, r)
				if err != nil {
					return err
				}
				if !a.printJSON() {
					fmt.Fprintf(a.out, "%s:%s (%d bytes)\n", spec.id, fi.Path, fi.Size)
				}
				return nil
			}

			rc, err := c.Download(cmd.Context(), spec.id, spec.remote)
			if err != nil {
				return err
			}
			defer rc.Close()
			if spec.local == "-" {
				_, err = io.Copy(a.out, rc)
				return err
			}
			dst := spec.local
			if st, err := os.Stat(dst); (err == nil && st.IsDir()) || strings.HasSuffix(dst, string(os.PathSeparator)) {
				dst = filepath.Join(dst, path.Base(spec.remote))
			}
			n, err := writeFileFrom(dst, rc)
			if err != nil {
				return err
			}
			if !a.jsonOut {
				fmt.Fprintf(a.out, "%s (%d bytes)\n", dst, n)
			}
			return nil
		},
	}
}

// writeFileFrom copies r into a new file at dst through a temporary file in
// the same directory, so a failed download leaves no partial file behind.
func writeFileFrom(dst string, r io.Reader) (int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".cubicle-cp-*")
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(tmp, r)
	err = errors.Join(err, tmp.Close())
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return 0, fmt.Errorf("write %s: %w", dst, err)
	}
	return n, nil
}
