package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/websocket"
)

// Navigate points the session's running Chromium at url, in the tab it
// shows, through its DevTools (DevToolsPort on the sandbox's loopback): a
// sandbox started from a boot template already runs its browser, on the
// template's page, when its create says what the start URL is. Starting
// the launcher again would open a second tab (or, for a browser still
// starting, a second window); a DevTools Page.navigate changes the page
// the user sees and nothing else. It returns once Chromium has accepted
// the navigation, not when the page has loaded, as a cold boot's create
// does not wait for its start URL either.
//
// coder/websocket is already the daemon's WebSocket library (the CDP
// proxy); the agent links its client half only for this.
func Navigate(ctx context.Context, url string) error {
	base := "http://127.0.0.1:" + strconv.Itoa(DevToolsPort)
	target, err := pageTarget(ctx, base)
	if err != nil {
		return err
	}
	c, _, err := websocket.Dial(ctx, target, nil)
	if err != nil {
		return fmt.Errorf("devtools: connect to the page: %w", err)
	}
	defer c.CloseNow()
	msg, _ := json.Marshal(map[string]any{"id": 1, "method": "Page.navigate", "params": map[string]string{"url": url}})
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		return fmt.Errorf("devtools: send Page.navigate: %w", err)
	}
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return fmt.Errorf("devtools: read the answer to Page.navigate: %w", err)
		}
		var r struct {
			ID     int `json:"id"`
			Result struct {
				ErrorText string `json:"errorText"`
			} `json:"result"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &r) != nil || r.ID != 1 {
			continue // an event
		}
		switch {
		case r.Error != nil:
			return fmt.Errorf("devtools: Page.navigate: %s", r.Error.Message)
		case r.Result.ErrorText != "" && r.Result.ErrorText != "net::ERR_ABORTED":
			// As a cold boot's Chromium does, the tab shows the error
			// page of a URL that cannot load; that is the user's to
			// see, not a failed create.
			return nil
		}
		_ = c.Close(websocket.StatusNormalClosure, "")
		return nil
	}
}

// pageTarget is the WebSocket URL of the browser's first page target,
// asked for until Chromium answers or ctx ends (DevTools comes up a
// little after the window).
func pageTarget(ctx context.Context, base string) (string, error) {
	var last error
	for {
		u, err := firstPage(ctx, base)
		if err == nil {
			return u, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("devtools: no page to navigate: %w", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func firstPage(ctx context.Context, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/json/list", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var targets []struct {
		Type string `json:"type"`
		WS   string `json:"webSocketDebuggerUrl"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&targets); err != nil {
		return "", fmt.Errorf("decode %s/json/list: %w", base, err)
	}
	for _, t := range targets {
		if t.Type == "page" && t.WS != "" {
			return t.WS, nil
		}
	}
	return "", errors.New("no page target yet")
}
