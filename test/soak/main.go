// Command soak is cubicle's soak and fault harness (`make soak`).
//
// It re-executes itself in a network namespace of its own, makes a small
// ext4 filesystem for the data directory, and starts a cubicled there
// (loopback only, sandbox networking on a bridge of that namespace, an
// address pool two larger than the loops need). It runs N agent loops on
// the gvisor backend: create a desktop → screenshot and click twice a
// second if the machine allows (an exec every fifth time) for a few
// minutes, with a pause and resume of the sandbox now and then (where the
// backend pauses), an agent's task → destroy → again. Meanwhile it injects
// faults, each kind on its own schedule: kill -9 of a sandbox's runtime
// processes, the same at a random point of a pause,
// kill -9 of cubicled itself (restarted at once), a client that disconnects mid-exec, one that
// disconnects mid-upload, the agent's processes killed from inside the
// sandbox, the data directory filled up, the address pool exhausted, and
// slow clients (a slow reader, a stalled upload). At the end it destroys
// everything and audits the host: no process, mount, loop device, state
// directory, socket, network namespace, veth or nft rule of any sandbox it
// made may be left, and the store must list none alive.
//
// It scores what a user would call a problem (score.go): every create that
// fails and every failed request on a running sandbox is one, unless a
// fault aimed at that create or sandbox was in effect at the time and the
// error is the one it causes (no answer while cubicled is down and 503
// unavailable as it comes back, 503 "data directory is full" on a full
// disk, capacity_exhausted for want of an address on an empty pool, the
// answers of a sandbox that ended (409, 404, 503) on one whose runtime
// was killed, 503 "restarting" for -recovery on one whose desktop was
// killed inside); no fault explains a 500. Clients that go away or are
// slow must not be felt by the others at all. So is a loop slower than
// -min-rate screenshot+click per second while it has a sandbox (default
// 1 Hz, an agent loop's need), a sandbox lost to anything but a kill -9 of
// its own runtime (a full disk or a kill of cubicled during its pause
// included: it must run on, or stay paused), one stuck starting, a
// backend whose capabilities in GET /v1/info differ from what it must
// have (harness.Expected: gvisor pauses), and anything the final audit
// finds left.
//
// It reports, in Markdown: faults injected by kind, sandboxes made, the
// errors each fault explained, the problems, p50/p99 of screenshot, click
// and exec latency under that load, cubicled's restart time, the loops'
// achieved rate (each loop's too), and cubicled's RSS at the start,
// before each kill and at the end. It exits 1 if there is any problem.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/driver/oci"
	"github.com/cubicle-dev/cubicle/test/harness"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// soak is one run's shared state.
type soak struct {
	dataDir  string
	poolSize int // sandbox network addresses
	d        *harness.Daemon
	c        *client.Client
	log      func(format string, args ...any)

	mu       sync.Mutex
	lat      map[string][]time.Duration
	count    map[string]int
	faults   *faultLog
	all      map[string]bool // every sandbox made
	current  map[int]string  // worker → its sandbox now
	problems []string
	// loopActions and loopInUse are each loop's screenshot+clicks and
	// time spent using a sandbox, for the rate of the slowest one; the
	// time its sandbox spent pausing, paused and resuming is not use.
	loopActions map[int]int
	loopInUse   map[int]time.Duration
	period      time.Duration // of a loop's screenshot+click
	minRate     float64       // Hz the slowest loop must keep
	session     time.Duration // mean time a loop keeps a sandbox
	pauses      bool          // loops pause and resume; a fault hits a pause
	// probeBackend is the backend of the address-pool fault's sandboxes.
	probeBackend string
	// rssBeforeKill is cubicled's RSS (KiB) just before each kill -9.
	rssBeforeKill []int
	probes        int // sandboxes faults made, for their labels
}

func run() error {
	var (
		n          = flag.Int("sandboxes", 10, "concurrent agent loops, each with its own desktop")
		dur        = flag.Duration("duration", 30*time.Minute, "how long the loops run")
		faults     = flag.Int("faults", 24, "faults of each kind over the run: each kind has its own schedule, spread evenly and staggered against the others")
		period     = flag.Duration("period", 500*time.Millisecond, "each loop starts a screenshot+click this often (or at once when the last took longer), aiming above the 1 Hz an agent loop needs; the report gives the rate achieved, per loop too")
		session    = flag.Duration("session", 4*time.Minute, "mean time a loop keeps its sandbox (uniform from half to one and a half times this): an agent's task")
		probe      = flag.String("probe-backend", "runc", "backend of the extra sandboxes the address-pool fault makes: they only need to hold addresses, which every backend draws from the same pool")
		backend    = flag.String("backend", "gvisor", "backend of the sandboxes")
		imageDir   = flag.String("image-dir", envOr("CUBICLE_IMAGE_DIR", "/var/lib/cubicle/images"), "built images")
		dataMB     = flag.Int("data-mb", 16384, "size of the small filesystem made for the daemon's data directory (the \"data dir full\" fault fills it)")
		out        = flag.String("out", "", "also write the report to this file")
		benchmarks = flag.String("benchmarks", "", "also write the report as the soak section of this file (BENCHMARKS.md)")
		minRate    = flag.Float64("min-rate", 1, "screenshot+click per second the slowest loop must keep while it has a sandbox (the 1 Hz an agent loop needs); below it the run fails")
		recovery   = flag.Duration("recovery", time.Minute, "how long a desktop may take to come back after its processes were killed inside the sandbox: its 503 \"restarting\" answers are forgiven that long, and every other error on it is a problem")
		pauses     = flag.Bool("pause", true, "loops pause and resume their sandboxes now and then, and a fault kills a sandbox's runtime during a pause (where the backend can pause)")
	)
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("needs root (it runs sandboxes)")
	}
	if child, err := inOwnNetns(); !child || err != nil {
		return err
	}
	dataDir, err := os.MkdirTemp("", "cubicle-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	unmount, err := smallFS(dataDir+".ext4", dataDir, *dataMB)
	if err != nil {
		return fmt.Errorf("data dir filesystem: %w", err)
	}
	defer unmount()
	defer harness.RemoveBuild() // after d.Stop below
	// Two addresses to spare beyond the loops' sandboxes, which the
	// "address pool exhausted" fault takes and then asks for one more.
	cidr := poolCIDR(*n, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	d, err := harness.Start(ctx, harness.Options{DataDir: dataDir, ImageDir: *imageDir, DefaultBackend: *backend,
		Args: []string{"--max-sandboxes", strconv.Itoa(poolSize(cidr) + 4), "--idle-timeout", "10m",
			"--net", "--net-bridge", "cbsoak0", "--net-cidr", cidr}})
	cancel()
	if err != nil {
		return err
	}
	defer d.Stop()
	s := &soak{
		dataDir: dataDir, poolSize: poolSize(cidr), period: *period, minRate: *minRate, session: *session, probeBackend: *probe,
		d: d, c: client.New(d.URL, client.WithAPIKey(d.APIKey), client.WithTimeout(3*time.Minute)),
		log:     func(f string, a ...any) { fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+f+"\n", a...) },
		lat:     map[string][]time.Duration{},
		count:   map[string]int{},
		faults:  &faultLog{recovery: *recovery},
		all:     map[string]bool{},
		current: map[int]string{},

		loopActions: map[int]int{},
		loopInUse:   map[int]time.Duration{},
	}
	if *pauses {
		// Whether the backend pauses is the table's to say, not the
		// daemon's: a difference is a problem, and the loops pause
		// only where both say yes.
		info, err := s.c.Info(context.Background())
		if err != nil {
			return err
		}
		listed := false
		for _, b := range info.Backends {
			if b.Name == *backend {
				listed = true
				for _, bad := range harness.CheckCapabilities(*backend, b.Capabilities) {
					s.problem("GET /v1/info: %s", bad)
				}
				want, _ := harness.Expected(*backend)
				s.pauses = want.Pause && b.Capabilities.Pause
			}
		}
		if !listed {
			s.problem("GET /v1/info lists no backend %s", *backend)
		}
	}
	start := time.Now()
	rssStart := rss(d.Pid())

	// Ctrl-C or SIGTERM ends the loops early; the audit still runs, so
	// stopping a soak leaves nothing behind either.
	sigCtx, unsig := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer unsig()
	loopCtx, stop := context.WithTimeout(sigCtx, *dur)
	defer stop()
	var wg sync.WaitGroup
	for i := range *n {
		wg.Add(1)
		go func() { defer wg.Done(); s.agentLoop(loopCtx, i) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.injectFaults(loopCtx, *dur/time.Duration(*faults+1)) }()
	wg.Wait()
	rssEnd := rss(d.Pid())

	s.log("loops done after %v; destroying everything and auditing", time.Since(start).Round(time.Second))
	s.checkRates(*n)
	s.audit(dataDir)
	report := s.report(*n, *backend, time.Since(start), rssStart, rssEnd)
	fmt.Print(report)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(report), 0o644); err != nil {
			return err
		}
	}
	if *benchmarks != "" {
		if err := harness.ReplaceSection(*benchmarks, "soak", report); err != nil {
			return err
		}
	}
	if len(s.problems) > 0 {
		// The data dir goes with the run: keep the daemon's log, which
		// tells what a problem was.
		if *out != "" {
			if raw, err := os.ReadFile(d.Log); err == nil && os.WriteFile(*out+".cubicled.log", raw, 0o644) == nil {
				s.log("cubicled's log: %s", *out+".cubicled.log")
			}
		}
		return fmt.Errorf("%d problems (listed in the report)", len(s.problems))
	}
	return nil
}

func (s *soak) add(kind string, n int) { s.mu.Lock(); s.count[kind] += n; s.mu.Unlock() }

func (s *soak) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log("PROBLEM: %s", msg)
	s.mu.Lock()
	s.problems = append(s.problems, msg)
	s.mu.Unlock()
}

// timed runs f and records its latency if it succeeds. Operations are not
// held back while cubicled restarts: they fail, as an agent's would.
func (s *soak) timed(kind string, f func() error) error {
	t0 := time.Now()
	err := f()
	if err == nil {
		s.mu.Lock()
		s.lat[kind] = append(s.lat[kind], time.Since(t0))
		s.mu.Unlock()
	}
	return err
}

// agentLoop is one agent: sandbox after sandbox, each used for 30–120 s.
func (s *soak) agentLoop(ctx context.Context, worker int) {
	for ctx.Err() == nil {
		var sb client.Sandbox
		t0 := time.Now()
		err := s.timed("create", func() (err error) {
			sb, err = s.c.Create(ctx, client.CreateRequest{})
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				if why := s.faults.explainCreate(t0, time.Now(), err); why != "" {
					s.add("creates refused: "+why, 1)
					s.log("worker %d: create: %v (%s)", worker, err, why)
				} else {
					s.problem("worker %d: create failed and no fault explains it: %v", worker, err)
				}
				sleep(ctx, 2*time.Second)
			}
			continue
		}
		s.mu.Lock()
		s.all[sb.ID] = true
		s.current[worker] = sb.ID
		s.mu.Unlock()
		s.add("sandboxes made", 1)
		t0 = time.Now()
		paused := s.use(ctx, worker, sb.ID, s.session/2+rand.N(s.session))
		s.mu.Lock()
		s.loopInUse[worker] += time.Since(t0) - paused
		delete(s.current, worker)
		s.mu.Unlock()
		// Destroy always completes, whatever state the sandbox is in. An
		// agent retries while cubicled restarts; so does this one.
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		for {
			err = s.timed("destroy", func() error { return s.c.Destroy(dctx, sb.ID) })
			if err == nil || client.ErrorCode(err) != "" || dctx.Err() != nil {
				break
			}
			s.add("requests refused while cubicled restarted", 1)
			sleep(dctx, time.Second)
		}
		cancel()
		if err != nil && !client.IsNotFound(err) {
			s.problem("destroy %s: %v", sb.ID, err)
		}
	}
}

// use drives one sandbox, a screenshot and a click every s.period (an
// exec every fifth time, a pause and resume every pauseEvery times),
// until d has passed or it dies, and returns the time its pauses and
// resumes took.
func (s *soak) use(ctx context.Context, worker int, id string, d time.Duration) (paused time.Duration) {
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
		tick := time.Now()
		err := s.timed("screenshot", func() error {
			png, err := s.c.Screenshot(ctx, id, client.ScreenshotOptions{})
			if err == nil && !bytes.HasPrefix(png, []byte("\x89PNG")) {
				err = errors.New("screenshot is not a PNG")
			}
			return err
		})
		if err == nil {
			err = s.timed("click", func() error { return s.c.Click(ctx, id, 100+rand.IntN(800), 100+rand.IntN(500)) })
		}
		pausing := false
		if err == nil && i > 0 && i%pauseEvery == 0 && s.pauses {
			// An agent's session paused while its user is away, and
			// resumed: it must answer as before.
			pausing = true
			tp := time.Now()
			err = s.timed("pause", func() error { _, err := s.c.Pause(ctx, id); return err })
			if err == nil {
				err = s.timed("resume", func() error { _, err := s.c.Resume(ctx, id, 0); return err })
			}
			paused += time.Since(tp)
			if err == nil {
				s.add("pause/resume cycles", 1)
			}
		}
		if err == nil && i%5 == 0 {
			err = s.timed("exec", func() error {
				res, err := s.c.Exec(ctx, id, client.ExecRequest{Command: "echo ok-" + strconv.Itoa(i)})
				if err == nil && res.Stdout != "ok-"+strconv.Itoa(i)+"\n" {
					err = fmt.Errorf("exec printed %q", res.Stdout)
				}
				return err
			})
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			why := ""
			if pausing {
				why = s.faults.explainPause(id, tick, time.Now(), err)
			}
			if why == "" {
				why = s.faults.explainRequest(id, tick, time.Now(), err)
			}
			if why != "" {
				s.add("errors explained: "+why, 1)
			}
			if pausing && (why == faultDaemonKill || why == faultDiskFull) {
				// The daemon died while it paused or resumed the
				// sandbox, which may be paused now (the pause had saved
				// it), or a full disk refused or failed the resume,
				// which leaves it paused: as an agent would, resume it
				// (once the daemon is back, or the disk has room). One
				// that never resumes is lost: the loop's next request
				// finds it. The wait is paused time, not use.
				tw := time.Now()
				s.resumeIfPaused(ctx, id)
				paused += time.Since(tw)
			}
			if noAnswer(err) {
				// The daemon is down: the next request tells more.
				if why == "" {
					s.problem("worker %d: %s: %v, and no fault explains it", worker, id, err)
				}
			} else {
				// A sandbox that ended unexplained is one problem,
				// whatever its requests answered meanwhile (gone counts
				// it); one that its runtime's kill ended still owes an
				// explanation for an answer no fault causes (a 500, a
				// wrong answer).
				ended := s.gone(worker, id, err)
				if why == "" && (!ended || s.faults.killed(id)) {
					s.problem("worker %d: %s: %v, and no fault explains it", worker, id, err)
				}
				if ended {
					return
				}
			}
		} else {
			s.add("actions", 1)
			s.mu.Lock()
			s.loopActions[worker]++
			s.mu.Unlock()
		}
		sleep(ctx, s.period-time.Since(tick))
	}
	return paused
}

// resumeIfPaused waits, once cubicled answers again, until sandbox id is
// running (within three minutes): a kill of cubicled while it paused or
// resumed the sandbox leaves it paused (the pause had saved it; it is
// resumed here, as an agent would) or resuming (the restarted daemon
// finishes the resume itself), and a full disk that refused or failed
// its resume leaves it paused (resumed here once there is room). A sandbox that ended instead is lost,
// which no kill of cubicled explains: the loop's next failed request
// finds it (gone) and counts the problem.
func (s *soak) resumeIfPaused(ctx context.Context, id string) {
	// A full disk lasts as long as the fault's create (up to 2 min).
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for rctx.Err() == nil {
		sb, err := s.c.Get(rctx, id)
		switch {
		case err != nil && daemonDown(err):
			// Restarting: no answer, or 503 while it comes back (a
			// 30-minute soak lost a resume to giving up on that 503).
			sleep(rctx, time.Second)
			continue
		case err != nil:
			return
		}
		switch sb.State {
		case "paused":
			if err := s.timed("resume", func() error { _, err := s.c.Resume(rctx, id, 0); return err }); err == nil {
				s.add("sandboxes resumed again after a kill of cubicled or a full disk cut their pause or resume", 1)
				return
			}
			sleep(rctx, time.Second)
		case "pausing", "resuming":
			sleep(rctx, 500*time.Millisecond)
		default:
			return
		}
	}
}

// gone decides whether the sandbox of a failed request has ended, and
// counts a problem if it has, unless a kill -9 of its own runtime ended
// it (move on): a full disk, a kill of cubicled or of its desktop must
// leave it running (or paused). It returns false while it runs or the
// daemon does not answer.
func (s *soak) gone(worker int, id string, err error) bool {
	gctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sb client.Sandbox
	var gerr error
	for range 10 { // the daemon may be restarting
		if gerr = s.timed("get", func() (err error) { sb, err = s.c.Get(gctx, id); return err }); gerr == nil {
			break
		}
		sleep(gctx, time.Second)
	}
	switch {
	case gerr != nil && client.IsNotFound(gerr):
		s.problem("worker %d: sandbox %s vanished (%v)", worker, id, err)
		return true
	case gerr != nil:
		return false // the daemon is down; the next request tells
	case sb.State == "running":
		return false
	case s.faults.killed(id):
		s.add("sandboxes lost to a kill -9 of their runtime", 1)
		return true
	default:
		s.problem("worker %d: sandbox %s is %s, not running, and no kill -9 of its own runtime explains it (%v; %s)", worker, id, sb.State, err, sb.Error)
		return true
	}
}

// injectFaults gives each kind of fault its own schedule, one every
// period, the kinds staggered across it. Kinds overlap in time (a slow
// client while the address pool is exhausted, say), as they would in
// production; one that could not be injected (cubicled was down, no
// sandbox to aim at) is tried again a few seconds later.
func (s *soak) injectFaults(ctx context.Context, period time.Duration) {
	kinds := []struct {
		name string
		f    func(context.Context, string) error
	}{
		{faultRuntimeKill, s.killRuntime},
		{faultDaemonKill, s.killDaemon},
		{"client gone mid-exec", s.disconnectExec},
		{"client gone mid-upload", s.disconnectUpload},
		{faultKillInside, s.killInside},
		{faultDiskFull, s.dataDirFull},
		{faultPoolEmpty, s.poolExhausted},
		{"slow clients", s.slowClients},
	}
	if s.pauses {
		kinds = append(kinds, struct {
			name string
			f    func(context.Context, string) error
		}{faultRuntimeKill + " during a pause", s.killDuringPause})
	}
	var wg sync.WaitGroup
	for i, k := range kinds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleep(ctx, period*time.Duration(i)/time.Duration(len(kinds)))
			for next := time.Now(); ; next = next.Add(period) {
				sleep(ctx, time.Until(next.Add(period)))
				for ctx.Err() == nil {
					id := s.victim()
					err := errors.New("no sandbox running")
					if id != "" {
						err = k.f(ctx, id)
					}
					if err == nil {
						s.add("fault: "+k.name, 1)
						s.log("fault %q on %s", k.name, id)
						break
					}
					s.log("fault %q on %s: %v; again in 5 s", k.name, id, err)
					s.add("faults that could not be injected (tried again)", 1)
					sleep(ctx, 5*time.Second)
				}
				if ctx.Err() != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
}

func (s *soak) victim() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, id := range s.current {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return ""
	}
	return ids[rand.IntN(len(ids))]
}

// pauseEvery is how many screenshot+click rounds a loop makes between
// the pauses and resumes of its sandbox.
const pauseEvery = 60

// killDuringPause pauses a sandbox and kills its runtime's processes at
// a random point of the pause: whatever that leaves (a sandbox still
// running, dead, or paused) is the fault's, and destroying it must free
// everything (the final audit checks).
func (s *soak) killDuringPause(ctx context.Context, id string) error {
	if len(harness.HostProcesses(id)) == 0 {
		return errors.New("no host process")
	}
	s.faults.begin(faultRuntimeKill, id) // for good: the sandbox is the fault's
	done := make(chan struct{})
	go func() { defer close(done); s.c.Pause(ctx, id) }()
	sleep(ctx, time.Duration(rand.Int64N(int64(4*time.Second))))
	for _, p := range harness.HostProcesses(id) {
		syscall.Kill(p, syscall.SIGKILL)
	}
	<-done
	return nil
}

func (s *soak) killRuntime(_ context.Context, id string) error {
	pids := harness.HostProcesses(id)
	if len(pids) == 0 {
		return errors.New("no host process")
	}
	s.faults.begin(faultRuntimeKill, id) // for good: the sandbox is dead
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	return nil
}

func (s *soak) killDaemon(ctx context.Context, _ string) error {
	// Each incarnation's RSS just before it dies: with restarts every
	// minute or so, the end RSS alone would say little about growth.
	if kb := rss(s.d.Pid()); kb > 0 {
		s.mu.Lock()
		s.rssBeforeKill = append(s.rssBeforeKill, kb)
		s.mu.Unlock()
	}
	end := s.faults.begin(faultDaemonKill, "")
	defer end(afterRestart)
	s.d.Kill9()
	sleep(ctx, time.Duration(rand.IntN(2000))*time.Millisecond)
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// From exec to an answering API, with every live sandbox to re-adopt.
	if err := s.timed("restart", func() error { return s.d.Restart(rctx) }); err != nil {
		s.problem("cubicled did not restart: %v", err)
		return err
	}
	return nil
}

func (s *soak) disconnectExec(ctx context.Context, id string) error {
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := s.c.Exec(cctx, id, client.ExecRequest{Command: "sleep 5"})
	cancel()
	if err == nil {
		return errors.New("exec of sleep 5 finished within 300 ms")
	}
	return nil
}

func (s *soak) disconnectUpload(ctx context.Context, id string) error {
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	r := io.MultiReader(bytes.NewReader(make([]byte, 1<<20)), blockUntil(cctx))
	if _, err := s.c.Upload(cctx, id, "/tmp/soak-partial.bin", r); err == nil {
		return errors.New("an upload cut at 1 MiB succeeded")
	}
	return nil
}

func (s *soak) killInside(ctx context.Context, id string) error {
	end := s.faults.begin(faultKillInside, id)
	defer end(s.faults.recovery)
	// Everything but init: the session (Xvfb, Chromium, x11vnc), which the
	// agent's supervisor must bring back.
	// The exec may die with the rest: its error is expected.
	_, _ = s.c.Exec(ctx, id, client.ExecRequest{Command: "kill -9 -1"})
	return nil
}

// blockUntil is a reader that blocks until ctx ends.
type blockReader struct{ ctx context.Context }

func blockUntil(ctx context.Context) io.Reader { return blockReader{ctx} }

func (b blockReader) Read([]byte) (int, error) { <-b.ctx.Done(); return 0, b.ctx.Err() }

// audit destroys what is left and checks that the host holds nothing of
// any sandbox the run made.
func (s *soak) audit(dataDir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if sbs, err := s.c.List(ctx, client.ListOptions{}); err != nil {
		s.problem("list: %v", err)
	} else {
		for _, sb := range sbs {
			if sb.State == "starting" {
				s.problem("sandbox %s still starting at the end (stuck)", sb.ID)
			}
			if err := s.c.Destroy(ctx, sb.ID); err != nil && !client.IsNotFound(err) {
				s.problem("final destroy %s: %v", sb.ID, err)
			}
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var left []string
		if sbs, err := s.c.List(ctx, client.ListOptions{}); err == nil {
			for _, sb := range sbs {
				if sb.State != "stopped" && sb.State != "failed" {
					left = append(left, sb.ID+" "+sb.State)
				}
			}
		}
		s.mu.Lock()
		ids := slices.Collect(func(yield func(string) bool) {
			for id := range s.all {
				if !yield(id) {
					return
				}
			}
		})
		s.mu.Unlock()
		for _, id := range ids {
			if pids := harness.HostProcesses(id); len(pids) > 0 {
				left = append(left, fmt.Sprintf("%s: processes %v", id, pids))
			}
		}
		for _, l := range sandboxLinks() {
			left = append(left, "network link: "+l)
		}
		for _, l := range loopsUnder(dataDir) {
			left = append(left, "loop device: "+l)
		}
		if out, err := exec.Command("nft", "list", "ruleset").CombinedOutput(); err != nil {
			left = append(left, fmt.Sprintf("nft list ruleset: %v", err))
		} else if strings.Contains(string(out), "sb-") {
			left = append(left, "nft rules of sandboxes:\n"+string(out))
		}
		for _, id := range ids {
			if _, err := os.Stat("/run/netns/cubicle-" + id); err == nil {
				left = append(left, "network namespace of "+id)
			}
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(mounts), "\n") {
			// The data dir itself is the soak's own filesystem.
			if f := strings.Fields(line); len(f) > 4 && f[4] == dataDir {
				continue
			}
			if strings.Contains(line, dataDir) {
				left = append(left, "mount: "+line)
			}
		}
		filepath.WalkDir(dataDir, func(p string, e os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			for _, id := range ids {
				if strings.Contains(e.Name(), id) {
					left = append(left, "path: "+p)
					if e.IsDir() {
						return filepath.SkipDir
					}
				}
			}
			if e.Type()&os.ModeSocket != 0 {
				left = append(left, "socket: "+p)
			}
			return nil
		})
		// The runtimes' records, kept off the data dir (oci.RuntimeRootBase).
		for _, backend := range []string{"gvisor", "runc"} {
			root := oci.DefaultRuntimeRoot(filepath.Join(dataDir, "oci", backend))
			ents, _ := os.ReadDir(root)
			for _, e := range ents {
				for _, id := range ids {
					if strings.Contains(e.Name(), id) {
						left = append(left, "runtime record: "+filepath.Join(root, e.Name()))
					}
				}
			}
		}
		if len(left) == 0 {
			s.add("audit: sandboxes accounted for", len(ids))
			return
		}
		if time.Now().After(deadline) {
			for _, l := range left {
				s.problem("left behind: %s", l)
			}
			return
		}
		time.Sleep(2 * time.Second)
	}
}

func (s *soak) report(n int, backend string, took time.Duration, rssStart, rssEnd int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "## Soak: %d %s desktops, %v\n\n", n, backend, took.Round(time.Second))
	fmt.Fprintf(&b, "Each loop keeps a sandbox %v to %v (an agent's task), then destroys it and creates the next; screenshot+click every %v, an exec every fifth time. The address-pool fault's extra sandboxes are %s.\n\n",
		s.session/2, s.session*3/2, s.period, s.probeBackend)
	fmt.Fprintf(&b, "cubicled RSS: %d MiB at the start, %d MiB at the end (its last incarnation).\n\n", rssStart>>10, rssEnd>>10)
	if k := s.rssBeforeKill; len(k) > 0 {
		third := max(len(k)/3, 1)
		fmt.Fprintf(&b, "cubicled RSS just before each of its %d kills: min %.1f MiB, max %.1f MiB; mean of the first third %.1f MiB, of the last third %.1f MiB.\n\n",
			len(k), float64(slices.Min(k))/1024, float64(slices.Max(k))/1024, meanMiB(k[:third]), meanMiB(k[len(k)-third:]))
	}
	var inUse time.Duration
	for _, d := range s.loopInUse {
		inUse += d
	}
	fmt.Fprintf(&b, "Screenshot+click loop: %.2f Hz per desktop over the run (creates and destroys included), %.2f Hz while a sandbox was in use.\n\n",
		float64(s.count["actions"])/(float64(n)*took.Seconds()), float64(s.count["actions"])/max(inUse.Seconds(), 1))
	var rates []float64
	for w, d := range s.loopInUse {
		rates = append(rates, float64(s.loopActions[w])/max(d.Seconds(), 1))
	}
	if len(rates) > 0 {
		slices.Sort(rates)
		fmt.Fprintf(&b, "Per loop, while its sandbox was in use: slowest %.2f Hz, median %.2f Hz, fastest %.2f Hz (floor %.2f Hz: a slower loop is a problem).\n\n",
			rates[0], rates[len(rates)/2], rates[len(rates)-1], s.minRate)
	}
	fmt.Fprintf(&b, "| operation | n | p50 | p99 |\n|---|---|---|---|\n")
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range s.lat {
			if !yield(k) {
				return
			}
		}
	}) {
		ds := slices.Clone(s.lat[k])
		slices.Sort(ds)
		fmt.Fprintf(&b, "| %s | %d | %v | %v |\n", k, len(ds), pct(ds, 50), pct(ds, 99))
	}
	fmt.Fprintf(&b, "\n| count | n |\n|---|---|\n")
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range s.count {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, s.count[k])
	}
	fmt.Fprintf(&b, "\nProblems: %d\n", len(s.problems))
	for _, p := range s.problems {
		fmt.Fprintf(&b, "- %s\n", p)
	}
	return b.String()
}

// checkRates makes a problem of every loop slower than s.minRate.
func (s *soak) checkRates(n int) {
	s.mu.Lock()
	var probs []string
	for w := range n {
		if p := rateProblem(w, s.loopActions[w], s.loopInUse[w], s.minRate); p != "" {
			probs = append(probs, p)
		}
	}
	s.mu.Unlock()
	for _, p := range probs {
		s.problem("%s", p)
	}
}

func meanMiB(kb []int) float64 {
	sum := 0
	for _, v := range kb {
		sum += v
	}
	return float64(sum) / float64(len(kb)) / 1024
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, len(ds)*p/100)].Round(100 * time.Microsecond)
}

// rss is a process's resident set in KiB.
func rss(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
