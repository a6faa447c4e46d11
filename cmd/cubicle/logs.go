package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

// followEvery is how often --follow asks for new lines: the daemon reads
// a sandbox's console every few seconds anyway.
const followEvery = 2 * time.Second

func logsCmd(a *app) *cobra.Command {
	var (
		opts   client.LogsOptions
		since  time.Duration
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Show what a sandbox printed on its console",
		Long: `Show a sandbox's log, oldest first: the agent's lines about the session's
programs (source agent), what those programs print and, in a VM, the
kernel (source console), and the daemon's notes (source cubicled). Without
--since, the newest --limit lines; --follow then prints new lines as they
come until interrupted. Only the API key that created the sandbox can read
its log; a stopped sandbox's is kept while it is listed.`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if since < 0 {
				return usagef("--since must not be negative")
			}
			if follow && a.jsonOut {
				return usagef("--follow prints lines, not JSON")
			}
			if since > 0 {
				opts.Since = now().Add(-since)
			}
			c := a.client()
			logs, err := c.Logs(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			if a.printJSON() {
				return nil
			}
			printLogs(a.out, logs)
			if !follow {
				return nil
			}
			t := time.NewTicker(followEvery)
			defer t.Stop()
			for {
				if len(logs) > 0 {
					opts.Since = logs[len(logs)-1].Timestamp
				} else if opts.Since.IsZero() {
					opts.Since = now()
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-t.C:
				}
				if logs, err = c.Logs(cmd.Context(), args[0], opts); err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				printLogs(a.out, logs)
			}
		},
	}
	f := cmd.Flags()
	f.IntVarP(&opts.Limit, "limit", "n", 0, "the most lines shown, 1 to 1000 (default 1000)")
	f.DurationVar(&since, "since", 0, "only lines of this last stretch of time, e.g. 5m")
	f.StringVar(&opts.Level, "level", "", "only lines of this level or worse: debug, info, warn, error")
	f.StringVar(&opts.Search, "search", "", "only lines containing this text (case-sensitive)")
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new lines until interrupted")
	return cmd
}

// printLogs writes one line per entry: time (UTC), source, level, the
// message and the fields in key order.
func printLogs(w io.Writer, logs []client.LogEntry) {
	for _, l := range logs {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %-8s %-5s %s", l.Timestamp.UTC().Format("2006-01-02T15:04:05.000Z"), l.Source, l.Level, l.Message)
		for _, k := range slices.Sorted(maps.Keys(l.Fields)) {
			fmt.Fprintf(&b, " %s=%q", k, l.Fields[k])
		}
		fmt.Fprintln(w, b.String())
	}
}
