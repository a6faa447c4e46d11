package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Resize gives the display a new size and DPI by starting the X server
// again with them; the programs, which lose the display with it, start
// again on the new one, with CUBICLE_WIDTH, CUBICLE_HEIGHT and CUBICLE_DPI
// set to match (a program whose argv itself holds the size, through
// {width} in the session config, keeps the old one; the desktop image's
// browser launcher reads the environment). It returns once the new
// display is up, or when ctx ends. A display that has the size and DPI
// already is left alone.
//
// Why a restart and not RandR: Xvfb cannot grow its framebuffer past the
// size it started with, and E2B's Desktop.create asks for any size in the
// way it knows, by running its own Xvfb with -screen and -dpi (see
// internal/agent/xdo), right after the sandbox started: there is nothing
// on the display yet to lose.
func (s *Supervisor) Resize(ctx context.Context, width, height, dpi int) error {
	for _, f := range []struct {
		name     string
		v        int
		min, max int
	}{{"width", width, 16, 16384}, {"height", height, 16, 16384}, {"dpi", dpi, 10, 1000}} {
		if f.v < f.min || f.v > f.max {
			return fmt.Errorf("%s %d: want %d to %d", f.name, f.v, f.min, f.max)
		}
	}
	s.mu.Lock()
	argv, err := resizeArgv(s.xvfb, width, height, dpi)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	var pid int
	old := s.desk // the display that must go before the new one counts
	if !slices.Equal(argv, s.xvfb) {
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			return errors.New("the session is stopping")
		}
		s.xvfb = argv
		s.geomEnv = []string{
			EnvWidth + "=" + strconv.Itoa(width),
			EnvHeight + "=" + strconv.Itoa(height),
			EnvDPI + "=" + strconv.Itoa(dpi),
		}
		for p, name := range s.children {
			if name == xvfbName {
				pid = p
			}
		}
		s.restartNow = pid != 0
	} else {
		old = nil // nothing changes: the display as it is will do
	}
	s.mu.Unlock()
	if pid != 0 {
		s.log.Info("session: resizing the display", "width", width, "height", height, "dpi", dpi)
		_ = syscall.Kill(-pid, syscall.SIGTERM)
	}
	for {
		s.mu.Lock()
		d := s.desk
		s.mu.Unlock()
		if d != nil && d != old {
			if w, h := d.Size(); w == width && h == height {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("display %dx%d not up: %w", width, height, ctx.Err())
		case <-s.ctx.Done():
			return errors.New("the session is stopping")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// resizeArgv is the X server's argv with the first screen's size and the
// DPI replaced: "-screen 0 WxHxD" keeps its depth, "-dpi N" is set or
// added. An argv without "-screen N GEOMETRY" cannot be resized.
func resizeArgv(argv []string, width, height, dpi int) ([]string, error) {
	out := slices.Clone(argv)
	screen := false
	for i := 0; i+2 < len(out); i++ {
		if out[i] != "-screen" {
			continue
		}
		parts := strings.Split(out[i+2], "x")
		if len(parts) < 2 || len(parts) > 3 {
			return nil, fmt.Errorf("xvfb -screen %q: not WIDTHxHEIGHT[xDEPTH]", out[i+2])
		}
		parts[0], parts[1] = strconv.Itoa(width), strconv.Itoa(height)
		out[i+2] = strings.Join(parts, "x")
		screen = true
		break
	}
	if !screen {
		return nil, errors.New("the session's Xvfb has no -screen to resize")
	}
	for i := 0; i+1 < len(out); i++ {
		if out[i] == "-dpi" {
			out[i+1] = strconv.Itoa(dpi)
			return out, nil
		}
	}
	return append(out, "-dpi", strconv.Itoa(dpi)), nil
}
