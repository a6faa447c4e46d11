package client

import (
	"context"
	"encoding/json"
	"net/http"
)

// ComputerAnthropic runs a tool_use of Anthropic's computer tool in a
// sandbox (POST /v1/sandboxes/{id}/computer/anthropic). body is
// {"tool"?: the tool definition given to Anthropic, "input": a tool_use's
// input} or {"tool"?, "tool_uses": [the turn's tool_use blocks]}, plus
// "observe" and "image" options. The answer is the tool_result (or
// {"tool_results": [...]}) as JSON, to put in the next user message as it
// is. On bad input the *APIError's Body holds the tool_result, as an
// error, for the model to read.
func (c *Client) ComputerAnthropic(ctx context.Context, id string, body any) (json.RawMessage, error) {
	return c.computer(ctx, id, "anthropic", body)
}

// ComputerOpenAI runs a computer_call of OpenAI's computer tool in a
// sandbox (POST /v1/sandboxes/{id}/computer/openai). body is {"tool"?,
// "computer_call": the item of the model's response,
// "acknowledge_safety_checks"?, "image"?}. The answer is the
// computer_call_output item, to send back as it is.
func (c *Client) ComputerOpenAI(ctx context.Context, id string, body any) (json.RawMessage, error) {
	return c.computer(ctx, id, "openai", body)
}

func (c *Client) computer(ctx context.Context, id, vendor string, v any) (json.RawMessage, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	body, n, err := jsonBody(v)
	if err != nil {
		return nil, err
	}
	var out json.RawMessage
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: sandboxPath(id, "computer", vendor), body: body, contentLen: n, contentType: "application/json"}, &out)
	return out, err
}
