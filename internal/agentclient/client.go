// Package agentclient is the host side of the agent channel: a typed client of
// the in-sandbox agent's Connect RPC services (desktop, process, filesystem)
// and its /files endpoints, over whatever byte stream the driver provides
// (a unix socket for gVisor/runc, vsock or virtio-serial for VMs). It is used
// by the daemon only.
package agentclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/proto/desktop/desktopconnect"
	"github.com/cubicle-dev/cubicle/proto/filesystem/filesystemconnect"
	"github.com/cubicle-dev/cubicle/proto/process/processconnect"
)

// TokenHeader carries the per-sandbox agent token on every request.
const TokenHeader = "X-Cubicle-Token"

// baseURL is a placeholder: the transport ignores the host and dials the box.
const baseURL = "http://agent"

// DialFunc opens a new byte stream to the agent.
type DialFunc func(ctx context.Context) (net.Conn, error)

// Client talks to one sandbox's agent. It keeps a small pool of idle
// connections so that a click costs one request, not a dial.
type Client struct {
	HTTP       *http.Client
	Desktop    desktopconnect.DesktopClient
	Process    processconnect.ProcessClient
	Filesystem filesystemconnect.FilesystemClient

	transport *http.Transport
	token     string
}

// New returns a client that reaches the agent through dial and authenticates
// with token.
func New(dial DialFunc, token string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		MaxIdleConns:        32,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	c := &Client{transport: tr, token: token}
	c.HTTP = &http.Client{Transport: &tokenTransport{base: tr, token: token}}
	opts := []connect.ClientOption{connect.WithSendMaxBytes(64 << 20), connect.WithReadMaxBytes(256 << 20)}
	c.Desktop = desktopconnect.NewDesktopClient(c.HTTP, baseURL, opts...)
	c.Process = processconnect.NewProcessClient(c.HTTP, baseURL, opts...)
	c.Filesystem = filesystemconnect.NewFilesystemClient(c.HTTP, baseURL, opts...)
	return c
}

// Close drops the idle connections.
func (c *Client) Close() { c.transport.CloseIdleConnections() }

type tokenTransport struct {
	base  http.RoundTripper
	token string
}

func (t *tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(TokenHeader, t.token)
	return t.base.RoundTrip(r)
}

// StatusError is a non-2xx answer of the agent's /files endpoints.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("agent: %d %s", e.Code, e.Message)
}

// Upload writes r to path inside the sandbox, creating parent directories,
// and returns the number of bytes written.
func (c *Client) Upload(ctx context.Context, path string, r io.Reader) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/files?path="+url.QueryEscape(path), r)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, fmt.Errorf("upload %s: %w", path, err)
	}
	defer resp.Body.Close()
	if err := statusError(resp); err != nil {
		return 0, err
	}
	n, _ := strconv.ParseInt(resp.Header.Get("X-Cubicle-Size"), 10, 64)
	return n, nil
}

// Download opens the file at path inside the sandbox. The caller closes the
// body. A missing file is a *StatusError with Code 404.
func (c *Client) Download(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("download %s: %w", path, err)
	}
	if err := statusError(resp); err != nil {
		resp.Body.Close()
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

func statusError(resp *http.Response) error {
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return &StatusError{Code: resp.StatusCode, Message: errorText(msg)}
}

// errorText is the message of an error answer of the agent: the agent's
// file endpoints answer {"code", "message"}, whose message is the words
// for a caller (an error body that showed the JSON itself was reported by
// the Python SDK's suite); anything else is kept as it came.
func errorText(body []byte) string {
	var e struct {
		Message *string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil && e.Message != nil {
		return *e.Message
	}
	return string(body)
}

// CheckpointPath is the agent's endpoint that readies a box whose
// channel is a host socket (gVisor) for a checkpoint: see
// agent.HostListener.
const CheckpointPath = "/checkpoint/prepare"

// PrepareCheckpoint asks the agent to let go of its host socket and its
// connections (this client's too) until it is sent SIGUSR2. It returns
// once the agent has answered; the socket closes right after.
func (c *Client) PrepareCheckpoint(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+CheckpointPath, nil)
	if err != nil {
		return err
	}
	req.Close = true
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("prepare checkpoint: %w", err)
	}
	defer resp.Body.Close()
	if err := statusError(resp); err != nil {
		return fmt.Errorf("prepare checkpoint: %w", err)
	}
	return nil
}
