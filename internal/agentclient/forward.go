package agentclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// forwardProtocol must match agent.ForwardProtocol (the agent package is
// not imported here: it belongs to the guest side).
const forwardProtocol = "cubicle-forward"

// Forward opens a byte stream to port on the sandbox's loopback through the
// agent (GET /forward, upgraded). ctx bounds only the opening; the stream
// lives until the caller closes it or the sandbox goes away. A port nobody
// listens on is a *StatusError with Code 502.
func (c *Client) Forward(ctx context.Context, port int) (io.ReadWriteCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/forward?port="+strconv.Itoa(port), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", forwardProtocol)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("forward port %d: %w", port, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if err := statusError(resp); err != nil {
			return nil, err
		}
		return nil, &StatusError{Code: resp.StatusCode, Message: "agent did not switch protocols"}
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("forward port %d: upgraded body is not writable", port)
	}
	return rwc, nil
}
