package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// minPauseCycles is the fewest cycles that run every check of
// TestPauseResume: the first cycle's checks of a paused sandbox, and a
// second resume as good as the first (E2B #884).
const minPauseCycles = 2

// pauseCycles is how many pause/resume cycles TestPauseResume runs per
// backend (CUBICLE_E2E_PAUSE_CYCLES, default 50 as the acceptance asks;
// never fewer than minPauseCycles).
func pauseCycles() int {
	if n, err := strconv.Atoi(os.Getenv("CUBICLE_E2E_PAUSE_CYCLES")); err == nil && n > 0 {
		return max(n, minPauseCycles)
	}
	return 50
}

// TestPauseResume pauses and resumes one desktop many times, through the
// REST API, and checks after every resume that nothing was lost: a
// page's JavaScript counter and a shell's counter (both in memory only)
// go on from where they were, the text typed into the page is still
// there, and a file written before each pause is on disk with every
// earlier one; the second resume is as good as the first (E2B #884).
// While paused the sandbox holds no process and refuses desktop calls.
// Then cubicled is killed -9 with the sandbox paused: the restarted
// daemon has it paused, and it resumes as it was. On runc, which cannot
// pause, pause answers 409 not_supported with the reason /v1/info gives.
// Which backends pause is the test's to say (harness.Expected), not the
// daemon's: one that should and says it cannot fails.
func TestPauseResume(t *testing.T) {
	for _, backend := range selectedBackends("gvisor", "qemu", "runc") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testPauseResume(t, backend)
		})
	}
}

var titleCount = regexp.MustCompile(`counter (\d+) \|(.*?)( - Chromium)?$`)

func testPauseResume(t *testing.T, backend string) {
	d, c := startDaemonArgs(t, backend)
	bg := context.Background()
	caps := backendCaps(t, c, backend) // as harness.Expected says, or t failed
	req := client.CreateRequest{Backend: backend}
	if isVM(backend) {
		req.MemoryMB = 1536
	}
	sb, err := c.Create(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	if !caps.Pause {
		_, err := c.Pause(bg, sb.ID)
		if !client.IsNotSupported(err) || caps.PauseReason == "" || !strings.Contains(err.Error(), caps.PauseReason[:min(20, len(caps.PauseReason))]) {
			t.Errorf("pause on %s, which cannot: %v; want not_supported with the reason /v1/info gives (%q)", backend, err, caps.PauseReason)
		}
		if got, _ := c.Get(bg, sb.ID); got.State != client.StateRunning {
			t.Errorf("a refused pause left the sandbox %s", got.State)
		}
		t.Logf("%s cannot pause: %s", backend, caps.PauseReason)
		return
	}
	if _, err := c.Resume(bg, sb.ID, 0); !client.IsConflict(err) {
		t.Errorf("resume of a running sandbox: %v, want conflict", err)
	}
	page, err := os.ReadFile("testdata/counter.html")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(bg, sb.ID, "/tmp/counter.html", bytes.NewReader(page)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "chromium window", func() bool { return chromiumUp(t, c, sb.ID) })
	if _, err := c.Actions(bg, sb.ID, client.PressKey("ctrl+l"), client.TypeText("file:///tmp/counter.html"), client.PressKey("Return")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "counter page", func() bool { n, _ := pageState(t, c, sb.ID); return n > 0 })
	const typed = "typed before the first pause"
	if _, err := c.Actions(bg, sb.ID, client.ClickAt(512, 420), client.TypeText(typed)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "typed text in the page", func() bool { _, s := pageState(t, c, sb.ID); return s == typed })
	shPid, err := c.Exec(bg, sb.ID, client.ExecRequest{Command: `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/sh-count.part; mv /tmp/sh-count.part /tmp/sh-count; sleep 0.2; done' >/dev/null 2>&1 & echo $!`})
	if err != nil || shPid.ExitCode != 0 {
		t.Fatalf("start shell counter: %+v %v", shPid, err)
	}
	shCount := func() int {
		res, err := c.Exec(bg, sb.ID, client.ExecRequest{Command: "cat /tmp/sh-count"})
		if err != nil {
			t.Fatalf("read shell counter: %v", err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
		return n
	}
	waitFor(t, "shell counter", func() bool { return shCount() > 0 })

	var pauses, resumes []time.Duration
	var sizes []int64
	cycle := func(i int) {
		t.Helper()
		if res, err := c.Exec(bg, sb.ID, client.ExecRequest{Command: fmt.Sprintf("echo cycle-%d > /var/tmp/cycle-%d && sync", i, i)}); err != nil || res.ExitCode != 0 {
			t.Fatalf("cycle %d: write file: %+v %v", i, res, err)
		}
		jsBefore, _ := pageState(t, c, sb.ID)
		shBefore := shCount()
		t0 := time.Now()
		p, err := c.Pause(bg, sb.ID)
		if err != nil {
			t.Fatalf("cycle %d: pause: %v", i, err)
		}
		pauses = append(pauses, time.Since(t0))
		sizes = append(sizes, p.PausedBytes)
		if p.State != client.StatePaused || p.PausedBytes <= 0 || p.PausedAt.IsZero() {
			t.Errorf("cycle %d: paused sandbox %+v", i, p)
		}
		if i == 1 {
			if pids := harness.HostProcesses(sb.ID); len(pids) > 0 {
				t.Errorf("processes of the paused sandbox: %v", pids)
			}
			if _, err := c.Screenshot(bg, sb.ID, client.ScreenshotOptions{}); !client.IsConflict(err) {
				t.Errorf("screenshot of a paused sandbox: %v, want conflict", err)
			}
			if _, err := c.Pause(bg, sb.ID); !client.IsConflict(err) {
				t.Errorf("pause of a paused sandbox: %v, want conflict", err)
			}
			if ls, err := c.List(bg, client.ListOptions{State: client.StatePaused}); err != nil || len(ls) != 1 || ls[0].ID != sb.ID {
				t.Errorf("list state=paused: %+v %v", ls, err)
			}
		}
		t0 = time.Now()
		r, err := c.Resume(bg, sb.ID, 0)
		if err != nil {
			t.Fatalf("cycle %d: resume: %v", i, err)
		}
		resumes = append(resumes, time.Since(t0))
		if r.State != client.StateRunning {
			t.Fatalf("cycle %d: resumed sandbox is %s", i, r.State)
		}
		checkIntact(t, c, sb.ID, i, jsBefore, shBefore, typed, shCount)
	}
	n := pauseCycles()
	for i := 1; i <= n && !t.Failed(); i++ {
		cycle(i)
	}
	t.Logf("%d cycles on %s: pause median %v p95 %v; resume median %v p95 %v; paused size median %d MiB",
		len(pauses), backend, pct(pauses, 50), pct(pauses, 95), pct(resumes, 50), pct(resumes, 95), median64(sizes)>>20)

	// Paused through a kill -9 of cubicled and a restart.
	if _, err := c.Pause(bg, sb.ID); err != nil {
		t.Fatal(err)
	}
	d.Kill9()
	rctx, rcancel := context.WithTimeout(bg, 2*time.Minute)
	defer rcancel()
	if err := d.Restart(rctx); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(bg, sb.ID); err != nil || got.State != client.StatePaused {
		t.Fatalf("after kill -9 and restart: %+v %v, want paused", got, err)
	}
	if _, err := c.Resume(bg, sb.ID, 0); err != nil {
		t.Fatalf("resume after the restart: %v", err)
	}
	checkIntact(t, c, sb.ID, n, 0, 0, typed, shCount)
	if err := c.Destroy(bg, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, d, backend, sb.ID)
}

// checkIntact checks a resumed sandbox after cycle i: the counters went
// on from at least where they were and still count, the typed text is
// there, and the files of cycles 1..i are.
func checkIntact(t *testing.T, c *client.Client, id string, i, jsBefore, shBefore int, typed string, shCount func() int) {
	t.Helper()
	bg := context.Background()
	js, text := pageState(t, c, id)
	if js < jsBefore || text != typed {
		t.Errorf("cycle %d: page counter %d (was %d), text %q (want %q)", i, js, jsBefore, text, typed)
	}
	sh := shCount()
	if sh < shBefore {
		t.Errorf("cycle %d: shell counter %d, was %d before the pause: it started over", i, sh, shBefore)
	}
	if !eventually(30*time.Second, func() bool { n, _ := pageState(t, c, id); return n > js }) {
		t.Errorf("cycle %d: the page's counter stands at %d after resume", i, js)
	}
	if !eventually(30*time.Second, func() bool { return shCount() > sh }) {
		t.Errorf("cycle %d: the shell counter stands at %d after resume", i, sh)
	}
	res, err := c.Exec(bg, id, client.ExecRequest{Command: "cat /var/tmp/cycle-*"})
	if err != nil {
		t.Fatalf("cycle %d: read files: %v", i, err)
	}
	if got := strings.Count(string(res.Stdout), "cycle-"); got != i {
		t.Errorf("cycle %d: %d of the %d files written before the pauses are there: %q", i, got, i, res.Stdout)
	}
}

// pageState reads the counter page's title: its counter and the text
// typed into it (0, "" when the page is not shown).
func pageState(t *testing.T, c *client.Client, id string) (int, string) {
	t.Helper()
	ws, err := c.Windows(context.Background(), id)
	if err != nil {
		t.Fatalf("windows: %v", err)
	}
	for _, w := range ws {
		if m := titleCount.FindStringSubmatch(w.Title); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n, m[2]
		}
	}
	return 0, ""
}

func chromiumUp(t *testing.T, c *client.Client, id string) bool {
	ws, err := c.Windows(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(ws, func(w client.Window) bool { return strings.Contains(strings.ToLower(w.Class), "chromium") })
}

// pct is the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))].Round(time.Millisecond)
}

func median64(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
