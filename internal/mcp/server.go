// Package mcp is cubicle's Model Context Protocol server: the tools an MCP
// client (Claude Desktop, Claude Code, Cursor, an agent framework) uses to
// create sandboxes, drive their desktops under Anthropic's computer-tool
// member names, run commands and move files. It is served over stdio by
// `cubicle mcp` and over Streamable HTTP at /mcp by cubicled; cmd/cubicle
// and cmd/cubicled import it, nothing else does.
//
// It is built on github.com/modelcontextprotocol/go-sdk, the SDK the MCP
// project maintains with Google: it speaks every revision clients still use
// (2024-11-05 through the stateless 2026-07-28, negotiated per client), has
// the stdio, command and Streamable HTTP transports, handles the calls of
// one connection concurrently, and validates typed tool arguments against
// their JSON Schema. mark3labs/mcp-go, the other Go SDK, trails the
// specification's revisions and would add nothing we need.
//
// One implementation serves both transports: the tools talk to the daemon
// through Backend, which is the public Go SDK's *client.Client. `cubicle
// mcp` points it at CUBICLE_URL with CUBICLE_API_KEY; cubicled's /mcp
// handler points it at the daemon's own REST API over loopback, with the
// caller's key. So an MCP call gets exactly what the same REST call gets —
// the key's ownership of sandboxes, quotas, rate and in-flight limits,
// validation, the computer endpoint's scaling (internal/computer's
// ParseAnthropic and Run, behind POST …/computer/anthropic), metrics and
// error messages — from one code path. The cost is one loopback HTTP round
// trip per call and a screenshot's base64 decoded from the REST answer and
// encoded again for MCP: TestMCP measured a 1024×576 screenshot at a
// median 13–21 ms over /mcp against 7–11 ms over REST on gVisor (two
// runs), of which an in-process implementation would save part (the MCP
// encoding remains). A
// second implementation on the sandbox manager and the agent would have
// to repeat the API's create, exec and file code and keep it in step.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cubicle-dev/cubicle/client"
)

// Backend is what the tools need of the daemon: a subset of the Go SDK's
// *client.Client, which is the one implementation.
type Backend interface {
	Create(ctx context.Context, req client.CreateRequest, opts ...client.CreateOption) (client.Sandbox, error)
	List(ctx context.Context, opts client.ListOptions) ([]client.Sandbox, error)
	Destroy(ctx context.Context, id string) error
	SetTimeout(ctx context.Context, id string, seconds int) (client.Sandbox, error)
	View(ctx context.Context, id string, req client.ViewRequest) (client.View, error)
	ComputerAnthropic(ctx context.Context, id string, body any) (json.RawMessage, error)
	Exec(ctx context.Context, id string, req client.ExecRequest) (client.ExecResult, error)
	Upload(ctx context.Context, id, path string, r io.Reader) (client.FileInfo, error)
	Download(ctx context.Context, id, path string) (io.ReadCloser, error)
	ClipboardGet(ctx context.Context, id string) (string, error)
	ClipboardSet(ctx context.Context, id, text string) error
}

var _ Backend = (*client.Client)(nil)

// BackendFor returns the backend a tool call runs on. extra carries the
// HTTP request's headers on Streamable HTTP (the caller's API key) and is
// nil or header-less on stdio.
type BackendFor func(extra *mcp.RequestExtra) Backend

// MaxFileBytes bounds what read_file returns and write_file takes: a file
// goes through the model's context, base64 for binary.
const MaxFileBytes = 4 << 20

// progressEvery is how often a long call reports progress to a client
// that asked for it (a progress token): clients time a call out after
// some tens of seconds without a word (cua #425).
const progressEvery = time.Second

// Options configure NewServer.
type Options struct {
	// Version is reported to clients as the server's version.
	Version string
}

// NewServer returns the MCP server with every tool, running each call on
// the backend backend returns for it.
func NewServer(backend BackendFor, opts Options) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "cubicle", Title: "cubicle sandboxes", Version: opts.Version}, &mcp.ServerOptions{
		Instructions: instructions,
	})
	t := &tools{backend: backend}
	t.addLifecycle(s)
	t.addComputer(s)
	t.addCommandsAndFiles(s)
	t.addClipboard(s)
	return s
}

const instructions = `cubicle gives you isolated Linux desktops (sandboxes). Call create_sandbox, then pass the sandbox_id it returns to every other tool. The desktop tools are named after the actions of Anthropic's computer tool (screenshot, left_click, type, key, scroll, zoom, …); coordinates are in the pixels of the screenshots they return. clipboard_get and clipboard_set read and write the desktop's clipboard, which is faster than typing long text: set it, then press ctrl+v. Destroy a sandbox when you are done with it.`

type tools struct {
	backend BackendFor
}

// run runs fn on the call's backend, reporting progress every second to a
// client that gave a progress token, and turns an error into an isError
// result: a tool's failure is the model's to read, not a protocol error.
func (t *tools) run(ctx context.Context, req *mcp.CallToolRequest, what string, fn func(context.Context, Backend) (*mcp.CallToolResult, error)) (*mcp.CallToolResult, error) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if token := req.Params.GetProgressToken(); token != nil && req.Session != nil {
		go func() {
			start := time.Now()
			tick := time.NewTicker(progressEvery)
			defer tick.Stop()
			for n := 1; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
						ProgressToken: token, Progress: float64(n),
						Message: fmt.Sprintf("%s: %.0f s", what, time.Since(start).Seconds()),
					})
				}
			}
		}()
	}
	res, err := fn(ctx, t.backend(req.Extra))
	stop()
	if err != nil {
		return errorResult(err), nil
	}
	return res, nil
}

// errorResult is a tool result telling the model what went wrong.
func errorResult(err error) *mcp.CallToolResult {
	msg := err.Error()
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Message != "" {
		msg = ae.Message
		if ae.Code != "" {
			msg += " (" + ae.Code + ")"
		}
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

func textResult(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

// jsonResult answers v as indented JSON text and as structured content.
func jsonResult(v any) *mcp.CallToolResult {
	b, _ := json.MarshalIndent(v, "", "  ")
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: v}
}

// readOnly, destructive and plain annotate the tools for clients that ask
// a person before running some.
var (
	readOnly    = &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)}
	destructive = &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)}
	plain       = &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)}
)

func ptr[T any](v T) *T { return &v }

// SandboxRef is the handle argument of every per-sandbox tool.
type SandboxRef struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
}

// CreateArgs are create_sandbox's arguments.
type CreateArgs struct {
	Template       string            `json:"template,omitempty" jsonschema:"image to boot: desktop (the default) or another built image"`
	Backend        string            `json:"backend,omitempty" jsonschema:"firecracker, qemu, gvisor or runc; default: the daemon's"`
	Width          int               `json:"width,omitempty" jsonschema:"screen width in pixels (with height); default: the daemon's"`
	Height         int               `json:"height,omitempty" jsonschema:"screen height in pixels (with width)"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"lifetime from now in seconds; 0: the daemon's maximum"`
	StartURL       string            `json:"start_url,omitempty" jsonschema:"open Chromium at this URL once the desktop is up"`
	Metadata       map[string]string `json:"metadata,omitempty" jsonschema:"labels to find the sandbox by"`
}

// ExtendArgs are extend_sandbox's arguments.
type ExtendArgs struct {
	SandboxID      string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	TimeoutSeconds int    `json:"timeout_seconds" jsonschema:"the sandbox expires this many seconds from now; 0: the daemon's maximum lifetime"`
}

// ViewArgs are view_sandbox's arguments.
type ViewArgs struct {
	SandboxID   string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Interactive bool   `json:"interactive,omitempty" jsonschema:"let the viewer control the desktop, not only watch"`
	TTLSeconds  int    `json:"ttl_seconds,omitempty" jsonschema:"how long the link works; 0: the daemon's default"`
}

// sandboxInfo is what the lifecycle tools tell about a sandbox.
type sandboxInfo struct {
	SandboxID  string            `json:"sandbox_id"`
	State      string            `json:"state"`
	Template   string            `json:"template,omitempty"`
	Backend    string            `json:"backend,omitempty"`
	Resolution string            `json:"resolution,omitempty"`
	ExpiresAt  string            `json:"expires_at,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Error      string            `json:"error,omitempty"`
}

func info(sb client.Sandbox) sandboxInfo {
	in := sandboxInfo{SandboxID: sb.ID, State: sb.State, Template: sb.Template, Backend: sb.Backend,
		Metadata: sb.Metadata, Error: sb.Error}
	if sb.Resolution.Width > 0 {
		in.Resolution = sb.Resolution.String()
	}
	if !sb.ExpiresAt.IsZero() {
		in.ExpiresAt = sb.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return in
}

func (t *tools) addLifecycle(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "create_sandbox", Annotations: plain,
		Description: "Create a sandbox: an isolated Linux desktop. Returns its sandbox_id, which every other tool takes. Waits until the desktop is ready (seconds)."},
		func(ctx context.Context, req *mcp.CallToolRequest, in CreateArgs) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "create_sandbox", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				cr := client.CreateRequest{Template: in.Template, Backend: in.Backend, TimeoutSeconds: in.TimeoutSeconds,
					StartURL: in.StartURL, Metadata: in.Metadata}
				if (in.Width == 0) != (in.Height == 0) {
					return nil, errors.New("give width and height together")
				}
				if in.Width > 0 {
					cr.Resolution = &client.Resolution{Width: in.Width, Height: in.Height}
				}
				sb, err := b.Create(ctx, cr)
				if err != nil {
					return nil, err
				}
				return jsonResult(info(sb)), nil
			})
			return res, nil, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "list_sandboxes", Annotations: readOnly,
		Description: "List your sandboxes with their state and expiry."},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "list_sandboxes", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				sbs, err := b.List(ctx, client.ListOptions{})
				if err != nil {
					return nil, err
				}
				out := struct {
					Sandboxes []sandboxInfo `json:"sandboxes"`
				}{Sandboxes: []sandboxInfo{}}
				for _, sb := range sbs {
					out.Sandboxes = append(out.Sandboxes, info(sb))
				}
				return jsonResult(out), nil
			})
			return res, nil, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "destroy_sandbox", Annotations: destructive,
		Description: "Destroy a sandbox and everything in it."},
		func(ctx context.Context, req *mcp.CallToolRequest, in SandboxRef) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "destroy_sandbox", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				if err := b.Destroy(ctx, in.SandboxID); err != nil {
					return nil, err
				}
				return textResult("sandbox %s destroyed", in.SandboxID), nil
			})
			return res, nil, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "extend_sandbox", Annotations: plain,
		Description: "Set when a sandbox expires: timeout_seconds from now."},
		func(ctx context.Context, req *mcp.CallToolRequest, in ExtendArgs) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "extend_sandbox", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				if in.TimeoutSeconds < 0 {
					return nil, errors.New("timeout_seconds must be 0 or more")
				}
				sb, err := b.SetTimeout(ctx, in.SandboxID, in.TimeoutSeconds)
				if err != nil {
					return nil, err
				}
				return jsonResult(info(sb)), nil
			})
			return res, nil, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "view_sandbox", Annotations: plain,
		Description: "Get a link a person can open in a browser to watch the sandbox's desktop live (and, with interactive, control it). The link needs no key until it expires: share it only with whom may see the desktop."},
		func(ctx context.Context, req *mcp.CallToolRequest, in ViewArgs) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "view_sandbox", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				v, err := b.View(ctx, in.SandboxID, client.ViewRequest{TTLSeconds: in.TTLSeconds, ViewOnly: !in.Interactive})
				if err != nil {
					return nil, err
				}
				out := struct {
					URL       string `json:"url"`
					ExpiresAt string `json:"expires_at,omitempty"`
					ViewOnly  bool   `json:"view_only"`
				}{URL: v.URL, ViewOnly: v.ViewOnly}
				if !v.ExpiresAt.IsZero() {
					out.ExpiresAt = v.ExpiresAt.UTC().Format(time.RFC3339)
				}
				return jsonResult(out), nil
			})
			return res, nil, err
		})
}

// RunArgs are run_command's arguments.
type RunArgs struct {
	SandboxID      string            `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Command        string            `json:"command" jsonschema:"a shell command, run by /bin/sh -c with DISPLAY set to the sandbox's desktop"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"fed to the command's standard input"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this long; 0: the daemon's default"`
}

// ReadArgs are read_file's arguments.
type ReadArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Path      string `json:"path" jsonschema:"absolute path of the file in the sandbox"`
}

// WriteArgs are write_file's arguments.
type WriteArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Path      string `json:"path" jsonschema:"absolute path of the file in the sandbox; missing directories are made"`
	Content   string `json:"content" jsonschema:"the file's content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64, for binary content"`
}

// runOutput is run_command's structured answer.
type runOutput struct {
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMS int64  `json:"duration_ms"`
	Truncated  bool   `json:"truncated,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
}

func (t *tools) addCommandsAndFiles(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "run_command", Annotations: plain,
		Description: "Run a shell command in a sandbox to completion and return its exit code, stdout and stderr. A non-zero exit code is reported, not an error of the tool."},
		func(ctx context.Context, req *mcp.CallToolRequest, in RunArgs) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "run_command", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				if strings.TrimSpace(in.Command) == "" {
					return nil, errors.New("command is empty")
				}
				r, err := b.Exec(ctx, in.SandboxID, client.ExecRequest{Command: in.Command, Cwd: in.Cwd, Env: in.Env,
					Stdin: in.Stdin, TimeoutSeconds: in.TimeoutSeconds})
				if err != nil {
					return nil, err
				}
				out := runOutput{ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr, DurationMS: r.DurationMS,
					Truncated: r.Truncated, TimedOut: r.TimedOut}
				var text strings.Builder
				fmt.Fprintf(&text, "exit code %d", r.ExitCode)
				if r.TimedOut {
					text.WriteString(" (timed out)")
				}
				if r.Truncated {
					text.WriteString(" (output truncated)")
				}
				fmt.Fprintf(&text, "\n--- stdout ---\n%s", r.Stdout)
				if r.Stderr != "" {
					fmt.Fprintf(&text, "\n--- stderr ---\n%s", r.Stderr)
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text.String()}}, StructuredContent: out}, nil
			})
			return res, nil, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Annotations: readOnly,
		Description: fmt.Sprintf("Read a file of a sandbox (at most %d MiB). Text comes back as text; other bytes as base64, said so.", MaxFileBytes>>20)},
		func(ctx context.Context, req *mcp.CallToolRequest, in ReadArgs) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "read_file", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				rc, err := b.Download(ctx, in.SandboxID, in.Path)
				if err != nil {
					return nil, err
				}
				defer rc.Close()
				data, err := io.ReadAll(io.LimitReader(rc, MaxFileBytes+1))
				if err != nil {
					return nil, fmt.Errorf("read %s: %w", in.Path, err)
				}
				if len(data) > MaxFileBytes {
					return nil, fmt.Errorf("%s is larger than %d MiB; read a part of it with run_command (head, tail, sed -n)", in.Path, MaxFileBytes>>20)
				}
				if utf8.Valid(data) {
					return textResult("%s", data), nil
				}
				return textResult("%s is binary (%d bytes); base64:\n%s", in.Path, len(data), encodeBase64(data)), nil
			})
			return res, nil, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Annotations: plain,
		Description: "Write a file in a sandbox, replacing it if it exists."},
		func(ctx context.Context, req *mcp.CallToolRequest, in WriteArgs) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "write_file", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				var data []byte
				switch in.Encoding {
				case "", "utf-8", "utf8":
					data = []byte(in.Content)
				case "base64":
					var err error
					if data, err = decodeBase64(in.Content); err != nil {
						return nil, fmt.Errorf("content is not base64: %v", err)
					}
				default:
					return nil, fmt.Errorf("encoding must be utf-8 or base64, not %q", in.Encoding)
				}
				if len(data) > MaxFileBytes {
					return nil, fmt.Errorf("content is larger than %d MiB", MaxFileBytes>>20)
				}
				fi, err := b.Upload(ctx, in.SandboxID, in.Path, strings.NewReader(string(data)))
				if err != nil {
					return nil, err
				}
				return textResult("wrote %d bytes to %s", fi.Size, in.Path), nil
			})
			return res, nil, err
		})
}
