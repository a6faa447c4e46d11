package firecracker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeFirecracker is a FAKE standing in for Firecracker, which cannot run
// on the development and CI machines (no usable KVM, no firecracker
// binary). It is an HTTP server on the API unix socket answering the part
// of Firecracker's REST API the driver uses — paths, bodies and status
// codes as in Firecracker's swagger file (PUT → 204 No Content, GET / →
// InstanceInfo, errors → 400 {"fault_message": ...}) — and it records every
// request in order so tests can assert the whole conversation. A `sleep`
// process stands in for the VMM process (its pid is what the driver
// watches). On InstanceStart it opens the hybrid-vsock socket and answers
// "CONNECT <port>\n" the way Firecracker does ("OK <host port>\n" when the
// guest listens, closing the connection when not), with an echo server
// standing in for the agent on port 1024. On SendCtrlAltDel it kills the
// stand-in process, as a guest reboot ends Firecracker.
type fakeFirecracker struct {
	t    *testing.T
	root string // the chroot (host path)
	fail map[string]string
	// onRequest, when set, acts out a valid request the way Firecracker
	// would (e.g. open the TAP a network interface names); an error is
	// answered as Firecracker's 400.
	onRequest func(method, path string, body any) error
	tapsGiven []string // the driver's giveTAP calls: "NETNS TAP UID:GID"
	// delay holds back the answer to requests of a path, as a loaded host
	// (or a large guest being set up) makes Firecracker take its time.
	delay map[string]time.Duration
	// pivot makes the stand-in VMM a process pivot_root'ed into the jail
	// as the jailer leaves Firecracker (startPivoted), instead of a sleep.
	pivot bool
	// ignoreCtrlAltDel makes SendCtrlAltDel do nothing, as with a guest
	// that does not shut down: only a kill ends the VMM then.
	ignoreCtrlAltDel bool
	mu               sync.Mutex
	reqs             []request
	args             []string // jailer command line the driver launched
	proc             *exec.Cmd
	srv              *http.Server
	vsock            net.Listener
	wg               sync.WaitGroup
}

// request is one recorded API request; Body is the decoded JSON body.
type request struct {
	Method, Path string
	Body         any
}

func newFake(t *testing.T) *fakeFirecracker {
	f := &fakeFirecracker{t: t, fail: map[string]string{}}
	t.Cleanup(f.close)
	return f
}

// launch replaces the driver's launcher: instead of running the jailer it
// records its command line, serves the API on the socket the jailer's
// Firecracker would create, and starts the stand-in process.
func (f *fakeFirecracker) launch(_ context.Context, cmd *exec.Cmd, p paths) (int, error) {
	f.mu.Lock()
	f.args = cmd.Args
	f.root = p.Root
	f.mu.Unlock()
	if err := f.serve(p.host(apiSockName)); err != nil {
		return 0, err
	}
	if f.pivot {
		return startPivoted(f.t, p.Root).vmm, nil
	}
	proc := exec.Command("sleep", "600")
	if err := proc.Start(); err != nil {
		return 0, err
	}
	f.mu.Lock()
	f.proc = proc
	f.mu.Unlock()
	f.wg.Add(1)
	go func() { defer f.wg.Done(); proc.Wait() }()
	return proc.Process.Pid, nil
}

// serve starts (or restarts) the API server on path.
func (f *fakeFirecracker) serve(path string) error {
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	f.srv = &http.Server{Handler: http.HandlerFunc(f.handle)}
	f.wg.Add(1)
	go func() { defer f.wg.Done(); f.srv.Serve(ln) }()
	return nil
}

func (f *fakeFirecracker) handle(w http.ResponseWriter, r *http.Request) {
	var body any
	data, _ := io.ReadAll(r.Body)
	if len(data) > 0 {
		if err := json.Unmarshal(data, &body); err != nil {
			f.t.Errorf("fake firecracker: %s %s: body is not JSON: %q", r.Method, r.URL.Path, data)
		}
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, request{r.Method, r.URL.Path, body})
	msg, fail := f.fail[r.URL.Path]
	f.mu.Unlock()
	if ct := r.Header.Get("Content-Type"); len(data) > 0 && !strings.HasPrefix(ct, "application/json") {
		f.t.Errorf("fake firecracker: %s %s: Content-Type %q", r.Method, r.URL.Path, ct)
	}
	if len(data) > 0 && (r.ContentLength != int64(len(data)) || len(r.TransferEncoding) > 0) {
		f.t.Errorf("fake firecracker: %s %s: Content-Length %d, Transfer-Encoding %q: Firecracker needs a Content-Length", r.Method, r.URL.Path, r.ContentLength, r.TransferEncoding)
	}
	// What Firecracker's API description does not allow, Firecracker
	// refuses with 400.
	if probs := checkRequest(r.Method, r.URL.Path, data); len(probs) > 0 {
		f.t.Errorf("fake firecracker: %s %s %s: not what Firecracker's API takes: %s", r.Method, r.URL.Path, data, strings.Join(probs, "; "))
		fail, msg = true, strings.Join(probs, "; ")
	}
	f.mu.Lock()
	d := f.delay[r.URL.Path]
	f.mu.Unlock()
	time.Sleep(d)
	w.Header().Set("Content-Type", "application/json")
	if !fail && f.onRequest != nil {
		if err := f.onRequest(r.Method, r.URL.Path, body); err != nil {
			fail, msg = true, err.Error()
		}
	}
	if fail {
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"fault_message": msg})
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/":
		json.NewEncoder(w).Encode(map[string]any{"app_name": "Firecracker", "id": "fake", "state": "Running", "vmm_version": "1.10.1"})
	case r.Method == http.MethodPut && r.URL.Path == "/actions":
		switch body.(map[string]any)["action_type"] {
		case "InstanceStart":
			if err := f.startVsock(); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				json.NewEncoder(w).Encode(map[string]string{"fault_message": err.Error()})
				return
			}
		case "SendCtrlAltDel":
			f.mu.Lock()
			if f.proc != nil && !f.ignoreCtrlAltDel {
				f.proc.Process.Kill()
			}
			f.mu.Unlock()
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut:
		w.WriteHeader(http.StatusNoContent)
	default:
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"fault_message": "fake: unsupported " + r.Method + " " + r.URL.Path})
	}
}

// startVsock listens on the hybrid-vsock socket at the uds_path the
// driver configured.
func (f *fakeFirecracker) startVsock() error {
	var uds string
	f.mu.Lock()
	for _, r := range f.reqs {
		if r.Path == "/vsock" {
			uds, _ = r.Body.(map[string]any)["uds_path"].(string)
		}
	}
	root := f.root
	f.mu.Unlock()
	if uds == "" {
		return errors.New("InstanceStart without a vsock device")
	}
	ln, err := net.Listen("unix", root+uds)
	if err != nil {
		return err
	}
	f.vsock = ln
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() { defer f.wg.Done(); fakeVsockConn(c, AgentPort) }()
		}
	}()
	return nil
}

// fakeVsockConn answers a CONNECT the way Firecracker does and then echoes
// (the stand-in agent listening on port listen).
func fakeVsockConn(c net.Conn, listen uint32) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || line != "CONNECT "+itoa(listen)+"\n" {
		return // Firecracker closes: nobody listens on that port
	}
	io.WriteString(c, "OK 1073741824\n")
	io.Copy(c, br)
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// requests returns the recorded requests.
func (f *fakeFirecracker) requests() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.reqs...)
}

func (f *fakeFirecracker) close() {
	f.mu.Lock()
	if f.proc != nil {
		f.proc.Process.Kill() // an error when it is gone already
	}
	f.mu.Unlock()
	if f.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		f.srv.Shutdown(ctx)
		cancel()
		f.srv.Close()
	}
	if f.vsock != nil {
		f.vsock.Close()
	}
	f.wg.Wait()
}
