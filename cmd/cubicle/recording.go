package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

func recordingCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "recording",
		Aliases: []string{"recordings"},
		Short:   "Record a sandbox's screen to a video file (WebM or MP4)",
		Long: `A recording is a video of a sandbox's screen, from start to stop. A frame is
taken only when the screen changed (at most --fps a second), so a still screen
costs next to nothing. It stops on "cubicle recording stop", or when the
sandbox stops; the file is kept after the sandbox is gone for the daemon's
--recording-retention. Recordings belong to your API key.`,
	}
	var opts client.RecordingOptions
	start := &cobra.Command{
		Use:   "start SANDBOX_ID",
		Short: "Start recording a running sandbox's screen and print the recording's ID",
		Args:  exactArgs("SANDBOX_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.client().StartRecording(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			if !a.printJSON() {
				fmt.Fprintln(a.out, r.ID)
			}
			return nil
		},
	}
	start.Flags().IntVar(&opts.FPS, "fps", 0, "most frames a second, 1..30 (default 5)")
	start.Flags().Float64Var(&opts.Scale, "scale", 0, "video size relative to the screen, 0.1..1 (default 1)")
	start.Flags().StringVar(&opts.Format, "format", "", "webm (VP8, default) or mp4 (H.264)")
	stop := &cobra.Command{
		Use:   "stop SANDBOX_ID RECORDING_ID",
		Short: "Stop a recording; returns once its file is complete",
		Args:  exactArgs("SANDBOX_ID", "RECORDING_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.client().StopRecording(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printRecordingTable(a.out, []client.Recording{r})
			}
			return nil
		},
	}
	var of string
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your recordings",
		Args:    exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs, err := a.client().ListRecordings(cmd.Context(), of)
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printRecordingTable(a.out, rs)
			}
			return nil
		},
	}
	ls.Flags().StringVar(&of, "sandbox", "", "only the recordings of this sandbox")
	get := &cobra.Command{
		Use:   "get RECORDING_ID",
		Short: "Show one recording",
		Args:  exactArgs("RECORDING_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.client().GetRecording(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !a.printJSON() {
				printRecordingTable(a.out, []client.Recording{r})
			}
			return nil
		},
	}
	var output string
	download := &cobra.Command{
		Use:   "download RECORDING_ID",
		Short: "Save a stopped recording's video (to ID.webm or ID.mp4, or -o FILE; -o - for stdout)",
		Args:  exactArgs("RECORDING_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			dst := output
			if dst == "" {
				// The name is made of what the user typed, checked, and
				// a known format: not of what the server answers, which
				// could name a path anywhere.
				if !recordingIDPattern.MatchString(args[0]) {
					return fmt.Errorf("%q is not a recording ID; give -o FILE to name the output", args[0])
				}
				r, err := c.GetRecording(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if r.Format != "webm" && r.Format != "mp4" {
					return fmt.Errorf("recording %s has format %q, not webm or mp4; give -o FILE to name the output", args[0], r.Format)
				}
				dst = args[0] + "." + r.Format
			}
			body, err := c.DownloadRecording(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer body.Close()
			if dst == "-" {
				_, err := io.Copy(a.out, body)
				return err
			}
			// Written aside and renamed, so a broken download leaves no
			// half a video under the name.
			tmp, err := os.CreateTemp(filepath.Dir(dst), ".cubicle-recording-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			if _, err := io.Copy(tmp, body); err != nil {
				tmp.Close()
				return fmt.Errorf("download %s: %w", args[0], err)
			}
			if err := tmp.Close(); err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), dst); err != nil {
				return err
			}
			fmt.Fprintln(a.errOut, dst)
			return nil
		},
	}
	download.Flags().StringVarP(&output, "output", "o", "", "file to write (- for stdout)")
	rm := &cobra.Command{
		Use:     "rm RECORDING_ID...",
		Aliases: []string{"delete"},
		Short:   "Delete recordings and their files (one in progress is stopped first)",
		Args:    minArgs(1, "at least one recording"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			return a.each(args, func(id string) error { return c.DeleteRecording(cmd.Context(), id) })
		},
	}
	cmd.AddCommand(start, stop, ls, get, download, rm)
	return cmd
}

// recordingIDPattern is the form of recording IDs (the daemon's
// sandbox.ValidRecordingID).
var recordingIDPattern = regexp.MustCompile(`^[a-z2-7]{26}$`)

func printRecordingTable(w io.Writer, rs []client.Recording) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSANDBOX\tSTATE\tFORMAT\tSIZE\tDURATION\tFRAMES\tBYTES\tAGE")
	for _, r := range rs {
		state := r.State
		if r.Error != "" {
			state += " (" + r.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dx%d\t%s\t%d\t%s\t%s\n", r.ID, r.SandboxID, state, r.Format, r.Width, r.Height,
			(time.Duration(r.DurationMS) * time.Millisecond).Round(100*time.Millisecond), r.Frames, humanBytes(r.SizeBytes), age(r.StartedAt))
	}
	_ = tw.Flush()
}
