package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/computer"
)

// The parameters of Anthropic's computer actions, as JSON Schema
// properties (agent-protocols.md, "Anthropic computer use").
var (
	pCoordinate = map[string]any{"type": "array", "items": map[string]any{"type": "integer"}, "minItems": 2, "maxItems": 2,
		"description": "[x, y] in the pixels of the screenshots"}
	pStart = map[string]any{"type": "array", "items": map[string]any{"type": "integer"}, "minItems": 2, "maxItems": 2,
		"description": "[x, y] where the drag starts"}
	pModifiers = map[string]any{"type": "string", "description": `modifier keys held during the action, xdotool style ("ctrl", "shift+alt")`}
	pKeys      = map[string]any{"type": "string", "description": `keys in xdotool syntax: "Return", "ctrl+s", "alt+Tab"; several combos separated by spaces are pressed in turn`}
	pText      = map[string]any{"type": "string", "description": "the text to type (any Unicode)"}
	pRepeat    = map[string]any{"type": "integer", "minimum": 1, "maximum": 100, "description": "press the keys this many times (default 1)"}
	pDirection = map[string]any{"type": "string", "enum": []string{"up", "down", "left", "right"}}
	pAmount    = map[string]any{"type": "integer", "minimum": 1, "description": "wheel clicks"}
	pDuration  = map[string]any{"type": "number", "exclusiveMinimum": 0, "maximum": 100, "description": "seconds"}
	pRegion    = map[string]any{"type": "array", "items": map[string]any{"type": "integer"}, "minItems": 4, "maxItems": 4,
		"description": "[x0, y0, x1, y1] in screenshot pixels; answered at the screen's full resolution"}
)

// computerAction describes one action tool: its parameters (name →
// schema), the required ones and its description.
type computerAction struct {
	params   map[string]map[string]any
	required []string
	doc      string
}

var clickParams = map[string]map[string]any{"coordinate": pCoordinate, "text": pModifiers}

// computerActions has an entry for each of computer.AnthropicActions();
// TestComputerToolsCoverAnthropic checks that.
var computerActions = map[string]computerAction{
	"key":             {map[string]map[string]any{"text": pKeys, "repeat": pRepeat}, []string{"text"}, "Press a key or key combination."},
	"type":            {map[string]map[string]any{"text": pText}, []string{"text"}, "Type text."},
	"mouse_move":      {map[string]map[string]any{"coordinate": pCoordinate}, []string{"coordinate"}, "Move the mouse pointer."},
	"left_click":      {clickParams, nil, "Click the left button, at coordinate or where the pointer is, with modifiers held."},
	"left_click_drag": {map[string]map[string]any{"start_coordinate": pStart, "coordinate": pCoordinate}, []string{"coordinate"}, "Drag with the left button from start_coordinate (or the pointer) to coordinate."},
	"right_click":     {clickParams, nil, "Click the right button."},
	"middle_click":    {clickParams, nil, "Click the middle button."},
	"double_click":    {clickParams, nil, "Double-click the left button."},
	"triple_click":    {clickParams, nil, "Triple-click the left button (selects a line)."},
	"screenshot":      {nil, nil, "Take a screenshot of the desktop."},
	"cursor_position": {nil, nil, "Report the pointer's position, as X=…,Y=… in screenshot pixels."},
	"left_mouse_down": {map[string]map[string]any{"coordinate": pCoordinate}, nil, "Press the left button and keep it down."},
	"left_mouse_up":   {map[string]map[string]any{"coordinate": pCoordinate}, nil, "Release the left button."},
	"scroll": {map[string]map[string]any{"coordinate": pCoordinate, "scroll_direction": pDirection, "scroll_amount": pAmount, "text": pModifiers},
		[]string{"scroll_direction", "scroll_amount"}, "Turn the mouse wheel, at coordinate or where the pointer is."},
	"hold_key": {map[string]map[string]any{"text": pKeys, "duration": pDuration}, []string{"text", "duration"}, "Hold a key down for duration seconds."},
	"wait":     {map[string]map[string]any{"duration": pDuration}, []string{"duration"}, "Wait duration seconds, then take a screenshot."},
	"zoom":     {map[string]map[string]any{"region": pRegion}, []string{"region"}, "Take a screenshot of a region of the screen at full resolution."},
}

// computerSchema is the input schema of an action tool: the action's
// parameters, sandbox_id, and the optional display size to scale to.
func computerSchema(a computerAction) map[string]any {
	props := map[string]any{
		"sandbox_id": map[string]any{"type": "string", "description": "the id create_sandbox returned"},
		"display_width_px": map[string]any{"type": "integer", "minimum": 1,
			"description": "width of the picture you see; screenshots are scaled to fit it and coordinates scaled back. Default: the size Anthropic recommends for the screen (1024×768, 1280×800 or 1366×768)"},
		"display_height_px": map[string]any{"type": "integer", "minimum": 1, "description": "height of the picture you see, with display_width_px"},
	}
	for name, p := range a.params {
		props[name] = p
	}
	return map[string]any{
		"type": "object", "properties": props, "additionalProperties": false,
		"required": append([]string{"sandbox_id"}, a.required...),
	}
}

func (t *tools) addComputer(s *mcp.Server) {
	for _, name := range computer.AnthropicActions() {
		a, ok := computerActions[name]
		if !ok {
			// A new action in internal/computer needs its schema here.
			panic("mcp: no schema for the computer action " + name)
		}
		ann := plain
		if name == "screenshot" || name == "cursor_position" || name == "zoom" {
			ann = readOnly
		}
		s.AddTool(&mcp.Tool{Name: name, Description: a.doc + " Answers a screenshot taken after the action, unless it reports something of its own.",
			InputSchema: computerSchema(a), Annotations: ann},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return t.run(ctx, req, name, func(ctx context.Context, b Backend) (*mcp.CallToolResult, error) {
					return runComputer(ctx, b, name, req.Params.Arguments)
				})
			})
	}
}

// runComputer runs one action through the daemon's Anthropic computer
// endpoint: the arguments, less sandbox_id and the display size, are the
// tool_use's input; the display size, if given, is the tool's. The
// endpoint checks and scales as it does for every caller, and refuses bad
// input before anything runs.
func runComputer(ctx context.Context, b Backend, name string, args json.RawMessage) (*mcp.CallToolResult, error) {
	var in map[string]json.RawMessage
	if len(bytes.TrimSpace(args)) > 0 {
		if err := json.Unmarshal(args, &in); err != nil {
			return nil, fmt.Errorf("the arguments must be an object: %v", err)
		}
	}
	var id string
	if raw, ok := in["sandbox_id"]; !ok || json.Unmarshal(raw, &id) != nil || id == "" {
		return nil, errors.New("sandbox_id is required: the id create_sandbox returned")
	}
	delete(in, "sandbox_id")
	tool := map[string]any{"type": computer.AnthropicToolset}
	for _, k := range []string{"display_width_px", "display_height_px"} {
		if raw, ok := in[k]; ok {
			var n int
			if err := json.Unmarshal(raw, &n); err != nil {
				return nil, fmt.Errorf("%s must be an integer", k)
			}
			tool[k] = n
			delete(in, k)
		}
	}
	if raw, ok := in["action"]; ok {
		var a string
		if json.Unmarshal(raw, &a) != nil || a != name {
			return nil, fmt.Errorf("this tool is the action %s; leave action out", name)
		}
	}
	a := computerActions[name]
	for k := range in {
		if _, ok := a.params[k]; !ok && k != "action" {
			return nil, fmt.Errorf("%s does not take %s; it takes sandbox_id, display_width_px, display_height_px%s", name, k, paramList(a))
		}
	}
	in["action"], _ = json.Marshal(name)
	out, err := b.ComputerAnthropic(ctx, id, map[string]any{"tool": tool, "input": in})
	if err != nil {
		return nil, computerError(err)
	}
	var res computer.AnthropicResult
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("the daemon's answer: %v", err)
	}
	return toolResult(res)
}

func paramList(a computerAction) string {
	var names []string
	for k := range a.params {
		names = append(names, k)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return ""
	}
	return ", " + strings.Join(names, ", ")
}

// toolResult renders an Anthropic tool_result as MCP content: image
// blocks as image content, text as text.
func toolResult(res computer.AnthropicResult) (*mcp.CallToolResult, error) {
	out := &mcp.CallToolResult{IsError: res.IsError}
	for _, c := range res.Content {
		switch {
		case c.Type == "image" && c.Source != nil:
			data, err := base64.StdEncoding.DecodeString(c.Source.Data)
			if err != nil {
				return nil, fmt.Errorf("the daemon's image: %v", err)
			}
			out.Content = append(out.Content, &mcp.ImageContent{Data: data, MIMEType: c.Source.MediaType})
		case c.Type == "text":
			out.Content = append(out.Content, &mcp.TextContent{Text: c.Text})
		}
	}
	if len(out.Content) == 0 {
		out.Content = []mcp.Content{&mcp.TextContent{Text: "done"}}
	}
	return out, nil
}

// computerError is the tool_result the computer endpoint sends with a 400
// (what to tell the model), or the error itself.
func computerError(err error) error {
	var ae *client.APIError
	if !errors.As(err, &ae) || len(ae.Body) == 0 {
		return err
	}
	var body struct {
		ToolResult *computer.AnthropicResult `json:"tool_result"`
	}
	if json.Unmarshal(ae.Body, &body) != nil || body.ToolResult == nil {
		return err
	}
	for _, c := range body.ToolResult.Content {
		if c.Type == "text" && c.Text != "" {
			return errors.New(c.Text)
		}
	}
	return err
}

func encodeBase64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func decodeBase64(s string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.Join(strings.Fields(s), ""))
}
