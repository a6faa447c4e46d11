package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

func volumeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes"},
		Short:   "Manage volumes: persistent disks that outlive sandboxes",
		Long: `A volume is a persistent disk of your API key. Attach it when you create a
sandbox (cubicle create --volume NAME:PATH); what the sandbox writes there stays
after the sandbox is destroyed, reaped or the daemon restarts, and the next
sandbox that attaches the volume finds it. One live sandbox holds a volume at a
time. A new volume starts as a copy of what the image has at PATH.`,
	}
	create := &cobra.Command{
		Use:   "create NAME SIZE_MB",
		Short: "Create a volume of SIZE_MB MiB (sparse: it takes disk only as it fills)",
		Args:  exactArgs("NAME", "SIZE_MB"),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := strconv.Atoi(args[1])
			if err != nil || size <= 0 {
				return usagef("SIZE_MB must be a positive number of MiB, not %q", args[1])
			}
			v, err := a.client().CreateVolume(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			if !a.printJSON() {
				fmt.Fprintln(a.out, v.Name)
			}
			return nil
		},
	}
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your volumes",
		Args:    exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			vs, err := a.client().ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printVolumeTable(a.out, vs)
			}
			return nil
		},
	}
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one volume",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := a.client().GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printVolumeTable(a.out, []client.Volume{v})
			}
			return nil
		},
	}
	rm := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete volumes and their data",
		Args:    minArgs(1, "at least one volume name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			return a.each(args, func(name string) error { return c.DeleteVolume(cmd.Context(), name) })
		},
	}
	cmd.AddCommand(create, ls, get, rm)
	return cmd
}

func printVolumeTable(w io.Writer, vs []client.Volume) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tUSED\tAGE\tATTACHED TO")
	for _, v := range vs {
		fmt.Fprintf(tw, "%s\t%d MiB\t%d MiB\t%s\t%s\n", v.Name, v.SizeMB, v.UsedMB, age(v.CreatedAt), orDash(v.AttachedTo))
	}
	_ = tw.Flush()
}

// parseVolumes reads --volume NAME:PATH flags.
func parseVolumes(flags []string) ([]client.VolumeMount, error) {
	var out []client.VolumeMount
	for _, f := range flags {
		name, path, ok := strings.Cut(f, ":")
		if !ok || name == "" || !strings.HasPrefix(path, "/") {
			return nil, fmt.Errorf("%q: want NAME:/PATH", f)
		}
		out = append(out, client.VolumeMount{Name: name, Path: path})
	}
	return out, nil
}
