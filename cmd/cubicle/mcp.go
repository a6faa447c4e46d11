package main

import (
	"io"

	"runtime/debug"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/client"
	cubmcp "github.com/cubicle-dev/cubicle/internal/mcp"
)

func mcpCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve the MCP tools over stdio, for desktop MCP clients",
		Long: `Run an MCP (Model Context Protocol) server on standard input and output, for
a client that starts it as a command (Claude Desktop, Claude Code, Cursor):

  {"mcpServers": {"cubicle": {"command": "cubicle", "args": ["mcp"],
    "env": {"CUBICLE_URL": "http://127.0.0.1:7171", "CUBICLE_API_KEY": "…"}}}}

The tools create, list, extend, view and destroy sandboxes, drive a desktop
with Anthropic's computer actions (screenshot, left_click, type, key, scroll,
zoom, …) given a sandbox_id, run commands and read and write files. They act
on the daemon at --url with --api-key. Calls run in parallel. cubicled also
serves the same tools over Streamable HTTP at /mcp.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Not a.client(): its --json hook would be shared by calls
			// running in parallel.
			opts := []client.Option{client.WithAPIKey(a.apiKey), client.WithTimeout(a.timeout), client.WithUserAgent("cubicle-mcp")}
			if a.httpClient != nil {
				opts = append(opts, client.WithHTTPClient(a.httpClient))
			}
			c := client.New(a.url, opts...)
			srv := cubmcp.NewServer(func(*mcp.RequestExtra) cubmcp.Backend { return c }, cubmcp.Options{Version: buildVersion()})
			return srv.Run(cmd.Context(), &mcp.IOTransport{Reader: io.NopCloser(a.in), Writer: nopWriteCloser{a.out}})
		},
	}
}

// nopWriteCloser leaves standard output open when the session ends.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// buildVersion is the module version the binary was built from.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "dev"
}
