package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
)

// execRequest builds the API request from exec's arguments: one argument
// is a shell command line run by /bin/sh -c (as ssh does), several are an
// exact argv.
func execRequest(args []string) client.ExecRequest {
	if len(args) == 1 {
		return client.ExecRequest{Command: args[0]}
	}
	return client.ExecRequest{Argv: args}
}

func execCmd(a *app) *cobra.Command {
	var (
		env        []string
		timeout    secondsValue
		background bool
		stdin      bool
		user, cwd  string
	)
	cmd := &cobra.Command{
		Use:   "exec ID -- CMD [ARGS...]",
		Short: "Run a command in a sandbox, streaming its output",
		Long: `Run a command in the sandbox and stream its output live; cubicle exits with
the command's exit code. A single argument is run by /bin/sh -c (so pipes and
globs work, as with ssh); several arguments are an exact argv. DISPLAY is set,
so GUI programs work.`,
		Example: `  cubicle exec abc123 -- ls -la /root
  cubicle exec abc123 -- 'ps aux | grep chromium'
  cubicle exec abc123 --background -- chromium https://example.org`,
		Args: minArgs(2, "an ID and a command (cubicle exec ID -- CMD ARGS...)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := execRequest(args[1:])
			var err error
			if req.Env, err = parseKV(env); err != nil {
				return usagef("--env %v", err)
			}
			req.User, req.Cwd, req.TimeoutSeconds = user, cwd, int(timeout)
			if stdin {
				b, err := io.ReadAll(a.in)
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				req.Stdin = string(b)
			}
			c := a.client()
			id := args[0]
			if background {
				pid, err := c.ExecBackground(cmd.Context(), id, req)
				if err != nil {
					return err
				}
				if !a.printJSON() {
					fmt.Fprintln(a.out, pid)
				}
				return nil
			}
			var code int
			if a.jsonOut {
				// Machine output wants the one JSON answer, not a stream.
				res, err := c.Exec(cmd.Context(), id, req)
				if err != nil {
					return err
				}
				a.printJSON()
				code = res.ExitCode
			} else {
				code, err = c.ExecStreamTo(cmd.Context(), id, req, a.out, a.errOut)
				if err != nil {
					return err
				}
			}
			if code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&background, "background", false, "start the command and print its pid; it keeps running")
	f.StringVar(&user, "user", "", "run as this user")
	f.StringVar(&cwd, "cwd", "", "working directory")
	f.StringArrayVar(&env, "env", nil, "environment variable K=V (repeatable)")
	f.Var(&timeout, "timeout", "kill the command after this long, e.g. 60 or 5m")
	f.BoolVarP(&stdin, "stdin", "i", false, "send this program's standard input to the command")
	return cmd
}
