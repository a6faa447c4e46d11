package process

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/cubicle-dev/cubicle/internal/agent/reap"
	pb "github.com/cubicle-dev/cubicle/proto/process"
)

const (
	// chunkSize is the largest data event; a read fills at most this much.
	chunkSize = 32 << 10
	// subscriberQueue is how many events a connected client may lag behind
	// before the process's output blocks (back-pressure, no data loss). A
	// process nobody is connected to never blocks: its output is discarded.
	subscriberQueue = 64
	// drainGrace is how long output is still read after the process exited,
	// for descendants that keep its stdout open (a daemonized server).
	drainGrace = 2 * time.Second
)

// subscriber is one stream (Start or Connect) receiving a process's events.
type subscriber struct {
	ch   chan *pb.ProcessEvent // closed after the end event
	gone chan struct{}         // closed when the stream went away
	once sync.Once
}

func newSubscriber() *subscriber {
	return &subscriber{ch: make(chan *pb.ProcessEvent, subscriberQueue), gone: make(chan struct{})}
}

func (s *subscriber) leave() { s.once.Do(func() { close(s.gone) }) }

// proc is one process started by the service.
type proc struct {
	pid    int
	config *pb.ProcessConfig
	tag    *string
	pty    *os.File // PTY master, nil without a PTY

	mu    sync.Mutex
	stdin *os.File // nil when closed or never opened
	subs  map[*subscriber]struct{}
	ended bool

	readers sync.WaitGroup
	outputs []*os.File // read ends, closed after draining
}

func (p *proc) info() *pb.ProcessInfo {
	return &pb.ProcessInfo{Config: p.config, Pid: uint32(p.pid), Tag: p.tag}
}

// subscribe adds s, or reports false when the process already ended.
func (p *proc) subscribe(s *subscriber) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return false
	}
	p.subs[s] = struct{}{}
	return true
}

func (p *proc) unsubscribe(s *subscriber) {
	s.leave()
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// publish hands ev to every subscriber, waiting for slow ones unless they
// leave.
func (p *proc) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

// read copies one output stream into data events until EOF.
func (p *proc) read(f *os.File, wrap func([]byte) *pb.ProcessEvent_DataEvent) {
	defer p.readers.Done()
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			data := make([]byte, n)
			copy(data, buf[:n])
			p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: wrap(data)}})
		}
		if err != nil {
			return // io.EOF, EIO from a PTY whose slave closed, or closed by finish
		}
	}
}

// finish waits for the exit status, drains the output and sends the end
// event to every subscriber.
func (p *proc) finish(status <-chan reap.Status, limit time.Duration, onEnd func()) {
	var timer *time.Timer
	if limit > 0 {
		timer = time.AfterFunc(limit, func() { _ = p.signal(syscall.SIGKILL) })
	}
	st := <-status
	if timer != nil {
		timer.Stop()
	}
	drained := make(chan struct{})
	go func() { p.readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
		for _, f := range p.outputs {
			_ = f.Close() // unblocks the readers
		}
		<-drained
	}
	for _, f := range p.outputs {
		_ = f.Close()
	}

	end := &pb.ProcessEvent_EndEvent{ExitCode: int32(st.ExitCode()), Exited: st.Exited(), Status: st.String()}
	p.mu.Lock()
	p.ended = true
	subs := p.subs
	p.subs = nil
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
	p.mu.Unlock()
	if p.pty != nil {
		_ = p.pty.Close()
	}
	onEnd()
	ev := &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
	for s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
		close(s.ch)
	}
}

// signal sends sig to the process's whole group.
func (p *proc) signal(sig syscall.Signal) error {
	err := syscall.Kill(-p.pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		// The group is gone; the leader may still be unreaped.
		err = syscall.Kill(p.pid, sig)
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
	}
	return err
}

var errStdinClosed = errors.New("stdin is closed")

func (p *proc) writeStdin(b []byte) error {
	p.mu.Lock()
	f := p.stdin
	p.mu.Unlock()
	if f == nil {
		return errStdinClosed
	}
	_, err := f.Write(b)
	return err
}

func (p *proc) writePTY(b []byte) error {
	if p.pty == nil {
		return errNoPTY
	}
	_, err := p.pty.Write(b)
	return err
}

var errNoPTY = errors.New("process has no pty")

func (p *proc) closeStdin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pty != nil {
		// A PTY has no separate stdin; send EOF (^D) like a terminal does.
		_, err := p.pty.Write([]byte{4})
		return err
	}
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

func (p *proc) resize(size *pb.PTY_Size) error {
	if p.pty == nil {
		return errNoPTY
	}
	return pty.Setsize(p.pty, &pty.Winsize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())})
}
