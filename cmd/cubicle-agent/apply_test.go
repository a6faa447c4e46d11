package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/agent/session"
	desktoppb "github.com/cubicle-dev/cubicle/proto/desktop"
)

// TestApplySessionOnce: a warm-pool box takes one session in its life;
// a second ApplySession (someone who learnt the new token trying to
// re-key the box, or a retried claim) is refused and changes nothing.
func TestApplySessionOnce(t *testing.T) {
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	srv, err := agent.New(agent.Options{Token: "pool", Reaper: r})
	if err != nil {
		t.Fatal(err)
	}
	apply := applySession(slog.Default(), srv, nil, session.Config{}, session.Vars{}, nil)
	ctx := context.Background()
	if err := apply(ctx, &desktoppb.ApplySessionRequest{Token: "t", StartUrl: "http://x/\x00"}); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("a start URL with a NUL byte: %v", err)
	}
	if err := apply(ctx, &desktoppb.ApplySessionRequest{Token: "first", Env: map[string]string{"A": "1"}}); err != nil {
		t.Fatal(err)
	}
	if err := apply(ctx, &desktoppb.ApplySessionRequest{Token: "second"}); err == nil {
		t.Error("a second session was applied")
	}
}

// TestApplySessionNavigates: a box restored from a boot template runs
// its browser already, so its create's start URL is a navigation, and a
// navigation that fails fails the session (the daemon then boots the
// sandbox cold) and leaves the template's token in place.
func TestApplySessionNavigates(t *testing.T) {
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	for _, tc := range []struct {
		name, url string
		navErr    error
		want      []string
		wantErr   bool
	}{
		{name: "a start URL is navigated to", url: "http://10.0.0.1/page", want: []string{"http://10.0.0.1/page"}},
		{name: "no start URL: the page stays", url: ""},
		{name: "a failed navigation fails the session", url: "http://x/", navErr: errors.New("no page"), want: []string{"http://x/"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := agent.New(agent.Options{Token: "template", Reaper: r})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			nav := func(_ context.Context, u string) error { got = append(got, u); return tc.navErr }
			apply := applySession(slog.Default(), srv, nil, session.Config{}, session.Vars{}, nav)
			err = apply(context.Background(), &desktoppb.ApplySessionRequest{Token: "mine", StartUrl: tc.url})
			if (err != nil) != tc.wantErr {
				t.Fatalf("apply: %v, want an error: %v", err, tc.wantErr)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("navigated to %q, want %q", got, tc.want)
			}
			want := map[bool]string{true: "template", false: "mine"}[tc.wantErr]
			for _, tok := range []string{"template", "mine"} {
				req := httptest.NewRequest(http.MethodPost, "/anything", nil)
				req.Header.Set(agent.TokenHeader, tok)
				rec := httptest.NewRecorder()
				srv.Handler().ServeHTTP(rec, req)
				if taken := rec.Code != http.StatusUnauthorized; taken != (tok == want) {
					t.Errorf("token %q taken: %v (answer %d), want only %q taken", tok, taken, rec.Code, want)
				}
			}
		})
	}
}
