package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// buildDaemon builds cubicled into a temporary directory.
func buildDaemon(t *testing.T) string {
	t.Helper()
	needs.Command(t, "go")
	bin := filepath.Join(t.TempDir(), "cubicled")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// daemonEnv is the environment of a daemon under test: this process's
// without any CUBICLE_ variable, then vars (a later value of a variable
// wins). It listens on a free loopback port, its state goes to a fresh data
// directory, and no backend is usable (no agent binary), so that starting
// it touches nothing on the host, even when a broken build does start.
func daemonEnv(t *testing.T, vars ...string) (env []string, dataDir string) {
	dataDir = filepath.Join(t.TempDir(), "data")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CUBICLE_") {
			env = append(env, kv)
		}
	}
	env = append(env, "CUBICLE_LISTEN=127.0.0.1:0", "CUBICLE_DATA_DIR="+dataDir, "CUBICLE_IMAGE_DIR="+t.TempDir(),
		"CUBICLE_AGENT_BIN=/nonexistent/cubicle-agent", "CUBICLE_FIRECRACKER_BIN=/nonexistent/firecracker")
	return append(env, vars...), dataDir
}

// TestBadEnvironmentStopsTheDaemon: a variable its flag cannot parse is an
// error at start naming the variable and the value, before the daemon
// touches anything; it used to leave the default in place without a word.
func TestBadEnvironmentStopsTheDaemon(t *testing.T) {
	bin := buildDaemon(t)
	for _, tt := range []struct {
		env  string
		want string
	}{
		{"CUBICLE_IDLE_TIMEOUT=30", `invalid CUBICLE_IDLE_TIMEOUT="30" (for --idle-timeout, want a duration with a unit, such as 90s, 30m or 1h30m)`},
		{"CUBICLE_MAX_LIFETIME=1 hour", `invalid CUBICLE_MAX_LIFETIME="1 hour" (for --max-lifetime, want a duration`},
		{"CUBICLE_READY_TIMEOUT=-", `invalid CUBICLE_READY_TIMEOUT="-"`},
		{"CUBICLE_MAX_SANDBOXES=abc", `invalid CUBICLE_MAX_SANDBOXES="abc" (for --max-sandboxes, want a whole number)`},
		{"CUBICLE_KEY_MAX_SANDBOXES=ten", `invalid CUBICLE_KEY_MAX_SANDBOXES="ten"`},
		{"CUBICLE_SANDBOX_MAX_REQUESTS=64k", `invalid CUBICLE_SANDBOX_MAX_REQUESTS="64k"`},
		{"CUBICLE_DISK_MB=4G", `invalid CUBICLE_DISK_MB="4G"`},
		{"CUBICLE_KEY_CREATE_RATE=fast", `invalid CUBICLE_KEY_CREATE_RATE="fast" (for --key-create-rate, want a number)`},
		{"CUBICLE_NET=maybe", `invalid CUBICLE_NET="maybe" (for --net, want true or false (or 1 or 0))`},
		{"CUBICLE_E2B=off", `invalid CUBICLE_E2B="off" (for --e2b, want true or false (or 1 or 0))`},
		{"CUBICLE_VIEW_KEEPS_ALIVE=yes", `invalid CUBICLE_VIEW_KEEPS_ALIVE="yes"`},
		{"CUBICLE_LOG_LEVEL=loud", `invalid CUBICLE_LOG_LEVEL="loud" (for --log-level, want debug, info, warn or error)`},
		{"CUBICLE_NET_CIDR=10.99.0.0", `invalid CUBICLE_NET_CIDR="10.99.0.0" (for --net-cidr, want a network such as 10.99.0.0/16)`},
		{"CUBICLE_NET_DNS=dns.google", `invalid CUBICLE_NET_DNS="dns.google" (for --net-dns, want comma-separated IP addresses`},
		// Values the flag parses but the daemon cannot use also name
		// their variable.
		{"CUBICLE_DISK_MB=-1", `CUBICLE_DISK_MB="-1": want a size in MiB, or 0 for no limit`},
		{"CUBICLE_DEFAULT_BACKEND=kvm", `CUBICLE_DEFAULT_BACKEND="kvm": want auto, firecracker, qemu, gvisor or runc`},
		{"CUBICLE_METRICS_INTERVAL=100ms", `CUBICLE_METRICS_INTERVAL="100ms": want at least 1s`},
		{"CUBICLE_METRICS_WINDOW=2s", `CUBICLE_METRICS_WINDOW="2s": want at least the metrics interval (5s)`},
	} {
		t.Run(tt.env, func(t *testing.T) {
			env, dataDir := daemonEnv(t, tt.env)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin) //depcheck:built
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("cubicled exited with %v, want status 1; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), "cubicled: "+tt.want) {
				t.Errorf("output\n %s\ndoes not say\n cubicled: %s", out, tt.want)
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the daemon made its data directory before refusing its configuration: %v", err)
			}
		})
	}
}

// TestGoodEnvironmentIsUsed starts the daemon from variables alone (and one
// flag that overrides its variable) and checks that it runs with them.
func TestGoodEnvironmentIsUsed(t *testing.T) {
	bin := buildDaemon(t)
	env, _ := daemonEnv(t, "CUBICLE_LISTEN=127.0.0.1:0", "CUBICLE_MAX_SANDBOXES=3", "CUBICLE_IDLE_TIMEOUT=90s",
		"CUBICLE_MAX_LIFETIME=2h", "CUBICLE_READY_TIMEOUT=45s", "CUBICLE_DISK_MB=512", "CUBICLE_E2B=0", "CUBICLE_NET=false",
		"CUBICLE_LOG_LEVEL=debug", "CUBICLE_DEFAULT_BACKEND=runc", "CUBICLE_KEY_CREATE_RATE=0.5", "CUBICLE_NET_DNS=9.9.9.9")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--ready-timeout=50s") //depcheck:built
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("cubicled after SIGTERM: %v", err)
		}
	}()
	var listening map[string]any
	sc := bufio.NewScanner(stderr)
	for listening == nil && sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "cubicled listening" {
			listening = line
		}
	}
	if listening == nil {
		t.Fatalf("no 'cubicled listening' line (scan: %v)", sc.Err())
	}
	go func() { // keep the pipe drained
		for sc.Scan() {
		}
	}()
	for k, want := range map[string]any{
		"max_sandboxes": 3.0, "idle_timeout": "1m30s", "max_lifetime": "2h0m0s", "ready_timeout": "50s",
		"disk_mb": 512.0, "e2b": false, "net": false, "default_backend": "runc",
	} {
		if got := listening[k]; got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	resp, err := http.Get("http://" + listening["addr"].(string) + "/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		DefaultBackend string `json:"default_backend"`
		Capacity       struct {
			MaxSandboxes int `json:"max_sandboxes"`
		} `json:"capacity"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	if info.Capacity.MaxSandboxes != 3 || info.DefaultBackend != "runc" {
		t.Errorf("/v1/info: %+v, want max_sandboxes 3 and default_backend runc", info)
	}
}

// TestEveryFlagHasItsVariable: each flag's help names the variable that
// sets it, so that what -h says and what the daemon reads agree.
func TestEveryFlagHasItsVariable(t *testing.T) {
	bin := buildDaemon(t)
	cmd := exec.Command(bin, "-h") //depcheck:built
	cmd.Env, _ = daemonEnv(t)
	out, _ := cmd.CombinedOutput() // -h exits 0 or 2 depending on the Go version
	flagLine := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	lines := strings.Split(string(out), "\n")
	n := 0
	for i, l := range lines {
		m := flagLine.FindStringSubmatch(l)
		if m == nil || noEnv[m[1]] {
			continue
		}
		n++
		help := l
		for j := i + 1; j < len(lines) && strings.HasPrefix(lines[j], "    "); j++ {
			help += " " + strings.TrimSpace(lines[j])
		}
		if !strings.Contains(help, envName(m[1])) {
			t.Errorf("help of -%s does not name %s: %q", m[1], envName(m[1]), help)
		}
	}
	if n < 20 {
		t.Errorf("found %d flags in -h output, want all of them:\n%s", n, out)
	}
}
