package firecracker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	// Since the last launch: what the running stand-in Firecracker was
	// told, its VM's run state ("Not started", "Running", "Paused") and
	// its guest's memory, which the stand-in agent reads and writes
	// ("MEM=x\n", "MEM?\n") and snapshots keep.
	fresh     []request
	vmState   string
	guestMem  string
	vsockConn map[net.Conn]bool
	restored  []request // the configuration a loaded snapshot had
	args      []string  // jailer command line the driver launched
	proc      *exec.Cmd
	srv       *http.Server
	vsock     net.Listener
	wg        sync.WaitGroup
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
	// What the jailer leaves in the chroot and refuses to find there
	// on its next run: its pid file (created exclusively) and the device
	// nodes it makes (mknod fails with EEXIST).
	if _, err := os.Stat(p.host("/dev/kvm")); err == nil {
		return 0, errors.New("FAKE jailer: Failed to create /dev/kvm via mknod inside the jail: File exists (os error 17)")
	}
	if err := os.MkdirAll(p.host("/dev/net"), 0o755); err != nil {
		return 0, err
	}
	for _, n := range []string{"/dev/kvm", "/dev/net/tun", "/dev/urandom"} {
		if err := os.WriteFile(p.host(n), nil, 0o600); err != nil {
			return 0, err
		}
	}
	f.mu.Lock()
	f.args = cmd.Args
	f.root = p.Root
	f.fresh, f.vmState, f.guestMem = nil, "Not started", ""
	old, oldVsock := f.srv, f.vsock
	f.srv, f.vsock = nil, nil
	f.mu.Unlock()
	// The Firecracker that ran here before is gone: its API with it.
	if old != nil {
		old.Close()
	}
	if oldVsock != nil {
		oldVsock.Close()
	}
	if err := f.serve(p.host(apiSockName)); err != nil {
		return 0, err
	}
	pf, err := os.OpenFile(p.PidFile, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, fmt.Errorf("FAKE jailer: %w", err)
	}
	defer pf.Close()
	if f.pivot {
		os.Remove(p.host("/ready")) // a VMM that ran here before wrote it
		pid := startPivoted(f.t, p.Root).vmm
		fmt.Fprint(pf, pid)
		return pid, nil
	}
	proc := exec.Command("sleep", "600")
	if err := proc.Start(); err != nil {
		return 0, err
	}
	fmt.Fprint(pf, proc.Process.Pid)
	f.mu.Lock()
	f.proc = proc
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		proc.Wait()
		// Firecracker gone: its API and vsock go with it.
		f.mu.Lock()
		var srv *http.Server
		var ln net.Listener
		if f.proc == proc {
			srv, ln = f.srv, f.vsock
			for c := range f.vsockConn {
				c.Close()
			}
		}
		f.mu.Unlock()
		if srv != nil {
			srv.Close()
		}
		if ln != nil {
			ln.Close()
		}
	}()
	return proc.Process.Pid, nil
}

// serve starts (or restarts) the API server on path.
func (f *fakeFirecracker) serve(path string) error {
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(f.handle)}
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
	f.wg.Add(1)
	go func() { defer f.wg.Done(); srv.Serve(ln) }()
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
	f.fresh = append(f.fresh, request{r.Method, r.URL.Path, body})
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
	refuse := func(err error) {
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"fault_message": err.Error()})
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/":
		f.mu.Lock()
		st := f.vmState
		f.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{"app_name": "Firecracker", "id": "fake", "state": st, "vmm_version": "1.10.1"})
	case r.Method == http.MethodPatch && r.URL.Path == "/vm":
		if err := f.patchVM(body.(map[string]any)["state"].(string)); err != nil {
			refuse(err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut && r.URL.Path == "/snapshot/create":
		if err := f.createSnapshot(body.(map[string]any)); err != nil {
			refuse(err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut && r.URL.Path == "/snapshot/load":
		if err := f.loadSnapshot(body.(map[string]any)); err != nil {
			refuse(err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut && r.URL.Path == "/actions":
		switch body.(map[string]any)["action_type"] {
		case "InstanceStart":
			if err := f.startVsock(""); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				json.NewEncoder(w).Encode(map[string]string{"fault_message": err.Error()})
				return
			}
			f.mu.Lock()
			f.vmState = "Running"
			f.mu.Unlock()
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

// startVsock listens on the hybrid-vsock socket at uds, or ("") the
// uds_path the driver configured since the launch.
func (f *fakeFirecracker) startVsock(uds string) error {
	f.mu.Lock()
	for _, r := range f.fresh {
		if r.Path == "/vsock" && uds == "" {
			uds, _ = r.Body.(map[string]any)["uds_path"].(string)
		}
	}
	root := f.root
	f.mu.Unlock()
	if uds == "" {
		return errors.New("InstanceStart without a vsock device")
	}
	// Firecracker binds the socket: one that is there already fails it.
	ln, err := net.Listen("unix", root+uds)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.vsock = ln
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			if f.vsockConn == nil {
				f.vsockConn = map[net.Conn]bool{}
			}
			f.vsockConn[c] = true
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.vsockConnection(c, AgentPort)
				f.mu.Lock()
				delete(f.vsockConn, c)
				f.mu.Unlock()
			}()
		}
	}()
	return nil
}

// vsockConnection answers a CONNECT the way Firecracker does and then
// stands in for the agent listening on port listen: GET /health is
// answered 200, "MEM?\n" with the guest's memory, "MEM=x\n" sets it,
// and anything else is echoed.
func (f *fakeFirecracker) vsockConnection(c net.Conn, listen uint32) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || line != "CONNECT "+itoa(listen)+"\n" {
		return // Firecracker closes: nobody listens on that port
	}
	io.WriteString(c, "OK 1073741824\n")
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		// A guest whose vCPUs are stopped answers nothing.
		for {
			f.mu.Lock()
			running := f.vmState == "Running"
			f.mu.Unlock()
			if running {
				break
			}
			time.Sleep(5 * time.Millisecond)
			if _, err := c.Write(nil); err != nil {
				return
			}
		}
		switch {
		case line == "GET /health HTTP/1.1\r\n":
			for {
				h, err := br.ReadString('\n')
				if err != nil {
					return
				}
				if h == "\r\n" {
					break
				}
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			return
		case line == "MEM?\n":
			f.mu.Lock()
			m := f.guestMem
			f.mu.Unlock()
			io.WriteString(c, m+"\n")
		case strings.HasPrefix(line, "MEM="):
			f.mu.Lock()
			f.guestMem = strings.TrimSuffix(strings.TrimPrefix(line, "MEM="), "\n")
			f.mu.Unlock()
			io.WriteString(c, "ok\n")
		default:
			io.WriteString(c, line)
		}
	}
}

// patchVM pauses or resumes the stand-in VM's vCPUs; Firecracker takes
// it only once the VM has started.
func (f *fakeFirecracker) patchVM(state string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.vmState == "Not started" {
		return errors.New("FAKE: the microVM is not started")
	}
	if state == "Paused" {
		f.vmState = "Paused"
	} else {
		f.vmState = "Running"
	}
	return nil
}

// fakeSnapshot is what the stand-in Firecracker writes as its snapshot
// file: what it was configured with (the paths a restored VM finds its
// devices at) and the guest's memory (written to the memory file).
type fakeSnapshot struct {
	Config []request `json:"config"`
	MemLen int       `json:"mem_len"`
}

// createSnapshot writes the snapshot and memory files, as Firecracker
// does only for a paused VM; it resets the guest's vsock connections.
func (f *fakeFirecracker) createSnapshot(b map[string]any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.vmState != "Paused" {
		return fmt.Errorf("FAKE: Cannot create a snapshot of a microVM in state %q: pause it first", f.vmState)
	}
	// The configuration of the VM: since its launch, or what it was
	// restored from.
	var cfg []request
	for _, r := range f.fresh {
		if r.Method == http.MethodPut && r.Path != "/actions" && !strings.HasPrefix(r.Path, "/snapshot") && r.Path != "/logger" && r.Path != "/metrics" {
			cfg = append(cfg, r)
		}
	}
	if len(cfg) == 0 {
		cfg = f.restored
	}
	mem := []byte(f.guestMem)
	mem = append(mem, make([]byte, 1<<20)...) // the rest of guest memory
	if err := os.WriteFile(f.root+b["mem_file_path"].(string), mem, 0o600); err != nil {
		return err
	}
	snap, _ := json.Marshal(fakeSnapshot{Config: cfg, MemLen: len(f.guestMem)})
	if err := os.WriteFile(f.root+b["snapshot_path"].(string), snap, 0o600); err != nil {
		return err
	}
	for c := range f.vsockConn {
		c.Close() // VIRTIO_VSOCK_EVENT_TRANSPORT_RESET
	}
	return nil
}

// loadSnapshot restores the stand-in VM from its files, as Firecracker
// does only in a fresh process (told nothing but its logger and metrics)
// and only with its devices' files where they were.
func (f *fakeFirecracker) loadSnapshot(b map[string]any) error {
	f.mu.Lock()
	for _, r := range f.fresh[:len(f.fresh)-1] {
		if r.Method != http.MethodGet && r.Path != "/logger" && r.Path != "/metrics" {
			f.mu.Unlock()
			return fmt.Errorf("FAKE: Loading a microVM snapshot not allowed after configuring boot-specific resources (%s %s)", r.Method, r.Path)
		}
	}
	root := f.root
	f.mu.Unlock()
	mb, hasBackend := b["mem_backend"].(map[string]any)
	if _, hasFile := b["mem_file_path"]; hasBackend == hasFile {
		return errors.New("FAKE: exactly one of mem_backend and mem_file_path must be given")
	}
	raw, err := os.ReadFile(root + b["snapshot_path"].(string))
	if err != nil {
		return fmt.Errorf("FAKE: Cannot open the snapshot file: %w", err)
	}
	var snap fakeSnapshot
	if err := json.Unmarshal(raw, &snap); err != nil {
		return err
	}
	mem, err := os.ReadFile(root + mb["backend_path"].(string))
	if err != nil || len(mem) < snap.MemLen {
		return fmt.Errorf("FAKE: Cannot load the guest memory: %v", err)
	}
	var uds string
	for _, r := range snap.Config {
		body, _ := r.Body.(map[string]any)
		switch {
		case strings.HasPrefix(r.Path, "/drives/"):
			if _, err := os.Stat(root + body["path_on_host"].(string)); err != nil {
				return fmt.Errorf("FAKE: drive %s: %w", body["drive_id"], err)
			}
		case r.Path == "/vsock":
			uds = body["uds_path"].(string)
		}
	}
	if err := f.startVsock(uds); err != nil {
		return fmt.Errorf("FAKE: vsock: %w", err)
	}
	f.mu.Lock()
	f.restored = snap.Config
	f.guestMem = string(mem[:snap.MemLen])
	f.vmState = "Paused"
	if b["resume_vm"] == true {
		f.vmState = "Running"
	}
	f.mu.Unlock()
	return nil
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
	srv, vsock := f.srv, f.vsock
	for c := range f.vsockConn {
		c.Close()
	}
	f.mu.Unlock()
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		srv.Shutdown(ctx)
		cancel()
		srv.Close()
	}
	if vsock != nil {
		vsock.Close()
	}
	f.wg.Wait()
}
