package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/examples/internal/sandboxtest"
)

func TestMain(m *testing.M) { sandboxtest.Main(m) }

// recording is testdata/recording-for-standin.json: the task and the
// Messages API answers the stand-in gives, in order.
type recording struct {
	Task      string            `json:"task"`
	Responses []json.RawMessage `json:"responses"`
}

// TestRecordedConversation runs the loop against a stand-in of Anthropic's
// Messages API that replays a recorded conversation, on a real sandbox
// showing a form, and checks that the form ends up submitted with the text
// the model typed.
func TestRecordedConversation(t *testing.T) {
	var rec recording
	sandboxtest.LoadRecording(t, "testdata/recording-for-standin.json", &rec)
	c, id := sandboxtest.FormSandbox(t)

	s := &standin{t: t, rec: rec}
	srv := httptest.NewServer(s)
	defer srv.Close()

	var out bytes.Buffer
	start := time.Now()
	text, err := run(context.Background(), config{APIKey: "standin-key", BaseURL: srv.URL, Model: "claude-sonnet-4-5",
		Task: rec.Task, Cubicle: c, Sandbox: id, Keep: true, MaxTurns: 10, Out: &out})
	t.Logf("the loop took %.1f s and printed:\n%s", time.Since(start).Seconds(), out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if s.served() != len(rec.Responses) {
		t.Errorf("the stand-in served %d of %d recorded answers", s.served(), len(rec.Responses))
	}
	if want := `I typed "hello from the model" into the form and submitted it.`; text != want {
		t.Errorf("run returned %q, want %q", text, want)
	}
	if !strings.Contains(out.String(), "[cubicle refused: ") {
		t.Errorf("the loop did not report the refused click")
	}
	// The sandbox's state, through cubicle: the form was submitted.
	sandboxtest.WaitTitle(t, c, id, "submitted: hello from the model")
}

// standin stands in for Anthropic's Messages API: it answers with the
// recorded messages in order and checks each request the loop sends.
type standin struct {
	t   *testing.T
	rec recording

	mu   sync.Mutex
	n    int               // requests answered
	sent []json.RawMessage // the messages of the last request
}

func (s *standin) served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *standin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(r); err != nil {
		s.t.Errorf("stand-in, request %d: %v", s.n+1, err)
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":%q}}`, err.Error())
		return
	}
	w.Header().Set("content-type", "application/json")
	w.Write(s.rec.Responses[s.n])
	s.n++
}

// check checks request n+1: the headers, the tool, the history unchanged,
// and the new user message answering every tool_use of answer n.
func (s *standin) check(r *http.Request) error {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		return fmt.Errorf("%s %s, want POST /v1/messages", r.Method, r.URL.Path)
	}
	for h, want := range map[string]string{"x-api-key": "standin-key", "anthropic-version": "2023-06-01",
		"anthropic-beta": "computer-use-2025-01-24", "content-type": "application/json"} {
		if got := r.Header.Get(h); got != want {
			return fmt.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	if s.n >= len(s.rec.Responses) {
		return fmt.Errorf("a request after the recorded conversation ended")
	}
	b, _ := io.ReadAll(r.Body)
	var req struct {
		Model     string            `json:"model"`
		MaxTokens int               `json:"max_tokens"`
		Tools     []json.RawMessage `json:"tools"`
		Messages  []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(b, &req); err != nil {
		return err
	}
	const tool = `{"type":"computer_20250124","name":"computer","display_width_px":1024,"display_height_px":768}`
	if req.Model == "" || req.MaxTokens <= 0 || len(req.Tools) != 1 || !sandboxtest.JSONEqual(req.Tools[0], []byte(tool)) {
		return fmt.Errorf("model %q, max_tokens %d, tools %s; want a model, max_tokens and the tool %s", req.Model, req.MaxTokens, req.Tools, tool)
	}
	if len(req.Messages) != 2*s.n+1 {
		return fmt.Errorf("%d messages, want %d", len(req.Messages), 2*s.n+1)
	}
	if s.n == 0 {
		want, _ := json.Marshal(map[string]any{"role": "user", "content": s.rec.Task})
		if !sandboxtest.JSONEqual(req.Messages[0], want) {
			return fmt.Errorf("first message %s, want %s", req.Messages[0], want)
		}
		s.sent = req.Messages
		return nil
	}
	// The history is the last request's, unchanged, then the model's
	// answer as it came, then the tool results.
	for i, m := range s.sent {
		if !sandboxtest.JSONEqual(m, req.Messages[i]) {
			return fmt.Errorf("message %d changed: %.200s, was %.200s", i, req.Messages[i], m)
		}
	}
	s.sent = req.Messages
	var answer struct {
		Content []json.RawMessage `json:"content"`
	}
	json.Unmarshal(s.rec.Responses[s.n-1], &answer)
	want, _ := json.Marshal(map[string]any{"role": "assistant", "content": answer.Content})
	if got := req.Messages[2*s.n-1]; !sandboxtest.JSONEqual(got, want) {
		return fmt.Errorf("the assistant message is %.300s, want the recorded answer as it was: %.300s", got, want)
	}
	return checkToolResults(answer.Content, req.Messages[2*s.n])
}

// checkToolResults checks that user message m answers each tool_use block
// of content, in order: a refused point off the screen as is_error with
// cubicle's reason, anything else as a success, with a 1024×768 PNG for a
// screenshot and for the last action of the turn.
func checkToolResults(content []json.RawMessage, m json.RawMessage) error {
	type toolUse struct {
		Type, ID string
		Input    struct {
			Action     string
			Coordinate []int
		}
	}
	var uses []toolUse
	for _, raw := range content {
		var b toolUse
		json.Unmarshal(raw, &b)
		if b.Type == "tool_use" {
			uses = append(uses, b)
		}
	}
	var msg struct {
		Role    string
		Content []struct {
			Type      string `json:"type"`
			ToolUseID string `json:"tool_use_id"`
			IsError   *bool  `json:"is_error"`
			Content   []struct {
				Type   string
				Text   string
				Source struct {
					Type      string `json:"type"`
					MediaType string `json:"media_type"`
					Data      string `json:"data"`
				} `json:"source"`
			} `json:"content"`
		} `json:"content"`
	}
	if err := json.Unmarshal(m, &msg); err != nil {
		return err
	}
	if msg.Role != "user" || len(msg.Content) != len(uses) {
		return fmt.Errorf("%s message with %d blocks answers %d tool uses: %.300s", msg.Role, len(msg.Content), len(uses), m)
	}
	offScreen := false
	for _, u := range uses {
		if c := u.Input.Coordinate; len(c) == 2 && (c[0] >= sandboxtest.Width || c[1] >= sandboxtest.Height) {
			offScreen = true
		}
	}
	for i, r := range msg.Content {
		u := uses[i]
		if r.Type != "tool_result" || r.ToolUseID != u.ID || r.IsError == nil {
			return fmt.Errorf("block %d is %s for %q (is_error %v), want a tool_result for %s", i, r.Type, r.ToolUseID, r.IsError, u.ID)
		}
		if offScreen {
			if !*r.IsError || len(r.Content) != 1 || !strings.Contains(r.Content[0].Text, "outside the screen") {
				return fmt.Errorf("tool_result for the off-screen %s: %+v, want is_error with cubicle's reason", u.Input.Action, r)
			}
			continue
		}
		if *r.IsError {
			return fmt.Errorf("tool_result for %s is an error: %+v", u.Input.Action, r.Content)
		}
		if u.Input.Action != "screenshot" && i != len(uses)-1 {
			continue
		}
		if len(r.Content) != 1 || r.Content[0].Type != "image" || r.Content[0].Source.Type != "base64" || r.Content[0].Source.MediaType != "image/png" {
			return fmt.Errorf("tool_result for %s has no PNG image block: %.300v", u.Input.Action, r.Content)
		}
		if err := sandboxtest.CheckPNG(r.Content[0].Source.Data); err != nil {
			return fmt.Errorf("tool_result for %s: %w", u.Input.Action, err)
		}
	}
	return nil
}
