package agentclient

import "testing"

// TestErrorText: the message of the agent's JSON error answers is what a
// caller reads, not the JSON around it.
func TestErrorText(t *testing.T) {
	for _, tt := range []struct{ body, want string }{
		{`{"code":404,"message":"path /x: no such file or directory"}`, "path /x: no such file or directory"},
		{`{"code":400,"message":""}`, ""},
		{"plain words\n", "plain words\n"},
		{`{"code":500}`, `{"code":500}`},
		{`[1,2]`, `[1,2]`},
		{"", ""},
	} {
		if got := errorText([]byte(tt.body)); got != tt.want {
			t.Errorf("errorText(%q) = %q, want %q", tt.body, got, tt.want)
		}
	}
}
