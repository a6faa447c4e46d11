package process

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/needs"
	pb "github.com/cubicle-dev/cubicle/proto/process"
	"github.com/cubicle-dev/cubicle/proto/process/processconnect"
)

// newTest starts a process service behind an httptest server and returns a
// client of it.
func newTest(t *testing.T) (processconnect.ProcessClient, *Service) {
	t.Helper()
	r, err := reap.Start(reap.All, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := New(Options{Reaper: r, Env: []string{"SANDBOX_VAR=sv", "HOME=/wrong"}, Display: ":7"})
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(svc))
	ts := httptest.NewServer(mux)
	t.Cleanup(func() {
		svc.Signal(9)
		ts.Close()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			svc.mu.Lock()
			n := len(svc.procs)
			svc.mu.Unlock()
			if n == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		r.Stop()
	})
	return processconnect.NewProcessClient(ts.Client(), ts.URL), svc
}

type result struct {
	events []*pb.ProcessEvent
	stdout string
	stderr string
	pty    string
	end    *pb.ProcessEvent_EndEvent
	err    error
}

// collect reads a whole event stream.
func collect(recv func() bool, msg func() *pb.ProcessEvent, errf func() error) result {
	var r result
	for recv() {
		ev := msg()
		r.events = append(r.events, ev)
		switch {
		case ev.GetData() != nil:
			r.stdout += string(ev.GetData().GetStdout())
			r.stderr += string(ev.GetData().GetStderr())
			r.pty += string(ev.GetData().GetPty())
		case ev.GetEnd() != nil:
			r.end = ev.GetEnd()
		}
	}
	r.err = errf()
	return r
}

func start(ctx context.Context, t *testing.T, c processconnect.ProcessClient, req *pb.StartRequest, header map[string]string) result {
	t.Helper()
	creq := connect.NewRequest(req)
	for k, v := range header {
		creq.Header().Set(k, v)
	}
	st, err := c.Start(ctx, creq)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return collect(st.Receive, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
}

func cmd(name string, args ...string) *pb.ProcessConfig {
	return &pb.ProcessConfig{Cmd: name, Args: args}
}

func no() *bool { b := false; return &b }

func TestStart(t *testing.T) {
	c, _ := newTest(t)
	tests := []struct {
		name       string
		req        *pb.StartRequest
		header     map[string]string
		root       bool
		wantStdout string
		wantStderr string
		wantCode   int32
	}{
		{name: "echo", req: &pb.StartRequest{Process: cmd("echo", "hello"), Stdin: no()}, wantStdout: "hello\n"},
		{name: "exit code and stderr", req: &pb.StartRequest{Process: cmd("/bin/sh", "-c", "echo oops >&2; exit 3"), Stdin: no()}, wantStderr: "oops\n", wantCode: 3},
		{
			name: "env and cwd",
			req: &pb.StartRequest{Process: &pb.ProcessConfig{
				Cmd: "/bin/sh", Args: []string{"-c", `echo "$FOO $SANDBOX_VAR $DISPLAY $HOME"; pwd`},
				Envs: map[string]string{"FOO": "bar", "SANDBOX_VAR": "overridden"}, Cwd: ptr("/tmp"),
			}, Stdin: no()},
			wantStdout: "bar overridden :7 /root\n/tmp\n",
			root:       true,
		},
		{
			name:       "as nobody",
			req:        &pb.StartRequest{Process: cmd("/bin/sh", "-c", `id -u; echo "$USER $LOGNAME"; pwd`), Stdin: no()},
			header:     map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("nobody:"))},
			wantStdout: "65534\nnobody nobody\n/nonexistent\n",
			root:       true,
		},
		{name: "no stdin means EOF", req: &pb.StartRequest{Process: cmd("cat"), Stdin: no()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				needs.Root(t)
			}
			want := tt.wantStdout
			if tt.name == "as nobody" {
				if _, err := os.Stat("/nonexistent"); err != nil {
					want = strings.Replace(want, "/nonexistent", "/", 1) // home missing: cwd falls back to /
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r := start(ctx, t, c, tt.req, tt.header)
			if r.err != nil {
				t.Fatalf("stream error: %v", r.err)
			}
			if len(r.events) == 0 || r.events[0].GetStart() == nil || r.events[0].GetStart().GetPid() == 0 {
				t.Fatalf("first event = %v, want start with pid", r.events)
			}
			if last := r.events[len(r.events)-1]; last.GetEnd() == nil {
				t.Fatalf("last event = %v, want end", last)
			}
			if r.stdout != want {
				t.Errorf("stdout = %q, want %q", r.stdout, want)
			}
			if r.stderr != tt.wantStderr {
				t.Errorf("stderr = %q, want %q", r.stderr, tt.wantStderr)
			}
			if r.end.GetExitCode() != tt.wantCode || !r.end.GetExited() {
				t.Errorf("end = %v, want exit code %d, exited", r.end, tt.wantCode)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestStartErrors(t *testing.T) {
	c, _ := newTest(t)
	tests := []struct {
		name string
		req  *pb.StartRequest
		hdr  map[string]string
		want connect.Code
	}{
		{"missing command", &pb.StartRequest{Process: cmd("no-such-command-xyz")}, nil, connect.CodeInvalidArgument},
		{"empty command", &pb.StartRequest{Process: cmd("")}, nil, connect.CodeInvalidArgument},
		{"bad cwd", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true", Cwd: ptr("/no/such/dir")}}, nil, connect.CodeInvalidArgument},
		{"unknown user", &pb.StartRequest{Process: cmd("true")}, map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("nosuchuserxyz:"))}, connect.CodePermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := connect.NewRequest(tt.req)
			for k, v := range tt.hdr {
				req.Header().Set(k, v)
			}
			st, err := c.Start(context.Background(), req)
			if err == nil {
				for st.Receive() {
				}
				err = st.Err()
			}
			if got := connect.CodeOf(err); got != tt.want {
				t.Errorf("code = %v (%v), want %v", got, err, tt.want)
			}
		})
	}
}

func TestStdin(t *testing.T) {
	c, _ := newTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: cmd("cat"), Stdin: ptr(true)}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", st.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	if _, err := c.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("abc\n")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r := collect(st.Receive, func() *pb.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if r.stdout != "abc\n" || r.end.GetExitCode() != 0 {
		t.Errorf("stdout %q end %v, want abc and exit 0", r.stdout, r.end)
	}
}

func TestPTY(t *testing.T) {
	c, _ := newTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := start(ctx, t, c, &pb.StartRequest{
		Process: cmd("/bin/sh", "-c", "stty size; echo $TERM"),
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 40}},
	}, nil)
	if want := "40 100\r\nxterm-256color\r\n"; r.pty != want {
		t.Errorf("pty output = %q, want %q", r.pty, want)
	}
}

// TestBackground checks that a process outlives the stream that started
// it, can be found by tag, re-attached with Connect and killed.
func TestBackground(t *testing.T) {
	c, _ := newTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: cmd("/bin/sh", "-c", "echo up; sleep 60"), Tag: ptr("bg"), Stdin: no()}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	cancel() // drop the stream
	st.Close()
	time.Sleep(200 * time.Millisecond)

	bg := context.Background()
	list, err := c.List(bg, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list.Msg.GetProcesses(), func(p *pb.ProcessInfo) bool { return p.GetPid() == pid && p.GetTag() == "bg" }) {
		t.Fatalf("List = %v, want pid %d tagged bg", list.Msg.GetProcesses(), pid)
	}

	cst, err := c.Connect(bg, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "bg"}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cst.Close()
	if !cst.Receive() || cst.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: first event %v, err %v", cst.Msg(), cst.Err())
	}
	if _, err := c.SendSignal(bg, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Fatal(err)
	}
	r := collect(cst.Receive, func() *pb.ProcessEvent { return cst.Msg().GetEvent() }, cst.Err)
	if r.end == nil || r.end.GetExited() || r.end.GetStatus() != "signal: killed" || r.end.GetExitCode() != -1 {
		t.Errorf("end = %v, want killed", r.end)
	}
	waitGone(t, c, pid)
	if _, err := c.SendSignal(bg, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL,
	})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("signal after end: %v, want not found", err)
	}
}

func waitGone(t *testing.T, c processconnect.ProcessClient, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		list, err := c.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(list.Msg.GetProcesses(), func(p *pb.ProcessInfo) bool { return p.GetPid() == pid }) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("process %d still listed", pid)
}

func TestTimeLimit(t *testing.T) {
	c, _ := newTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("cubicle header keeps the stream", func(t *testing.T) {
		r := start(ctx, t, c, &pb.StartRequest{Process: cmd("sleep", "30"), Stdin: no()}, map[string]string{TimeoutHeader: "300"})
		if r.err != nil || r.end == nil || r.end.GetStatus() != "signal: killed" {
			t.Errorf("end = %v err %v, want killed", r.end, r.err)
		}
	})
	t.Run("connect timeout", func(t *testing.T) {
		// No deadline on ctx: the client would send its own Connect-Timeout-Ms.
		r := start(context.Background(), t, c, &pb.StartRequest{Process: cmd("sleep", "30"), Stdin: no()}, map[string]string{ConnectTimeoutHeader: "300"})
		if connect.CodeOf(r.err) != connect.CodeDeadlineExceeded {
			t.Errorf("err = %v, want deadline exceeded", r.err)
		}
		waitGone(t, c, r.events[0].GetStart().GetPid())
	})
}

func TestKeepalive(t *testing.T) {
	c, _ := newTest(t)
	r := start(context.Background(), t, c, &pb.StartRequest{Process: cmd("sleep", "1.5"), Stdin: no()}, map[string]string{KeepaliveHeader: "1"})
	if !slices.ContainsFunc(r.events, func(ev *pb.ProcessEvent) bool { return ev.GetKeepalive() != nil }) {
		t.Errorf("no keepalive in %v", r.events)
	}
}

// TestUnreadOutput checks that a process nobody listens to is not blocked
// by its output.
func TestUnreadOutput(t *testing.T) {
	c, _ := newTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: cmd("head", "-c", "20000000", "/dev/zero"), Stdin: no()}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatal(st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	cancel()
	st.Close()
	waitGone(t, c, pid)
}

func TestSelectorErrors(t *testing.T) {
	c, _ := newTest(t)
	ctx := context.Background()
	_, err := c.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "nope"}}}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("SendInput unknown tag: %v", err)
	}
	_, err = c.Update(ctx, connect.NewRequest(&pb.UpdateRequest{}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("Update without selector: %v", err)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Errorf("not a connect error: %v", err)
	}
}

// TestForkRetry: a start the kernel refuses for want of a process slot
// (here nobody's RLIMIT_NPROC of 0, which fails the exec with EAGAIN, as
// a sandbox's full pids cgroup fails the fork) is tried again, runs once
// a slot frees, and otherwise ends in a clear error.
func TestForkRetry(t *testing.T) {
	needs.Root(t)
	c, _ := newTest(t)
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &old); err != nil {
		t.Fatal(err)
	}
	full := unix.Rlimit{Cur: 0, Max: old.Max}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NPROC, &old) })
	asNobody := map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("nobody:"))}
	req := &pb.StartRequest{Process: cmd("/bin/echo", "started"), Stdin: no()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The kernel refuses only a user over the limit: nobody must have a
	// process already (the cleanup kills it).
	sleeper := connect.NewRequest(&pb.StartRequest{Process: cmd("sleep", "60"), Stdin: no()})
	sleeper.Header().Set("Authorization", asNobody["Authorization"])
	st, err := c.Start(ctx, sleeper)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("nobody's sleep did not start: %v", st.Err())
	}

	// A slot frees after 0.5 s: the command runs.
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &full); err != nil {
		t.Fatal(err)
	}
	freed := time.AfterFunc(500*time.Millisecond, func() { _ = unix.Setrlimit(unix.RLIMIT_NPROC, &old) })
	defer freed.Stop()
	if r := start(ctx, t, c, req, asNobody); r.err != nil || r.stdout != "started\n" {
		t.Fatalf("start while a slot freed: stdout %q, err %v; want it started", r.stdout, r.err)
	}

	// None frees: after the retries, a clear refusal.
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &full); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	r := start(ctx, t, c, req, asNobody)
	_ = unix.Setrlimit(unix.RLIMIT_NPROC, &old)
	if connect.CodeOf(r.err) != connect.CodeFailedPrecondition || !strings.Contains(r.err.Error(), "process limit") {
		t.Fatalf("start with no slot: %v; want failed_precondition naming the process limit", r.err)
	}
	if el := time.Since(t0); el < forkTries*forkRetryWait/2 {
		t.Errorf("refused after %v: want the retries first (about %v)", el, forkTries*forkRetryWait)
	}
}
