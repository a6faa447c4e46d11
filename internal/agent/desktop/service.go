package desktop

import (
	"context"
	"errors"
	"image"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/action"
	"github.com/cubicle-dev/cubicle/proto/desktop"
	"github.com/cubicle-dev/cubicle/proto/desktop/desktopconnect"
)

// Error codes of ActResponse.error_code.
const (
	CodeInvalidArgument = "invalid_argument"
	CodeInternal        = "internal"
	// CodeUnavailable: the X connection broke under the action (the X
	// server died; the session supervisor restarts it). Retrying helps.
	CodeUnavailable = "unavailable"
)

// displayGone reports whether err is the X connection breaking, as
// opposed to a request the X server refused.
func displayGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

var errDisplayGone = errors.New("the X display went away; it is being restarted, retry")

// Service is the agent's Desktop Connect service. It can exist before the X
// server is up: until SetDesktop hands it a connection, Info answers
// ready=false and Screenshot and Act answer Unavailable.
type Service struct {
	version string
	display string

	mu       sync.RWMutex
	d        *Desktop
	headless bool
	shutdown func(context.Context) error
	apply    func(context.Context, *desktop.ApplySessionRequest) error
	rekey    func(context.Context, *desktop.RekeyRequest) error
	wants    []WindowWant
	usable   bool // latched: the wants were all met once
	wasUp    bool // latched: a desktop was handed over once
}

// WindowWant is a window a complete desktop shows (the image's
// session.json "usable" list): its WM_CLASS class, compared without
// regard to case, and whether it must hold the focus.
type WindowWant struct {
	Class   string
	Focused bool
}

// SetUsable names the windows without which Info does not call the
// desktop usable.
func (s *Service) SetUsable(wants []WindowWant) {
	s.mu.Lock()
	s.wants = slices.Clone(wants)
	s.mu.Unlock()
}

// usableNow reports whether d shows every wanted window. It is latched
// once true: usable is about the start of the session, and an agent that
// later closes the browser has not made the desktop unstarted.
func (s *Service) usableNow(ctx context.Context, d *Desktop) bool {
	s.mu.RLock()
	done, wants := s.usable, s.wants
	s.mu.RUnlock()
	if done || len(wants) == 0 {
		return true
	}
	wins, err := d.Windows(ctx)
	if err != nil {
		return false
	}
	for _, w := range wants {
		if !slices.ContainsFunc(wins, func(x *desktop.Window) bool {
			return strings.EqualFold(x.Class, w.Class) && (x.Focused || !w.Focused)
		}) {
			return false
		}
	}
	s.mu.Lock()
	s.usable = true
	s.mu.Unlock()
	return true
}

// SetShutdown gives the service what Shutdown runs: the agent's own
// shutdown, which ends the programs and syncs, and exits after the answer.
func (s *Service) SetShutdown(f func(context.Context) error) {
	s.mu.Lock()
	s.shutdown = f
	s.mu.Unlock()
}

// Shutdown runs the agent's shutdown (SetShutdown) and answers once the
// programs have ended and the filesystems are synced.
func (s *Service) Shutdown(ctx context.Context, _ *connect.Request[desktop.ShutdownRequest]) (*connect.Response[desktop.ShutdownResponse], error) {
	s.mu.RLock()
	f := s.shutdown
	s.mu.RUnlock()
	if f == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this agent cannot shut down on request"))
	}
	resp := &desktop.ShutdownResponse{}
	if err := f(ctx); err != nil {
		resp.Error = err.Error()
	}
	return connect.NewResponse(resp), nil
}

// SetApplySession gives the service what ApplySession runs: the agent's
// switch from the warm pool's session to a create's. Without it (an agent
// not booted for the pool) ApplySession is refused.
func (s *Service) SetApplySession(f func(context.Context, *desktop.ApplySessionRequest) error) {
	s.mu.Lock()
	s.apply = f
	s.mu.Unlock()
}

// ApplySession hands the request to the function SetApplySession gave; what
// it refuses is a failed precondition (a second session, or no pool).
func (s *Service) ApplySession(ctx context.Context, req *connect.Request[desktop.ApplySessionRequest]) (*connect.Response[desktop.ApplySessionResponse], error) {
	s.mu.RLock()
	f := s.apply
	s.mu.RUnlock()
	if f == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("this sandbox was not booted for the warm pool: its session is the one it was created with"))
	}
	if req.Msg.Token == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no token"))
	}
	if err := f(ctx, req.Msg); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&desktop.ApplySessionResponse{}), nil
}

// SetRekey gives the service what Rekey runs: the agent's change of
// identity when its box is a fork.
func (s *Service) SetRekey(f func(context.Context, *desktop.RekeyRequest) error) {
	s.mu.Lock()
	s.rekey = f
	s.mu.Unlock()
}

// Rekey hands the request to the function SetRekey gave.
func (s *Service) Rekey(ctx context.Context, req *connect.Request[desktop.RekeyRequest]) (*connect.Response[desktop.RekeyResponse], error) {
	s.mu.RLock()
	f := s.rekey
	s.mu.RUnlock()
	if f == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this agent cannot change its identity"))
	}
	if req.Msg.Token == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no token"))
	}
	if err := f(ctx, req.Msg); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&desktop.RekeyResponse{}), nil
}

var _ desktopconnect.DesktopHandler = (*Service)(nil)

// NewService returns a service that reports version and display in Info
// and has no desktop yet.
func NewService(version, display string) *Service {
	return &Service{version: version, display: display}
}

// SetDesktop hands the service its desktop (nil takes it away). The service
// does not close it.
func (s *Service) SetDesktop(d *Desktop) {
	s.mu.Lock()
	s.d = d
	s.wasUp = s.wasUp || d != nil
	s.mu.Unlock()
}

// SetHeadless marks the sandbox as having no desktop at all (its image has
// no X server): Info says so, and screenshots and input fail at once with
// FailedPrecondition instead of waiting for a display that never comes.
func (s *Service) SetHeadless() {
	s.mu.Lock()
	s.headless = true
	s.mu.Unlock()
}

func (s *Service) desktop() *Desktop {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.d
}

// errHeadless answers desktop calls of a sandbox without a desktop.
var errHeadless = connect.NewError(connect.CodeFailedPrecondition, errors.New("this sandbox has no desktop: its image has no X server (Xvfb or Xvnc)"))

// unavailable is the error for a call that needs the desktop while there is
// none.
func (s *Service) unavailable() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.headless {
		return errHeadless
	}
	if s.wasUp {
		return errRestarting
	}
	return errNoDesktop
}

// Type types text on the display, delayMS apart, for the in-sandbox
// xdotool wrapper (internal/agent/xdo). A mistake in the request is an
// *action.Error; without a desktop it fails with another error.
func (s *Service) Type(ctx context.Context, text string, delayMS int) error {
	d := s.desktop()
	if d == nil {
		return s.unavailable()
	}
	_, err := d.Do(ctx, action.Action{Type: action.TypeType, Text: text, DelayMS: delayMS})
	return err
}

var errNoDesktop = connect.NewError(connect.CodeUnavailable, errors.New("the X display is not up yet"))

// errRestarting answers a call that needs the desktop while the X server
// that was up has gone and is being started again (it died, or was
// killed): the caller may retry.
var errRestarting = connect.NewError(connect.CodeUnavailable, errors.New("the desktop is restarting; retry"))

// Info reports the version, capabilities and screen. Ready becomes true
// once a screenshot has succeeded; while it is false Info tries a one-pixel
// capture itself, so polling Info is enough to wait for the desktop.
// Usable follows once the windows SetUsable named are up.
func (s *Service) Info(ctx context.Context, _ *connect.Request[desktop.InfoRequest]) (*connect.Response[desktop.InfoResponse], error) {
	resp := &desktop.InfoResponse{Version: s.version, Display: s.display}
	s.mu.RLock()
	resp.Headless = s.headless
	s.mu.RUnlock()
	if d := s.desktop(); d != nil {
		if !d.Ready() {
			_, _ = d.Screenshot(ctx, action.ScreenshotOptions{Format: action.FormatPNG, Region: image.Rect(0, 0, 1, 1)})
		}
		w, h := d.Size()
		resp.Width, resp.Height = int32(w), int32(h)
		resp.Capabilities = d.Capabilities()
		resp.Ready = d.Ready()
		resp.Usable = resp.Ready && s.usableNow(ctx, d)
		if d.Display() != "" {
			resp.Display = d.Display()
		}
	}
	return connect.NewResponse(resp), nil
}

// Screenshot captures the screen. Invalid options are InvalidArgument.
func (s *Service) Screenshot(ctx context.Context, req *connect.Request[desktop.ScreenshotRequest]) (*connect.Response[desktop.ScreenshotResponse], error) {
	d := s.desktop()
	if d == nil {
		return nil, s.unavailable()
	}
	res, err := d.Do(ctx, action.FromScreenshotRequest(req.Msg))
	if err != nil {
		var ae *action.Error
		if errors.As(err, &ae) {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New(ae.Msg))
		}
		if displayGone(err) {
			return nil, connect.NewError(connect.CodeUnavailable, errDisplayGone)
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(res.Screenshot), nil
}

// Act runs the actions in order and stops at the first failure, which the
// response describes (failed_index, error, error_code); failed_index is -1
// when every action succeeded. Only a missing desktop is an RPC error.
func (s *Service) Act(ctx context.Context, req *connect.Request[desktop.ActRequest]) (*connect.Response[desktop.ActResponse], error) {
	d := s.desktop()
	if d == nil {
		return nil, s.unavailable()
	}
	resp := &desktop.ActResponse{FailedIndex: -1}
	if n := len(req.Msg.GetActions()); n > action.MaxActions {
		resp.FailedIndex, resp.ErrorCode = 0, CodeInvalidArgument
		resp.Error = (&action.Error{Msg: "too many actions"}).Error()
		return connect.NewResponse(resp), nil
	}
	for i, pa := range req.Msg.GetActions() {
		res, err := d.Do(ctx, action.FromProto(pa))
		if err != nil {
			resp.FailedIndex = int32(i)
			var ae *action.Error
			if errors.As(err, &ae) {
				resp.ErrorCode = CodeInvalidArgument
				resp.Error = (&action.Error{Index: i, Msg: ae.Msg}).Error()
			} else if displayGone(err) {
				resp.ErrorCode = CodeUnavailable
				resp.Error = errDisplayGone.Error()
			} else {
				resp.ErrorCode = CodeInternal
				resp.Error = err.Error()
			}
			break
		}
		resp.Results = append(resp.Results, res)
	}
	return connect.NewResponse(resp), nil
}
