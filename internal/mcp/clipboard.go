package mcp

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ClipboardSetArgs are clipboard_set's arguments.
type ClipboardSetArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Text      string `json:"text" jsonschema:"the text to put on the clipboard (any Unicode, at most 64 KiB)"`
}

// clipboardText is clipboard_get's structured answer.
type clipboardText struct {
	Text string `json:"text"`
}

// addClipboard adds clipboard_get and clipboard_set: the native
// clipboard_get and clipboard_set actions (POST …/actions), which
// Anthropic's computer tool has no member for.
func (t *tools) addClipboard(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "clipboard_get", Annotations: readOnly,
		Description: `Read the text on the sandbox desktop's clipboard (what ctrl+c copied last). Answers {"text": …}; "" when the clipboard is empty or holds no text.`},
		func(ctx context.Context, req *mcp.CallToolRequest, in SandboxRef) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "clipboard_get", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				text, err := b.ClipboardGet(ctx, in.SandboxID)
				if err != nil {
					return nil, err
				}
				return jsonResult(clipboardText{Text: text}), nil
			})
			return res, nil, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "clipboard_set", Annotations: plain,
		Description: "Put text on the sandbox desktop's clipboard, for ctrl+v to paste into the focused field. Faster and more exact than typing long text, and takes characters no keyboard has."},
		func(ctx context.Context, req *mcp.CallToolRequest, in ClipboardSetArgs) (*mcp.CallToolResult, any, error) {
			res, err := t.run(ctx, req, "clipboard_set", func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
				if in.Text == "" {
					return nil, errors.New("text is empty: give the text to put on the clipboard")
				}
				if err := b.ClipboardSet(ctx, in.SandboxID, in.Text); err != nil {
					return nil, err
				}
				return textResult("the clipboard holds the %d characters given; press ctrl+v to paste them", len([]rune(in.Text))), nil
			})
			return res, nil, err
		})
}
