package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

func createCmd(a *app) *cobra.Command {
	var (
		req            client.CreateRequest
		width, height  int
		lifetime, idle secondsValue
		env, meta      []string
		volumes        []string
		egress         string
		noWait         bool
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its ID",
		Long: `Create a sandbox. By default it waits until the desktop is usable (the
image's session complete: for the desktop image XFCE's panel and desktop up
and Chromium focused, so keys typed at once reach it); --no-wait returns at
once with the sandbox starting.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if width != 0 || height != 0 {
				if width <= 0 || height <= 0 {
					return usagef("--width and --height go together and must be positive")
				}
				req.Resolution = &client.Resolution{Width: width, Height: height}
			}
			req.TimeoutSeconds, req.IdleTimeoutSeconds = int(lifetime), int(idle)
			if req.Env, err = parseKV(env); err != nil {
				return usagef("--env %v", err)
			}
			if req.Metadata, err = parseKV(meta); err != nil {
				return usagef("--metadata %v", err)
			}
			if req.Network, err = parseEgress(egress); err != nil {
				return usagef("--egress: %v", err)
			}
			if req.Volumes, err = parseVolumes(volumes); err != nil {
				return usagef("--volume %v", err)
			}
			var opts []client.CreateOption
			if noWait {
				opts = append(opts, client.WithoutWait())
			}
			stop := startProgress(a.errOut, !noWait && isTerminal(a.errOut), "creating sandbox")
			s, err := a.client().Create(cmd.Context(), req, opts...)
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
	f := cmd.Flags()
	f.StringVar(&req.Template, "template", "", "image to boot (daemon default: desktop)")
	f.StringVar(&req.Backend, "backend", "", "firecracker, qemu, gvisor or runc (daemon default)")
	f.IntVar(&width, "width", 0, "screen width in pixels")
	f.IntVar(&height, "height", 0, "screen height in pixels")
	f.IntVar(&req.DPI, "dpi", 0, "screen DPI")
	f.IntVar(&req.VCPUs, "vcpus", 0, "virtual CPUs")
	f.IntVar(&req.MemoryMB, "memory", 0, "memory in MiB")
	f.Var(&lifetime, "timeout", "maximum lifetime from now, e.g. 3600 or 1h (0 = daemon maximum)")
	f.Var(&idle, "idle-timeout", "reap after this long without API use, e.g. 30m")
	f.StringVar(&req.StartURL, "start-url", "", "open Chromium at this URL")
	f.StringArrayVar(&env, "env", nil, "environment variable K=V (repeatable)")
	f.StringArrayVar(&meta, "metadata", nil, "metadata k=v (repeatable)")
	f.StringVar(&egress, "egress", "", "network egress: none, all, or CIDR[,CIDR...]")
	f.StringArrayVar(&volumes, "volume", nil, "attach volume NAME at PATH: NAME:/PATH (repeatable; see cubicle volume)")
	f.BoolVar(&noWait, "no-wait", false, "return at once, while the sandbox is still starting")
	f.BoolVar(&req.AutoPause, "auto-pause", false, "pause the sandbox at its timeout or idle timeout instead of destroying it")
	f.StringVar(&req.FromSnapshot, "from-snapshot", "", "start from this snapshot (ID or name; see cubicle snapshot) instead of booting")
	return cmd
}

func listCmd(a *app) *cobra.Command {
	var (
		opts client.ListOptions
		meta []string
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.Metadata, err = parseKV(meta); err != nil {
				return usagef("--metadata %v", err)
			}
			sbs, err := a.client().List(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printSandboxTable(a.out, sbs)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&opts.State, "state", "", "only sandboxes in this state (starting, running, pausing, paused, resuming, stopping, stopped, failed)")
	cmd.Flags().StringArrayVar(&meta, "metadata", nil, "only sandboxes with metadata k=v (repeatable)")
	return cmd
}

func getCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show one sandbox",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.client().Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printSandbox(a.out, s)
			}
			return nil
		},
	}
}

func rmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"destroy"},
		Short:   "Destroy sandboxes",
		Long:    "Destroy each sandbox, freeing everything it holds. It goes on past failures and reports them all.",
		Args:    minArgs(1, "at least one sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			return a.each(args, func(id string) error { return c.Destroy(cmd.Context(), id) })
		},
	}
}

// each runs do for every one of args, printing each that succeeded. With
// one argument its error is the command's; with more it goes on past
// failures, reports each, and fails with exit status 1 at the end.
func (a *app) each(args []string, do func(arg string) error) error {
	failed := false
	for _, arg := range args {
		if err := do(arg); err != nil {
			if len(args) == 1 {
				return err
			}
			fmt.Fprintf(a.errOut, "error: %s: %s\n", arg, strings.TrimPrefix(formatError(err), "error: "))
			failed = true
			continue
		}
		if !a.jsonOut {
			fmt.Fprintln(a.out, arg)
		}
	}
	if failed {
		return exitError{1}
	}
	return nil
}

func extendCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "extend ID SECONDS",
		Short: "Set a sandbox to expire SECONDS from now (also accepts 30m, 2h)",
		Args:  exactArgs("ID", "SECONDS"),
		RunE: func(cmd *cobra.Command, args []string) error {
			secs, err := parseSeconds(args[1])
			if err != nil {
				return usageError{err}
			}
			s, err := a.client().SetTimeout(cmd.Context(), args[0], secs)
			if err != nil {
				return err
			}
			if !a.printJSON() {
				if s.ExpiresAt.IsZero() {
					fmt.Fprintf(a.out, "%s: timeout set to %s\n", s.ID, strconv.Itoa(secs)+"s")
				} else {
					fmt.Fprintf(a.out, "%s expires at %s (in %s)\n", s.ID, s.ExpiresAt.Local().Format(time.RFC3339), expiresIn(s.ExpiresAt))
				}
			}
			return nil
		},
	}
}

func pauseCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "pause ID",
		Short: "Pause a sandbox to disk (memory, processes and files kept; no CPU or memory held)",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			stop := startProgress(a.errOut, isTerminal(a.errOut), "pausing")
			s, err := a.client().Pause(cmd.Context(), args[0])
			stop()
			if err != nil {
				return err
			}
			if !a.printJSON() {
				fmt.Fprintf(a.out, "%s paused (%s on disk)\n", s.ID, humanBytes(s.PausedBytes))
			}
			return nil
		},
	}
}

func resumeCmd(a *app) *cobra.Command {
	var lifetime secondsValue
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Resume a paused sandbox as it was",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			stop := startProgress(a.errOut, isTerminal(a.errOut), "resuming")
			s, err := a.client().Resume(cmd.Context(), args[0], int(lifetime))
			stop()
			if err != nil {
				return err
			}
			if !a.printJSON() {
				if s.ExpiresAt.IsZero() {
					fmt.Fprintf(a.out, "%s running\n", s.ID)
				} else {
					fmt.Fprintf(a.out, "%s running, expires at %s (in %s)\n", s.ID, s.ExpiresAt.Local().Format(time.RFC3339), expiresIn(s.ExpiresAt))
				}
			}
			return nil
		},
	}
	cmd.Flags().Var(&lifetime, "for", "lifetime from now, e.g. 600 or 10m (default: the time it had left when it paused)")
	return cmd
}

// errNoOutput guards against writing binary data to a terminal.
var errNoOutput = errors.New("refusing to write binary data to a terminal; use -o FILE")
