// Command anthropic is an agent loop that lets a Claude model use a cubicle
// sandbox through Anthropic's computer tool. It passes every tool_use
// block of the model to cubicle as it is and sends cubicle's tool_result
// back as it is, until the model ends its turn.
//
//	ANTHROPIC_API_KEY=sk-ant-… CUBICLE_URL=http://127.0.0.1:8080 CUBICLE_API_KEY=… \
//	  go run ./examples/anthropic -task "Search the web for cubicle sandboxes"
//
// Only net/http and encoding/json speak to Anthropic: no vendor SDK.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"

	"github.com/cubicle-dev/cubicle/client"
)

// config is what one run needs.
type config struct {
	APIKey   string // Anthropic's
	BaseURL  string // https://api.anthropic.com, or a stand-in in tests
	Model    string
	Task     string
	Cubicle  *client.Client
	Sandbox  string // an existing sandbox; "" creates one
	Keep     bool   // leave the sandbox running at the end
	MaxTurns int
	Out      io.Writer // the model's words and the loop's progress
}

// The computer tool the model is given, and the beta that enables it.
// cubicle gets the same definition, so it scales screenshots to this size
// and the model's coordinates back to the screen.
var tool = map[string]any{"type": "computer_20250124", "name": "computer",
	"display_width_px": 1024, "display_height_px": 768}

const beta = "computer-use-2025-01-24"

func main() {
	var cfg config
	flag.StringVar(&cfg.APIKey, "api-key", os.Getenv("ANTHROPIC_API_KEY"), "Anthropic API key (ANTHROPIC_API_KEY)")
	flag.StringVar(&cfg.BaseURL, "base-url", envOr("ANTHROPIC_BASE_URL", "https://api.anthropic.com"), "Anthropic API base URL (ANTHROPIC_BASE_URL)")
	flag.StringVar(&cfg.Model, "model", "claude-sonnet-4-5", "model")
	flag.StringVar(&cfg.Task, "task", "Open example.com in the browser and tell me its heading.", "what the model should do")
	flag.StringVar(&cfg.Sandbox, "sandbox", "", "use this sandbox instead of creating one")
	flag.BoolVar(&cfg.Keep, "keep", false, "do not destroy the sandbox at the end")
	flag.IntVar(&cfg.MaxTurns, "max-turns", 50, "stop after this many model turns")
	cubicleURL := flag.String("cubicle-url", envOr("CUBICLE_URL", "http://127.0.0.1:8080"), "cubicle API (CUBICLE_URL)")
	cubicleKey := flag.String("cubicle-api-key", os.Getenv("CUBICLE_API_KEY"), "cubicle API key (CUBICLE_API_KEY)")
	flag.Parse()
	if cfg.APIKey == "" {
		log.Fatal("set ANTHROPIC_API_KEY or -api-key")
	}
	cfg.Cubicle = client.New(*cubicleURL, client.WithAPIKey(*cubicleKey))
	cfg.Out = os.Stdout

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, cfg); err != nil {
		log.Fatal(err)
	}
}

// run drives the loop and returns the model's last words.
func run(ctx context.Context, cfg config) (string, error) {
	id := cfg.Sandbox
	if id == "" {
		sb, err := cfg.Cubicle.Create(ctx, client.CreateRequest{Resolution: &client.Resolution{Width: 1024, Height: 768}})
		if err != nil {
			return "", fmt.Errorf("create sandbox: %w", err)
		}
		id = sb.ID
		fmt.Fprintf(cfg.Out, "sandbox %s\n", id)
	}
	if !cfg.Keep {
		defer cfg.Cubicle.Destroy(context.WithoutCancel(ctx), id)
	}
	if v, err := cfg.Cubicle.View(ctx, id, client.ViewRequest{ViewOnly: true}); err == nil {
		fmt.Fprintf(cfg.Out, "watch it at %s\n", v.URL)
	}

	messages := []any{map[string]any{"role": "user", "content": cfg.Task}}
	for turn := 0; turn < cfg.MaxTurns; turn++ {
		msg, err := createMessage(ctx, cfg, messages)
		if err != nil {
			return "", err
		}
		messages = append(messages, map[string]any{"role": "assistant", "content": msg.Content})

		var text []string
		var toolUses []json.RawMessage
		for _, raw := range msg.Content {
			var b struct{ Type, Text string }
			if err := json.Unmarshal(raw, &b); err != nil {
				return "", fmt.Errorf("content block: %w", err)
			}
			switch b.Type {
			case "text":
				text = append(text, b.Text)
				fmt.Fprintln(cfg.Out, b.Text)
			case "tool_use":
				toolUses = append(toolUses, raw)
			}
		}
		if len(toolUses) == 0 { // end_turn (or max_tokens): the model is done
			return strings.Join(text, "\n"), nil
		}

		// The whole turn runs in one request; cubicle answers each
		// tool_use with its tool_result.
		fmt.Fprintf(cfg.Out, "[turn %d: %d tool use(s)]\n", turn+1, len(toolUses))
		results, err := cfg.Cubicle.ComputerAnthropic(ctx, id, map[string]any{"tool": tool, "tool_uses": toolUses})
		var answer struct {
			ToolResults []json.RawMessage `json:"tool_results"`
		}
		var apiErr *client.APIError
		if errors.As(err, &apiErr) && json.Unmarshal(apiErr.Body, &answer) == nil && len(answer.ToolResults) > 0 {
			// Bad input (a point off the screen, an unknown key): the
			// error carries the tool_results, marked is_error, for the
			// model to read and correct itself.
			fmt.Fprintf(cfg.Out, "[cubicle refused: %s]\n", apiErr.Message)
		} else if err != nil {
			return "", err
		} else if err := json.Unmarshal(results, &answer); err != nil {
			return "", fmt.Errorf("cubicle's answer: %w", err)
		}
		messages = append(messages, map[string]any{"role": "user", "content": answer.ToolResults})
	}
	return "", fmt.Errorf("the model did not finish in %d turns", cfg.MaxTurns)
}

// message is the part of a Messages API answer the loop reads. Content
// keeps each block as it came, to send back unchanged.
type message struct {
	Content []json.RawMessage `json:"content"`
}

// createMessage calls POST /v1/messages with the computer tool.
func createMessage(ctx context.Context, cfg config, messages []any) (message, error) {
	body, err := json.Marshal(map[string]any{
		"model":      cfg.Model,
		"max_tokens": 4096,
		"tools":      []any{tool},
		"messages":   messages,
	})
	if err != nil {
		return message{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(cfg.BaseURL, "/")+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return message{}, err
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", cfg.APIKey)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("anthropic-beta", beta)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return message{}, fmt.Errorf("anthropic: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return message{}, fmt.Errorf("anthropic: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return message{}, fmt.Errorf("anthropic: %s: %s", resp.Status, b)
	}
	var m message
	if err := json.Unmarshal(b, &m); err != nil {
		return message{}, fmt.Errorf("anthropic: %w", err)
	}
	return m, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
