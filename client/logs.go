package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// LogEntry is one line a sandbox printed on its console
// (GET /v1/sandboxes/{id}/logs).
type LogEntry struct {
	// Timestamp is when the line was printed (the agent's time) or read
	// by the daemon; unique per sandbox and in printing order.
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`  // debug, info, warn or error
	Source    string    `json:"source"` // agent, console or cubicled
	Message   string    `json:"message"`
	// Fields are the key=value pairs of an agent line; nil otherwise.
	Fields map[string]string `json:"fields,omitempty"`
}

// LogsOptions selects the lines Logs returns; the zero value asks for the
// newest 1000.
type LogsOptions struct {
	// Since keeps only lines after it (the Timestamp of the last line
	// seen, to follow a log); zero: the newest lines.
	Since time.Time
	// Limit is the most lines returned, 1 to 1000; 0: 1000.
	Limit int
	// Level is the least severe level returned: debug, info, warn or
	// error; "": all.
	Level string
	// Search keeps only lines whose message contains it (case-sensitive).
	Search string
}

// Logs returns what sandbox id printed on its console, oldest first: the
// agent's log of the session's programs, what those programs print and, in
// a VM, the kernel. Only the API key that created the sandbox may read
// them (any other gets CodeNotFound); a stopped sandbox's are kept while
// it is listed. Reading them does not count as use of the sandbox.
func (c *Client) Logs(ctx context.Context, id string, opts LogsOptions) ([]LogEntry, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	q := url.Values{}
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.Format(time.RFC3339Nano))
	}
	if opts.Limit != 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Level != "" {
		q.Set("level", opts.Level)
	}
	if opts.Search != "" {
		q.Set("search", opts.Search)
	}
	var out struct {
		Logs []LogEntry `json:"logs"`
	}
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: sandboxPath(id, "logs"), query: q, retry: true}, &out)
	return out.Logs, err
}
