package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

func snapshotCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots"},
		Short:   "Manage snapshots: running sandboxes saved to start new ones from",
		Long: `A snapshot is a running sandbox saved as it was: its memory, programs, the
page on its screen and its files. Start new sandboxes from it with
cubicle create --from-snapshot ID-or-NAME, any number of times, until you
delete it; each gets an identity of its own. Snapshots belong to your API key.`,
	}
	var (
		name string
		meta []string
	)
	create := &cobra.Command{
		Use:   "create SANDBOX_ID",
		Short: "Save a running sandbox as a snapshot and print its ID (the sandbox runs on)",
		Args:  exactArgs("SANDBOX_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parseKV(meta)
			if err != nil {
				return usagef("--metadata %v", err)
			}
			stop := startProgress(a.errOut, isTerminal(a.errOut), "taking snapshot")
			s, err := a.client().CreateSnapshot(cmd.Context(), args[0], client.SnapshotOptions{Name: name, Metadata: md})
			stop()
			if err != nil {
				return err
			}
			if !a.printJSON() {
				fmt.Fprintln(a.out, s.ID)
			}
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "name it (unique among your snapshots); usable instead of the ID")
	create.Flags().StringArrayVar(&meta, "metadata", nil, "metadata k=v (repeatable)")
	var of string
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your snapshots",
		Args:    exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ss, err := a.client().ListSnapshots(cmd.Context(), of)
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printSnapshotTable(a.out, ss)
			}
			return nil
		},
	}
	ls.Flags().StringVar(&of, "sandbox", "", "only the snapshots of this sandbox")
	get := &cobra.Command{
		Use:   "get ID|NAME",
		Short: "Show one snapshot",
		Args:  exactArgs("ID|NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.client().GetSnapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printSnapshotTable(a.out, []client.Snapshot{s})
			}
			return nil
		},
	}
	rm := &cobra.Command{
		Use:     "rm ID|NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete snapshots and their files (sandboxes started from them run on)",
		Args:    minArgs(1, "at least one snapshot"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			return a.each(args, func(ref string) error { return c.DeleteSnapshot(cmd.Context(), ref) })
		},
	}
	cmd.AddCommand(create, ls, get, rm)
	return cmd
}

func printSnapshotTable(w io.Writer, ss []client.Snapshot) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSANDBOX\tBACKEND\tRESOLUTION\tSIZE\tAGE")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, orDash(s.Name), s.SandboxID, s.Backend,
			resolution(s.Resolution), humanBytes(s.SizeBytes), age(s.CreatedAt))
	}
	_ = tw.Flush()
}

func forkCmd(a *app) *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Copy a running sandbox as it is into new running sandboxes and print their IDs",
		Long: `Copy a running sandbox — its memory, programs, the page on its screen, its
files — into --count new sandboxes (1 to 10) while it runs on. Each copy has an
identity of its own: ID, agent token, hostname, machine-id, random state and
network address.`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			stop := startProgress(a.errOut, isTerminal(a.errOut), "forking sandbox")
			sbs, err := a.client().Fork(cmd.Context(), args[0], count)
			stop()
			if err != nil {
				return err
			}
			if !a.printJSON() {
				for _, s := range sbs {
					fmt.Fprintln(a.out, s.ID)
				}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, "how many copies (1..10)")
	return cmd
}
