package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

const defaultURL = "http://127.0.0.1:7171"

// app holds what every command needs: standard streams, the environment and
// the global flags. Tests build one with fake streams and environment.
type app struct {
	in     io.Reader
	out    io.Writer
	errOut io.Writer
	getenv func(string) string

	// Global flags.
	url     string
	apiKey  string
	jsonOut bool
	timeout time.Duration

	// httpClient, when set, replaces the SDK's default (tests).
	httpClient *http.Client
	// lastJSON is the body of the last JSON answer, printed by --json.
	lastJSON []byte
	// openURL opens a URL in a browser (view --open).
	openURL func(string) error
	// images performs the local image subcommands.
	images imageOps
}

func newApp(in io.Reader, out, errOut io.Writer, getenv func(string) string) *app {
	return &app{
		in: in, out: out, errOut: errOut, getenv: getenv,
		openURL: func(u string) error { return exec.Command("xdg-open", u).Run() },
		images:  localImages{},
	}
}

// client returns an SDK client for the global flags.
func (a *app) client() *client.Client {
	opts := []client.Option{
		client.WithAPIKey(a.apiKey),
		client.WithTimeout(a.timeout),
		client.WithUserAgent("cubicle-cli"),
		client.WithResponseHook(func(_ *http.Response, body []byte) { a.lastJSON = body }),
	}
	if a.httpClient != nil {
		opts = append(opts, client.WithHTTPClient(a.httpClient))
	}
	return client.New(a.url, opts...)
}

// printJSON writes the last raw API answer (--json) and reports whether it
// did; commands print their human output when it did not.
func (a *app) printJSON() bool {
	if !a.jsonOut {
		return false
	}
	if len(a.lastJSON) > 0 {
		var v any
		if json.Unmarshal(a.lastJSON, &v) == nil {
			b, _ := json.MarshalIndent(v, "", "  ")
			fmt.Fprintln(a.out, string(b))
		} else {
			fmt.Fprintln(a.out, string(a.lastJSON))
		}
	}
	return true
}

// exitError ends the CLI with a given status and no message: exec passes the
// command's exit code through it.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a mistake in the command line; it exits with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exactArgs is cobra.ExactArgs naming the expected arguments and returning
// a usageError.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usagef("%s takes %d argument(s): %v, got %d", cmd.Name(), len(names), names, len(args))
		}
		return nil
	}
}

func minArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usagef("%s needs %s", cmd.Name(), what)
		}
		return nil
	}
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "cubicle",
		Short: "Control cubicle computer-use sandboxes",
		Long: `cubicle talks to a cubicle daemon (cubicled) to create sandboxes with a
desktop, drive them, run commands and copy files. The image subcommands run
locally and need root. "cubicle mcp" serves the same abilities as MCP tools
over stdio, for Claude Desktop and other MCP clients.

Environment: CUBICLE_URL (daemon address), CUBICLE_API_KEY, CUBICLE_IMAGE_DIR.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	envOr := func(k, def string) string {
		if v := a.getenv(k); v != "" {
			return v
		}
		return def
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.url, "url", envOr("CUBICLE_URL", defaultURL), "daemon URL (env CUBICLE_URL)")
	pf.StringVar(&a.apiKey, "api-key", a.getenv("CUBICLE_API_KEY"), "API key (env CUBICLE_API_KEY)")
	pf.BoolVar(&a.jsonOut, "json", false, "print the daemon's raw JSON answer")
	pf.DurationVar(&a.timeout, "timeout", 0, "bound each API call (0 = none); on create and exec, --timeout means the sandbox's lifetime and the command's limit instead")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	root.AddCommand(
		createCmd(a), listCmd(a), getCmd(a), rmCmd(a), extendCmd(a), pauseCmd(a), resumeCmd(a),
		screenshotCmd(a), clickCmd(a), moveCmd(a), dragCmd(a), scrollCmd(a), typeCmd(a), keyCmd(a), windowsCmd(a),
		execCmd(a), cpCmd(a), infoCmd(a), viewCmd(a), imageCmd(a), volumeCmd(a), snapshotCmd(a), recordingCmd(a), forkCmd(a),
		metricsCmd(a), logsCmd(a),
		mcpCmd(a),
	)
	return root
}

// run executes the CLI with args and returns the process exit status.
func run(ctx context.Context, a *app, args []string) int {
	root := newRootCmd(a)
	root.SetArgs(args)
	root.SetIn(a.in)
	root.SetOut(a.out)
	root.SetErr(a.errOut)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		fmt.Fprintf(a.errOut, "error: cannot reach cubicled at %s (connection refused); is it running? Set --url or CUBICLE_URL\n", a.url)
	} else {
		fmt.Fprintln(a.errOut, formatError(err))
	}
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		fmt.Fprintln(a.errOut, "Run 'cubicle --help' for usage.")
		return 2
	}
	return 1
}

// isCobraUsage recognises cobra's own argument errors (unknown command).
func isCobraUsage(err error) bool {
	msg := err.Error()
	return len(msg) > 16 && msg[:16] == "unknown command "
}

// formatError renders err for the terminal: "error: <message> (<code>)" for
// an API error, "error: <err>" otherwise.
func formatError(err error) string {
	var ae *client.APIError
	if errors.As(err, &ae) {
		msg := ae.Message
		if msg == "" {
			msg = http.StatusText(ae.Status)
		}
		if ae.Index != nil {
			msg = fmt.Sprintf("action %d: %s", *ae.Index, msg)
		}
		return fmt.Sprintf("error: %s (%s)", msg, ae.Code)
	}
	if errors.Is(err, context.Canceled) {
		return "error: interrupted"
	}
	return "error: " + err.Error()
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
