package main

import (
	"context"
	"log/slog"
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
	apply := applySession(slog.Default(), srv, nil, session.Config{}, session.Vars{})
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
