package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Default retry policy: up to DefaultMaxRetries extra attempts, the first
// after about DefaultRetryBackoff, doubling each time.
const (
	DefaultMaxRetries   = 3
	DefaultRetryBackoff = 200 * time.Millisecond
	// maxBackoff caps one wait so a long retry chain stays responsive.
	maxBackoff = 10 * time.Second
	// maxErrorBody bounds how much of an error answer is read.
	maxErrorBody = 64 << 10
)

// Client talks to one cubicle daemon. It is safe for concurrent use; create
// it with New.
type Client struct {
	base       *url.URL
	apiKey     string
	hc         *http.Client
	timeout    time.Duration
	maxRetries int
	backoff    time.Duration
	hook       func(resp *http.Response, body []byte)
	userAgent  string
	// initErr, from an unusable base URL, fails every call.
	initErr error
	// sleep waits between attempts; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// Option configures a Client in New.
type Option func(*Client)

// WithAPIKey sets the key sent in the X-API-Key header of every request.
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithHTTPClient makes the Client send its requests through hc (for custom
// transports, proxies or TLS settings). The default is a client with no
// overall timeout, on http.DefaultTransport.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithTimeout bounds every call, retries included, to d (0 = no bound beyond
// the caller's context). It also covers reading a Download body. It does not
// apply to ExecStream, whose length is that of the command; bound that with
// the context or ExecRequest.TimeoutSeconds. Note that Create waits for the
// desktop to boot unless WithoutWait is given, which can take a while.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithRetry sets the retry policy for idempotent requests: at most max extra
// attempts, waiting about base, 2*base, 4*base, … (with jitter, capped at
// 10s) between them. WithRetry(0, 0) turns retries off.
func WithRetry(max int, base time.Duration) Option {
	return func(c *Client) {
		if max < 0 {
			max = 0
		}
		c.maxRetries, c.backoff = max, base
	}
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// WithResponseHook makes the Client call fn with each successful JSON answer
// it decodes, and the raw body. The cubicle CLI uses it to print the daemon's
// JSON verbatim; it is also handy for logging. fn must not keep resp.Body.
func WithResponseHook(fn func(resp *http.Response, body []byte)) Option {
	return func(c *Client) { c.hook = fn }
}

// New returns a Client for the daemon at baseURL (for example
// "http://127.0.0.1:7171"; a path prefix is kept). An unusable baseURL
// makes every call fail with an error saying so.
func New(baseURL string, opts ...Option) *Client {
	c := &Client{
		hc:         &http.Client{},
		maxRetries: DefaultMaxRetries,
		backoff:    DefaultRetryBackoff,
		userAgent:  "cubicle-go-client",
		sleep:      sleepCtx,
	}
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err == nil && (u.Scheme == "" || u.Host == "") {
		err = errors.New("want scheme://host[:port]")
	}
	c.base = u
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{}
	}
	if err != nil {
		c.base = &url.URL{}
		c.initErr = fmt.Errorf("client: bad base URL %q: %w", baseURL, err)
	}
	return c
}

// BaseURL returns the daemon address the Client talks to.
func (c *Client) BaseURL() string { return c.base.String() }

// request describes one API call.
type request struct {
	method string
	path   string // already escaped
	query  url.Values
	// body returns a fresh body for each attempt; nil means no body.
	body        func() (io.Reader, error)
	contentLen  int64 // 0 = unknown (or empty)
	contentType string
	accept      string
	// retry allows retries; set only for idempotent calls.
	retry bool
	// noTimeout skips WithTimeout (streaming calls).
	noTimeout bool
}

func jsonBody(v any) (func() (io.Reader, error), int64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, 0, fmt.Errorf("encode request: %w", err)
	}
	return func() (io.Reader, error) { return bytes.NewReader(b), nil }, int64(len(b)), nil
}

// withTimeout applies WithTimeout to ctx.
func (c *Client) withTimeout(ctx context.Context, r *request) (context.Context, context.CancelFunc) {
	if c.timeout > 0 && !r.noTimeout {
		return context.WithTimeout(ctx, c.timeout)
	}
	return ctx, func() {}
}

// send performs r, retrying as allowed, and returns a response with a 2xx
// status; any other status becomes an *APIError.
func (c *Client) send(ctx context.Context, r *request) (*http.Response, error) {
	if c.initErr != nil {
		return nil, c.initErr
	}
	u := c.base.String() + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	attempts := 1
	if r.retry {
		attempts += c.maxRetries
	}
	var lastErr error
	for i := 0; i < attempts; i++ {
		if i > 0 {
			if err := c.sleep(ctx, c.backoffFor(i, lastErr)); err != nil {
				return nil, errors.Join(err, lastErr)
			}
		}
		resp, err := c.attempt(ctx, r, u)
		if err == nil {
			return resp, nil
		}
		lastErr = err
		if !retryable(ctx, err) {
			break
		}
	}
	return nil, lastErr
}

func (c *Client) attempt(ctx context.Context, r *request, u string) (*http.Response, error) {
	var body io.Reader
	if r.body != nil {
		b, err := r.body()
		if err != nil {
			return nil, err
		}
		body = b
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	if body != nil && r.contentLen > 0 {
		req.ContentLength = r.contentLen
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	}
	if c.apiKey != "" {
		req.Header.Set("X-API-Key", c.apiKey)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, &connError{err: fmt.Errorf("%s %s: %w", r.method, r.path, err)}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return nil, parseAPIError(resp, b)
}

// connError marks a failure to get any answer from the daemon, which is
// worth retrying for idempotent calls.
type connError struct{ err error }

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var ce *connError
	if errors.As(err, &ce) {
		return true
	}
	var ae *APIError
	if errors.As(err, &ae) {
		switch ae.Status {
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
	}
	return false
}

// backoffFor returns the wait before attempt i (i ≥ 1): "equal jitter"
// exponential backoff, stretched to a Retry-After the daemon asked for.
func (c *Client) backoffFor(i int, lastErr error) time.Duration {
	d := c.backoff << (i - 1)
	if d > maxBackoff || d <= 0 && c.backoff > 0 {
		d = maxBackoff
	}
	if d > 0 {
		d = d/2 + rand.N(d/2+1)
	}
	var ae *APIError
	if errors.As(lastErr, &ae) && ae.retryAfter > d {
		d = min(ae.retryAfter, maxBackoff)
	}
	return d
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func parseRetryAfter(h string) time.Duration {
	if h == "" {
		return 0
	}
	if s, err := strconv.Atoi(h); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	return 0
}

// doJSON performs r and decodes a JSON answer into out (nil: discard it).
func (c *Client) doJSON(ctx context.Context, r *request, out any) error {
	ctx, cancel := c.withTimeout(ctx, r)
	defer cancel()
	if r.accept == "" {
		r.accept = "application/json"
	}
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", r.method, r.path, err)
	}
	if c.hook != nil && len(b) > 0 {
		c.hook(resp, b)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent || len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", r.method, r.path, err)
	}
	return nil
}

// sandboxPath returns the escaped path of a sandbox sub-resource.
func sandboxPath(id string, sub ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, s := range sub {
		p += "/" + s
	}
	return p
}

// cancelOnClose runs cancel once the body is closed, so a per-call timeout
// covers reading a streamed body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
