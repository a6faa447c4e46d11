package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

func screenshotCmd(a *app) *cobra.Command {
	var (
		opts   client.ScreenshotOptions
		region string
		output string
	)
	cmd := &cobra.Command{
		Use:   "screenshot ID",
		Short: "Save a screenshot of the sandbox's desktop",
		Long: `Save a screenshot. With -o FILE the format follows the file's extension
(.jpg/.jpeg: jpeg) unless --format says otherwise; without -o (or -o -) the
image goes to standard output, which must not be a terminal.`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if region != "" {
				r, err := parseRegion(region)
				if err != nil {
					return usageError{err}
				}
				opts.Region = r
			}
			if opts.Format == "" {
				switch strings.ToLower(filepath.Ext(output)) {
				case ".jpg", ".jpeg":
					opts.Format = "jpeg"
				}
			}
			toStdout := output == "" || output == "-"
			if toStdout && isTerminal(a.out) {
				return errNoOutput
			}
			img, err := a.client().Screenshot(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			if toStdout {
				_, err = a.out.Write(img)
				return err
			}
			if err := os.WriteFile(output, img, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "%s (%d bytes)\n", output, len(img))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&output, "output", "o", "", "write the image to this file (- = stdout)")
	f.StringVar(&opts.Format, "format", "", "png or jpeg (default png, or from -o's extension)")
	f.IntVar(&opts.Quality, "quality", 0, "JPEG quality 1..100")
	f.Float64Var(&opts.Scale, "scale", 0, "downscale factor 0.1..1")
	f.IntVar(&opts.Width, "width", 0, "downscale to this width, keeping aspect")
	f.StringVar(&region, "region", "", "crop to x,y,w,h")
	f.BoolVar(&opts.Cursor, "cursor", false, "draw the mouse pointer")
	return cmd
}

// runActions performs actions and prints the raw answer for --json.
func (a *app) runActions(cmd *cobra.Command, id string, actions ...client.Action) (client.ActionsResponse, error) {
	resp, err := a.client().Actions(cmd.Context(), id, actions...)
	if err != nil {
		return resp, err
	}
	a.printJSON()
	return resp, nil
}

func clickCmd(a *app) *cobra.Command {
	var (
		button string
		count  int
	)
	cmd := &cobra.Command{
		Use:   "click ID X Y",
		Short: "Click at X,Y",
		Args:  exactArgs("ID", "X", "Y"),
		RunE: func(cmd *cobra.Command, args []string) error {
			xy, err := parseInts(args[1:])
			if err != nil {
				return usageError{err}
			}
			act := client.ClickAt(xy[0], xy[1])
			act.Button = button
			if count != 1 {
				act.Count = count
			}
			_, err = a.runActions(cmd, args[0], act)
			return err
		},
	}
	cmd.Flags().StringVar(&button, "button", "", "left, right or middle (default left)")
	cmd.Flags().IntVar(&count, "count", 1, "number of clicks: 1, 2 or 3")
	return cmd
}

func moveCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "move ID X Y",
		Short: "Move the pointer to X,Y",
		Args:  exactArgs("ID", "X", "Y"),
		RunE: func(cmd *cobra.Command, args []string) error {
			xy, err := parseInts(args[1:])
			if err != nil {
				return usageError{err}
			}
			_, err = a.runActions(cmd, args[0], client.MoveTo(xy[0], xy[1]))
			return err
		},
	}
}

func dragCmd(a *app) *cobra.Command {
	var button string
	cmd := &cobra.Command{
		Use:   "drag ID X1 Y1 X2 Y2 [X3 Y3 ...]",
		Short: "Drag along a path of points",
		Args:  minArgs(5, "an ID and at least two points"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pts, err := parsePoints(args[1:])
			if err != nil {
				return usageError{err}
			}
			act := client.DragPath(pts...)
			act.Button = button
			_, err = a.runActions(cmd, args[0], act)
			return err
		},
	}
	cmd.Flags().StringVar(&button, "button", "", "left, right or middle (default left)")
	return cmd
}

func scrollCmd(a *app) *cobra.Command {
	var (
		direction string
		amount    int
		x, y      int
	)
	cmd := &cobra.Command{
		Use:   "scroll ID",
		Short: "Scroll the wheel",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch direction {
			case "up", "down", "left", "right":
			default:
				return usagef("--direction %q: want up, down, left or right", direction)
			}
			act := client.ScrollBy(direction, amount)
			xSet, ySet := cmd.Flags().Changed("x"), cmd.Flags().Changed("y")
			if xSet != ySet {
				return usagef("--x and --y go together")
			}
			if xSet {
				act.X, act.Y = &x, &y
			}
			_, err := a.runActions(cmd, args[0], act)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&direction, "direction", "down", "up, down, left or right")
	f.IntVar(&amount, "amount", 3, "wheel steps")
	f.IntVar(&x, "x", 0, "scroll at this x (default: where the pointer is)")
	f.IntVar(&y, "y", 0, "scroll at this y")
	return cmd
}

func typeCmd(a *app) *cobra.Command {
	var delay int
	cmd := &cobra.Command{
		Use:   "type ID TEXT",
		Short: "Type TEXT (any Unicode) into the focused window",
		Args:  exactArgs("ID", "TEXT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			act := client.TypeText(args[1])
			act.DelayMS = delay
			_, err := a.runActions(cmd, args[0], act)
			return err
		},
	}
	cmd.Flags().IntVar(&delay, "delay-ms", 0, "delay between keystrokes in ms")
	return cmd
}

func keyCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "key ID COMBO",
		Short:   "Press a key combination, e.g. ctrl+shift+t, enter, esc",
		Example: "  cubicle key abc123 ctrl+l",
		Args:    exactArgs("ID", "COMBO"),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := a.runActions(cmd, args[0], client.PressKey(args[1]))
			return err
		},
	}
}

func windowsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "windows ID",
		Short: "List the desktop's top-level windows (focused one marked *)",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := a.runActions(cmd, args[0], client.Action{Type: client.ActionWindows})
			if err != nil || a.jsonOut || len(resp.Results) == 0 {
				return err
			}
			for _, w := range resp.Results[0].Windows {
				mark := " "
				if w.Focused {
					mark = "*"
				}
				fmt.Fprintf(a.out, "%s %-10v %-20s %4dx%-4d %q\n", mark, w.ID, w.Class, w.Width, w.Height, w.Title)
			}
			return nil
		},
	}
}
