// Command openai is an agent loop that lets an OpenAI computer-use model
// use a cubicle sandbox through the Responses API. It passes every
// computer_call of the model to cubicle as it is and sends cubicle's
// computer_call_output back as it is, until the model stops calling the
// computer.
//
//	OPENAI_API_KEY=sk-… CUBICLE_URL=http://127.0.0.1:8080 CUBICLE_API_KEY=… \
//	  go run ./examples/openai -task "Search the web for cubicle sandboxes"
//
// Only net/http and encoding/json speak to OpenAI: no vendor SDK.
package main

import (
	"bufio"
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
	APIKey   string // OpenAI's
	BaseURL  string // https://api.openai.com, or a stand-in in tests
	Model    string
	Task     string
	Cubicle  *client.Client
	Sandbox  string // an existing sandbox; "" creates one
	Keep     bool   // leave the sandbox running at the end
	Yes      bool   // acknowledge safety checks without asking
	MaxTurns int
	In       io.Reader // where a person confirms safety checks
	Out      io.Writer // the model's words and the loop's progress
}

// The computer tool the model is given. cubicle gets the same definition,
// so it scales screenshots to this size and the model's coordinates back
// to the screen.
var tool = map[string]any{"type": "computer_use_preview",
	"display_width": 1024, "display_height": 768, "environment": "linux"}

func main() {
	var cfg config
	flag.StringVar(&cfg.APIKey, "api-key", os.Getenv("OPENAI_API_KEY"), "OpenAI API key (OPENAI_API_KEY)")
	flag.StringVar(&cfg.BaseURL, "base-url", envOr("OPENAI_BASE_URL", "https://api.openai.com"), "OpenAI API base URL (OPENAI_BASE_URL)")
	flag.StringVar(&cfg.Model, "model", "computer-use-preview", "model")
	flag.StringVar(&cfg.Task, "task", "Open example.com in the browser and tell me its heading.", "what the model should do")
	flag.StringVar(&cfg.Sandbox, "sandbox", "", "use this sandbox instead of creating one")
	flag.BoolVar(&cfg.Keep, "keep", false, "do not destroy the sandbox at the end")
	flag.BoolVar(&cfg.Yes, "yes", false, "acknowledge the model's safety checks without asking")
	flag.IntVar(&cfg.MaxTurns, "max-turns", 100, "stop after this many model responses")
	cubicleURL := flag.String("cubicle-url", envOr("CUBICLE_URL", "http://127.0.0.1:8080"), "cubicle API (CUBICLE_URL)")
	cubicleKey := flag.String("cubicle-api-key", os.Getenv("CUBICLE_API_KEY"), "cubicle API key (CUBICLE_API_KEY)")
	flag.Parse()
	if cfg.APIKey == "" {
		log.Fatal("set OPENAI_API_KEY or -api-key")
	}
	cfg.Cubicle = client.New(*cubicleURL, client.WithAPIKey(*cubicleKey))
	cfg.In, cfg.Out = os.Stdin, os.Stdout

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
	stdin := bufio.NewScanner(cfg.In)

	req := map[string]any{"model": cfg.Model, "tools": []any{tool}, "truncation": "auto",
		"input": []any{map[string]any{"role": "user", "content": cfg.Task}}}
	for turn := 0; turn < cfg.MaxTurns; turn++ {
		resp, err := createResponse(ctx, cfg, req)
		if err != nil {
			return "", err
		}

		var text []string
		var outputs []json.RawMessage
		for _, raw := range resp.Output {
			var item struct {
				Type    string
				Content []struct{ Type, Text string }
				Checks  []struct{ Code, Message string } `json:"pending_safety_checks"`
			}
			if err := json.Unmarshal(raw, &item); err != nil {
				return "", fmt.Errorf("output item: %w", err)
			}
			switch item.Type {
			case "message":
				for _, c := range item.Content {
					if c.Type == "output_text" {
						text = append(text, c.Text)
						fmt.Fprintln(cfg.Out, c.Text)
					}
				}
			case "computer_call":
				// Safety checks are for a person to confirm; cubicle
				// refuses the call unless the request acknowledges them.
				ack := false
				for _, c := range item.Checks {
					fmt.Fprintf(cfg.Out, "safety check %s: %s\n", c.Code, c.Message)
				}
				if len(item.Checks) > 0 {
					if !cfg.Yes {
						fmt.Fprint(cfg.Out, "Proceed? [y/N] ")
						if !stdin.Scan() || !strings.EqualFold(strings.TrimSpace(stdin.Text()), "y") {
							return "", fmt.Errorf("stopped: the safety checks were not confirmed")
						}
					}
					ack = true
				}
				out, err := cfg.Cubicle.ComputerOpenAI(ctx, id, map[string]any{
					"tool": tool, "computer_call": raw, "acknowledge_safety_checks": ack})
				if err != nil {
					// A call cubicle refused (a point off the screen, say)
					// still gets its output — the screen as it is, in the
					// error's body — and the model is told why.
					refusal, rerr := refused(err)
					if rerr != nil {
						return "", rerr
					}
					outputs = append(outputs, refusal, userText("That computer call was refused: "+errorMessage(err)))
					continue
				}
				outputs = append(outputs, out)
			}
		}
		if len(outputs) == 0 { // no computer_call: the model is done
			return strings.Join(text, "\n"), nil
		}
		fmt.Fprintf(cfg.Out, "[turn %d: %d computer call(s)]\n", turn+1, len(outputs))
		req["previous_response_id"], req["input"] = resp.ID, outputs
	}
	return "", fmt.Errorf("the model did not finish in %d turns", cfg.MaxTurns)
}

// refused returns the computer_call_output an error answer of cubicle
// carries, or the error itself when it carries none (the sandbox is gone,
// say), which ends the loop.
func refused(err error) (json.RawMessage, error) {
	var ae *client.APIError
	if !errors.As(err, &ae) {
		return nil, err
	}
	var body struct {
		Output json.RawMessage `json:"computer_call_output"`
	}
	if json.Unmarshal(ae.Body, &body) != nil || len(body.Output) == 0 {
		return nil, err
	}
	return body.Output, nil
}

// errorMessage is cubicle's words for a refused call.
func errorMessage(err error) string {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Message
	}
	return err.Error()
}

// userText is an input item with a user's text.
func userText(s string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"role": "user", "content": s})
	return b
}

// response is the part of a Responses API answer the loop reads. Output
// keeps each item as it came, to pass to cubicle unchanged.
type response struct {
	ID     string            `json:"id"`
	Output []json.RawMessage `json:"output"`
}

// createResponse calls POST /v1/responses.
func createResponse(ctx context.Context, cfg config, body map[string]any) (response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return response{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL(cfg.BaseURL, "/v1/responses"), bytes.NewReader(b))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("authorization", "Bearer "+cfg.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("openai: %w", err)
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("openai: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return response{}, fmt.Errorf("openai: %s: %s", resp.Status, b)
	}
	var r response
	if err := json.Unmarshal(b, &r); err != nil {
		return response{}, fmt.Errorf("openai: %w", err)
	}
	return r, nil
}

// apiURL joins the base URL and path. The base may end in /v1, as the
// OpenAI SDKs spell OPENAI_BASE_URL.
func apiURL(base, path string) string {
	return strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1") + path
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
