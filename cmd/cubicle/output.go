package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// now is the clock for ages and expiries; tests pin it.
var now = time.Now

// humanDuration renders d compactly: 45s, 12m, 3h5m, 2d4h.
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour:
		h := int(d.Hours())
		if m := int(d.Minutes()) % 60; m != 0 {
			return fmt.Sprintf("%dh%dm", h, m)
		}
		return fmt.Sprintf("%dh", h)
	default:
		days := int(d.Hours()) / 24
		if h := int(d.Hours()) % 24; h != 0 {
			return fmt.Sprintf("%dd%dh", days, h)
		}
		return fmt.Sprintf("%dd", days)
	}
}

func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return humanDuration(now().Sub(t))
}

func expiresIn(t time.Time) string {
	switch {
	case t.IsZero():
		return "-"
	case !t.After(now()):
		return "expired"
	default:
		return humanDuration(t.Sub(now()))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func resolution(r client.Resolution) string {
	if r.Width == 0 && r.Height == 0 {
		return "-"
	}
	return r.String()
}

// printSandboxTable writes the ls table.
func printSandboxTable(w io.Writer, sbs []client.Sandbox) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tBACKEND\tRESOLUTION\tAGE\tEXPIRES IN")
	for _, s := range sbs {
		exp := "-" // an ended sandbox no longer expires
		if s.State == "starting" || s.State == "running" {
			exp = expiresIn(s.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, orDash(s.State), orDash(s.Backend),
			resolution(s.Resolution), age(s.CreatedAt), exp)
	}
	_ = tw.Flush()
}

// printSandbox writes one sandbox as aligned "key: value" lines.
func printSandbox(w io.Writer, s client.Sandbox) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	line("id", s.ID)
	line("state", s.State)
	if s.Error != "" {
		line("error", s.Error)
	}
	line("template", orDash(s.Template))
	line("backend", fmt.Sprintf("%s (%s)", orDash(s.Backend), orDash(s.Isolation)))
	line("resolution", resolution(s.Resolution))
	if s.IP != "" {
		line("ip", s.IP)
	}
	if s.FromSnapshot != "" {
		line("from snapshot", s.FromSnapshot)
	}
	for _, v := range s.Volumes {
		line("volume", v.Name+" at "+v.Path)
	}
	line("created", timeAndRel(s.CreatedAt, age(s.CreatedAt)+" ago"))
	line("expires", timeAndRel(s.ExpiresAt, "in "+expiresIn(s.ExpiresAt)))
	line("last active", timeAndRel(s.LastActiveAt, age(s.LastActiveAt)+" ago"))
	if len(s.Metadata) > 0 {
		keys := make([]string, 0, len(s.Metadata))
		for k := range s.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, k+"="+s.Metadata[k])
		}
		line("metadata", strings.Join(parts, " "))
	}
	_ = tw.Flush()
}

func timeAndRel(t time.Time, rel string) string {
	if t.IsZero() {
		return "-"
	}
	if rel == "in expired" {
		rel = "expired"
	}
	return fmt.Sprintf("%s (%s)", t.Local().Format(time.RFC3339), rel)
}

// startProgress shows "msg… 3.2s" on w, redrawn in place, until the
// returned stop function is called; stop clears the line and waits for the
// drawing goroutine to end. It draws nothing when enabled is false.
func startProgress(w io.Writer, enabled bool, msg string) (stop func()) {
	if !enabled {
		return func() {}
	}
	frames := []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	start := time.Now()
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			fmt.Fprintf(w, "\r%s %s %.1fs ", frames[i%len(frames)], msg, time.Since(start).Seconds())
			select {
			case <-done:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}
