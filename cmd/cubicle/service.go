package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

func infoCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Show the daemon's version, backends and capacity, and its cluster's nodes",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, err := a.client().Info(cmd.Context())
			if err != nil {
				return err
			}
			if a.printJSON() {
				return nil
			}
			fmt.Fprintf(a.out, "daemon:    %s (%s)\n", a.url, orDash(info.Version))
			fmt.Fprintf(a.out, "default:   %s\n", orDash(info.DefaultBackend))
			fmt.Fprintf(a.out, "sandboxes: %d running of %d\n", info.Capacity.Running, info.Capacity.MaxSandboxes)
			tw := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "BACKEND\tISOLATION\tAVAILABLE\tRUNTIME\tREASON")
			for _, b := range info.Backends {
				avail := "yes"
				if !b.Available {
					avail = "no"
				}
				runtime := ""
				if r := b.Runtime; r != nil {
					runtime = strings.TrimSpace(r.Name + " " + r.Version)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", b.Name, orDash(b.Isolation), avail, orDash(runtime), orDash(b.Reason))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if c := info.Cluster; c != nil {
				state := "ok"
				if c.Degraded != "" {
					state = "degraded: " + c.Degraded
				}
				fmt.Fprintf(a.out, "\ncluster:   node %s, %d nodes, %s\n", c.Node, len(c.Nodes), state)
				tw := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NODE\tURL\tVERSION\tSANDBOXES\tFREE MEMORY\tBACKENDS\tDRAINING")
				for _, n := range c.Nodes {
					draining := "no"
					if n.Draining {
						draining = "yes"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d of %d\t%d MiB\t%s\t%s\n", n.Name, n.URL, orDash(n.Version),
						n.Live, n.MaxSandboxes, n.FreeMemoryMB, orDash(strings.Join(n.Backends, ",")), draining)
				}
				return tw.Flush()
			}
			return nil
		},
	}
}

func viewCmd(a *app) *cobra.Command {
	var (
		ttl         secondsValue
		interactive bool
		open        bool
	)
	cmd := &cobra.Command{
		Use:   "view ID",
		Short: "Print a URL for watching the sandbox's desktop in a browser",
		Long: `Mint a live-view URL (a noVNC page) for the sandbox and print it. Anyone with
the URL can watch until it expires — and, with --interactive, control the
desktop.`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := a.client().View(cmd.Context(), args[0], client.ViewRequest{TTLSeconds: int(ttl), ViewOnly: !interactive})
			if err != nil {
				return err
			}
			if !a.printJSON() {
				fmt.Fprintln(a.out, v.URL)
			}
			if open {
				if err := a.openURL(v.URL); err != nil {
					return fmt.Errorf("open browser: %w", err)
				}
			}
			return nil
		},
	}
	cmd.Flags().Var(&ttl, "ttl", "how long the URL works, e.g. 600 or 10m (daemon default)")
	cmd.Flags().BoolVar(&interactive, "interactive", false, "let the viewer control the desktop, not just watch")
	cmd.Flags().BoolVar(&open, "open", false, "open the URL with xdg-open")
	return cmd
}
