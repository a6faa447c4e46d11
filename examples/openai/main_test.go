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

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/examples/internal/sandboxtest"
)

func TestMain(m *testing.M) { sandboxtest.Main(m) }

// recording is testdata/recording-for-standin.json: the task and the
// Responses API answers the stand-in gives, in order.
type recording struct {
	Task      string            `json:"task"`
	Responses []json.RawMessage `json:"responses"`
}

// TestRecordedConversation runs the loop against a stand-in of OpenAI's
// Responses API that replays a recorded conversation, on a real sandbox
// showing a form, and checks that the form ends up submitted with the text
// the model typed. A person (stdin) confirms the safety check of the
// typing call.
func TestRecordedConversation(t *testing.T) {
	var rec recording
	sandboxtest.LoadRecording(t, "testdata/recording-for-standin.json", &rec)
	c, id := sandboxtest.FormSandbox(t)

	s := &standin{t: t, rec: rec}
	srv := httptest.NewServer(s)
	defer srv.Close()

	var out bytes.Buffer
	start := time.Now()
	text, err := run(context.Background(), config{APIKey: "standin-key", BaseURL: srv.URL + "/v1", Model: "computer-use-preview",
		Task: rec.Task, Cubicle: c, Sandbox: id, Keep: true, MaxTurns: 10, In: strings.NewReader("y\n"), Out: &out})
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
	if !strings.Contains(out.String(), "safety check irrelevant_domain: ") || !strings.Contains(out.String(), "Proceed? [y/N]") {
		t.Errorf("the loop did not ask about the safety check")
	}
	// The sandbox's state, through cubicle: the form was submitted.
	sandboxtest.WaitTitle(t, c, id, "submitted: hello from the model")
}

// TestSafetyCheckDeclined checks that a safety check a person does not
// confirm stops the loop before the call reaches the sandbox.
func TestSafetyCheckDeclined(t *testing.T) {
	const answer = `{"id": "resp_standin_01", "object": "response", "status": "completed", "output": [
		{"type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed", "action": {"type": "type", "text": "x"},
		 "pending_safety_checks": [{"id": "cu_sc_1", "code": "malicious_instructions", "message": "The page asks to do something else."}]}]}`
	vendor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, answer) }))
	defer vendor.Close()
	cubicle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/computer/") {
			t.Errorf("the call reached the sandbox: %s %s", r.Method, r.URL.Path)
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	defer cubicle.Close()

	var out bytes.Buffer
	_, err := run(context.Background(), config{APIKey: "standin-key", BaseURL: vendor.URL, Model: "computer-use-preview",
		Task: "x", Cubicle: client.New(cubicle.URL), Sandbox: "sbx1", Keep: true, MaxTurns: 10, In: strings.NewReader("\n"), Out: &out})
	if err == nil || !strings.Contains(err.Error(), "safety checks were not confirmed") {
		t.Errorf("run = %v, want the safety checks not confirmed", err)
	}
	if !strings.Contains(out.String(), "safety check malicious_instructions: The page asks to do something else.") {
		t.Errorf("the loop printed %q, without the check", out.String())
	}
}

// standin stands in for OpenAI's Responses API: it answers with the
// recorded responses in order and checks each request the loop sends.
type standin struct {
	t   *testing.T
	rec recording

	mu sync.Mutex
	n  int // requests answered
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
		fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error","param":null,"code":null}}`, err.Error())
		return
	}
	w.Header().Set("content-type", "application/json")
	w.Write(s.rec.Responses[s.n])
	s.n++
}

// check checks request n+1: the headers, the tool, the chaining to
// response n, and an output for every computer_call of response n.
func (s *standin) check(r *http.Request) error {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/responses" {
		return fmt.Errorf("%s %s, want POST /v1/responses", r.Method, r.URL.Path)
	}
	if got := r.Header.Get("authorization"); got != "Bearer standin-key" {
		return fmt.Errorf("authorization %q, want the key as a bearer token", got)
	}
	if s.n >= len(s.rec.Responses) {
		return fmt.Errorf("a request after the recorded conversation ended")
	}
	b, _ := io.ReadAll(r.Body)
	var req struct {
		Model              string            `json:"model"`
		Tools              []json.RawMessage `json:"tools"`
		Truncation         string            `json:"truncation"`
		PreviousResponseID string            `json:"previous_response_id"`
		Input              []json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(b, &req); err != nil {
		return err
	}
	const tool = `{"type":"computer_use_preview","display_width":1024,"display_height":768,"environment":"linux"}`
	if req.Model == "" || req.Truncation != "auto" || len(req.Tools) != 1 || !sandboxtest.JSONEqual(req.Tools[0], []byte(tool)) {
		return fmt.Errorf("model %q, truncation %q, tools %s; want a model, truncation auto and the tool %s", req.Model, req.Truncation, req.Tools, tool)
	}
	if s.n == 0 {
		want, _ := json.Marshal([]any{map[string]any{"role": "user", "content": s.rec.Task}})
		if got, _ := json.Marshal(req.Input); req.PreviousResponseID != "" || !sandboxtest.JSONEqual(got, want) {
			return fmt.Errorf("previous_response_id %q, input %s; want none and %s", req.PreviousResponseID, got, want)
		}
		return nil
	}
	var prev struct {
		ID     string `json:"id"`
		Output []struct {
			Type   string `json:"type"`
			CallID string `json:"call_id"`
			Checks []struct {
				ID string `json:"id"`
			} `json:"pending_safety_checks"`
			Refused bool `json:"_expect_refusal"`
		} `json:"output"`
	}
	json.Unmarshal(s.rec.Responses[s.n-1], &prev)
	if req.PreviousResponseID != prev.ID {
		return fmt.Errorf("previous_response_id %q, want %q", req.PreviousResponseID, prev.ID)
	}
	i := 0
	for _, call := range prev.Output {
		if call.Type != "computer_call" {
			continue
		}
		if i >= len(req.Input) {
			return fmt.Errorf("no input answers %s", call.CallID)
		}
		var out struct {
			Type   string `json:"type"`
			CallID string `json:"call_id"`
			Output struct {
				Type     string `json:"type"`
				ImageURL string `json:"image_url"`
			} `json:"output"`
			Acked []struct {
				ID string `json:"id"`
			} `json:"acknowledged_safety_checks"`
		}
		if err := json.Unmarshal(req.Input[i], &out); err != nil {
			return err
		}
		i++
		if out.Type != "computer_call_output" || out.CallID != call.CallID || out.Output.Type != "computer_screenshot" {
			return fmt.Errorf("input %.200s, want a computer_call_output with a computer_screenshot for %s", req.Input[i-1], call.CallID)
		}
		data, ok := strings.CutPrefix(out.Output.ImageURL, "data:image/png;base64,")
		if !ok {
			return fmt.Errorf("image_url %.40q, want a PNG data URL", out.Output.ImageURL)
		}
		if err := sandboxtest.CheckPNG(data); err != nil {
			return fmt.Errorf("output for %s: %w", call.CallID, err)
		}
		if len(out.Acked) != len(call.Checks) {
			return fmt.Errorf("output for %s acknowledges %d safety checks, want %d", call.CallID, len(out.Acked), len(call.Checks))
		}
		for j := range out.Acked {
			if out.Acked[j].ID != call.Checks[j].ID {
				return fmt.Errorf("output for %s acknowledges %q, want %q", call.CallID, out.Acked[j].ID, call.Checks[j].ID)
			}
		}
		if call.Refused {
			// cubicle refused the call: the model is told why.
			var msg struct{ Role, Content string }
			if i >= len(req.Input) || json.Unmarshal(req.Input[i], &msg) != nil || msg.Role != "user" ||
				!strings.Contains(msg.Content, "refused") || !strings.Contains(msg.Content, "outside the screen") {
				return fmt.Errorf("no user message says why %s was refused", call.CallID)
			}
			i++
		}
	}
	if i != len(req.Input) {
		return fmt.Errorf("%d input items answer %d computer calls", len(req.Input), i)
	}
	return nil
}
