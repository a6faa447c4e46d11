package agentclient_test

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	"github.com/cubicle-dev/cubicle/internal/agentclient"
	"github.com/cubicle-dev/cubicle/internal/needs"
	pb "github.com/cubicle-dev/cubicle/proto/process"
)

// newAgent runs an in-process agent on a unix socket and returns a client.
func newAgent(t *testing.T) *agentclient.Client {
	t.Helper()
	r, err := reap.Start(reap.Own, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := agent.New(agent.Options{Token: "tok", Reaper: r, Env: []string{"SANDBOX=1"}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := agent.ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, "tok")
	t.Cleanup(func() {
		c.Close()
		srv.Process.Signal(9)
		_ = srv.Shutdown(context.Background())
		time.Sleep(50 * time.Millisecond)
		r.Stop()
	})
	return c
}

func TestExec(t *testing.T) {
	c := newAgent(t)
	tests := []struct {
		name      string
		req       agentclient.ExecRequest
		root      bool
		stdout    string
		stderr    string
		code      int
		truncated bool
		timedOut  bool
	}{
		{name: "argv", req: agentclient.ExecRequest{Argv: []string{"echo", "hi"}}, stdout: "hi\n"},
		{name: "command", req: agentclient.ExecRequest{Command: "echo out; echo err >&2; exit 4"}, stdout: "out\n", stderr: "err\n", code: 4},
		{name: "env cwd", req: agentclient.ExecRequest{Command: `echo $A $SANDBOX; pwd`, Env: map[string]string{"A": "b"}, Cwd: "/tmp"}, stdout: "b 1\n/tmp\n"},
		{name: "user", req: agentclient.ExecRequest{Command: "id -un", User: "nobody"}, stdout: "nobody\n", root: true},
		{name: "stdin", req: agentclient.ExecRequest{Argv: []string{"tr", "a-z", "A-Z"}, Stdin: []byte("shout\n")}, stdout: "SHOUT\n"},
		{name: "no stdin is EOF", req: agentclient.ExecRequest{Argv: []string{"cat"}}, stdout: ""},
		{name: "truncated", req: agentclient.ExecRequest{Command: "head -c 100000 /dev/zero | tr '\\0' x; echo done >&2", MaxOutput: 1000},
			stdout: strings.Repeat("x", 1000), truncated: true},
		{name: "timeout", req: agentclient.ExecRequest{Command: "echo start; sleep 30", Timeout: 300 * time.Millisecond},
			stdout: "start\n", code: -1, timedOut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				needs.Root(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			res, err := c.Exec(ctx, tt.req, nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != tt.stdout || string(res.Stderr) != tt.stderr || res.ExitCode != tt.code ||
				res.Truncated != tt.truncated || res.TimedOut != tt.timedOut {
				t.Errorf("got stdout %.40q stderr %q code %d truncated %v timedOut %v; want %.40q %q %d %v %v",
					res.Stdout, res.Stderr, res.ExitCode, res.Truncated, res.TimedOut,
					tt.stdout, tt.stderr, tt.code, tt.truncated, tt.timedOut)
			}
			if res.Pid == 0 || res.Duration <= 0 {
				t.Errorf("pid %d duration %v", res.Pid, res.Duration)
			}
		})
	}
}

func TestExecStreaming(t *testing.T) {
	c := newAgent(t)
	var got bytes.Buffer
	var streams []string
	res, err := c.Exec(context.Background(), agentclient.ExecRequest{Command: "echo a; sleep 0.1; echo b >&2"}, func(stream string, data []byte) error {
		streams = append(streams, stream)
		got.Write(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != "a\nb\n" || !slices.Equal(streams, []string{"stdout", "stderr"}) || res.Stdout != nil {
		t.Errorf("streamed %q on %v, result stdout %q", got.String(), streams, res.Stdout)
	}
}

func TestExecErrors(t *testing.T) {
	c := newAgent(t)
	if _, err := c.Exec(context.Background(), agentclient.ExecRequest{}, nil); err == nil {
		t.Error("empty request succeeded")
	}
	_, err := c.Exec(context.Background(), agentclient.ExecRequest{Argv: []string{"/no/such/binary"}}, nil)
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("missing binary: %v", err)
	}
}

func TestBackground(t *testing.T) {
	c := newAgent(t)
	ctx := context.Background()
	// A deadline on the caller's context must not become the process's.
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	pid, err := c.Background(sctx, agentclient.ExecRequest{Argv: []string{"sleep", "60"}, Tag: "bg"})
	if err != nil {
		t.Fatal(err)
	}
	<-sctx.Done()
	time.Sleep(200 * time.Millisecond)
	list, err := c.Process.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list.Msg.GetProcesses(), func(p *pb.ProcessInfo) bool { return p.GetPid() == pid && p.GetTag() == "bg" }) {
		t.Fatalf("background process %d not listed: %v", pid, list.Msg.GetProcesses())
	}
	if _, err := c.Process.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGTERM,
	})); err != nil {
		t.Fatal(err)
	}
}

// TestExecCancel checks that a cancelled Exec kills its command.
func TestExecCancel(t *testing.T) {
	c := newAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, err := c.Exec(ctx, agentclient.ExecRequest{Argv: []string{"sleep", "60"}}, nil)
	if err == nil {
		t.Fatal("Exec outlived its context")
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		list, err := c.Process.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(list.Msg.GetProcesses(), func(p *pb.ProcessInfo) bool { return p.GetPid() == res.Pid }) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("process %d still running after cancel", res.Pid)
}
