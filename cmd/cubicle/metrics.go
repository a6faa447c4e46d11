package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

func metricsCmd(a *app) *cobra.Command {
	var (
		history bool
		since   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "metrics ID",
		Short: "Show a sandbox's CPU, memory, disk and network figures",
		Long: `Show the latest resource figures the daemon sampled of a sandbox, as the
host measures them (its cgroup, or its VM's process): CPU as a share of the
CPUs it may use, memory, its own writable disk and its network counters.
--history lists every sample kept (the last 10 minutes by default), or
those of the last --since.`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if since < 0 {
				return usagef("--since must not be negative")
			}
			var opts client.MetricsOptions
			if since > 0 {
				opts.Since = now().Add(-since)
			}
			m, err := a.client().Metrics(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			if a.printJSON() {
				return nil
			}
			if history || since > 0 {
				printMetricsHistory(a.out, m.Samples)
				return nil
			}
			printMetrics(a.out, m)
			return nil
		},
	}
	cmd.Flags().BoolVar(&history, "history", false, "list every sample kept, oldest first")
	cmd.Flags().DurationVar(&since, "since", 0, "list the samples of this last stretch of time, e.g. 2m (implies --history)")
	return cmd
}

// printMetrics writes the latest sample of m.
func printMetrics(w io.Writer, m client.Metrics) {
	l := m.Latest
	if l == nil {
		fmt.Fprintf(w, "%s: no sample yet; the first comes %s after the sandbox starts running\n",
			m.SandboxID, time.Duration(m.IntervalSeconds*float64(time.Second)))
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "sandbox:\t%s (%s, %s), sampled %s ago\n", m.SandboxID, m.Backend, m.State, age(l.Timestamp))
	fmt.Fprintf(tw, "cpu:\t%.1f%% of %g CPUs (%.2f cores), %.1f s used\n", l.CPU.Percent, l.CPU.Count, l.CoresUsed(), l.CPU.UsedSeconds)
	fmt.Fprintf(tw, "memory:\t%s of %s (page cache %s)\n", humanBytes(l.Memory.UsedBytes), limitText(l.Memory.LimitBytes), humanBytes(l.Memory.CacheBytes))
	fmt.Fprintf(tw, "disk:\t%s of %s\n", humanBytes(l.Disk.UsedBytes), limitText(l.Disk.LimitBytes))
	if n := l.Network; n != nil {
		fmt.Fprintf(tw, "network:\treceived %s (%d packets), sent %s (%d packets)\n",
			humanBytes(int64(n.RxBytes)), n.RxPackets, humanBytes(int64(n.TxBytes)), n.TxPackets)
	} else {
		fmt.Fprintf(tw, "network:\tnone\n")
	}
	tw.Flush()
}

func limitText(n int64) string {
	if n <= 0 {
		return "no limit"
	}
	return humanBytes(n)
}

// printMetricsHistory writes one line per sample.
func printMetricsHistory(w io.Writer, samples []client.MetricsSample) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tCPU\tMEMORY\tDISK\tRX\tTX")
	for _, s := range samples {
		rx, tx := "-", "-"
		if n := s.Network; n != nil {
			rx, tx = humanBytes(int64(n.RxBytes)), humanBytes(int64(n.TxBytes))
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%s\t%s\t%s\t%s\n", s.Timestamp.Local().Format("15:04:05"), s.CPU.Percent,
			humanBytes(s.Memory.UsedBytes), humanBytes(s.Disk.UsedBytes), rx, tx)
	}
	tw.Flush()
}
