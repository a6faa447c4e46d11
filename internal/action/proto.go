package action

import (
	"github.com/cubicle-dev/cubicle/proto/desktop"
)

// ToProto converts an action to the agent's message. The screenshot options
// of a screenshot action, including its region, travel in the nested
// screenshot field; x and y are used only for the pointer position.
func ToProto(a Action) *desktop.Action {
	p := &desktop.Action{
		Type:       a.Type,
		Button:     a.Button,
		Count:      int32(a.Count),
		Direction:  a.Direction,
		Amount:     int32(a.Amount),
		Text:       a.Text,
		DelayMs:    uint32(max(a.DelayMS, 0)),
		DurationMs: uint32(max(a.DurationMS, 0)),
	}
	if len(a.Keys) > 0 {
		p.Keys = append([]string(nil), a.Keys...)
	}
	for _, pt := range a.Path {
		p.Path = append(p.Path, &desktop.Point{X: int32(pt[0]), Y: int32(pt[1])})
	}
	if a.Type == TypeScreenshot {
		p.Screenshot = ScreenshotRequest(a)
		return p
	}
	if a.X != nil {
		x := int32(*a.X)
		p.X = &x
	}
	if a.Y != nil {
		y := int32(*a.Y)
		p.Y = &y
	}
	return p
}

// ScreenshotRequest returns the screenshot options of a as the agent's
// message.
func ScreenshotRequest(a Action) *desktop.ScreenshotRequest {
	r := &desktop.ScreenshotRequest{
		Format:  a.Format,
		Quality: uint32(max(a.Quality, 0)),
		Scale:   a.Scale,
		Width:   uint32(max(a.Width, 0)),
		Cursor:  a.Cursor,

		SettleMs:    uint32(max(a.SettleMS, 0)),
		SettleMaxMs: uint32(max(a.SettleMaxMS, 0)),
	}
	if a.W != 0 || a.H != 0 || a.X != nil || a.Y != nil {
		r.Region = &desktop.Region{X: int32(deref(a.X)), Y: int32(deref(a.Y)), W: int32(a.W), H: int32(a.H)}
	}
	return r
}

// FromProto converts the agent's message back to an action. It does not
// validate: run Normalize on the result.
func FromProto(p *desktop.Action) Action {
	if p == nil {
		return Action{}
	}
	a := Action{
		Type:       p.GetType(),
		Button:     p.GetButton(),
		Count:      int(p.GetCount()),
		Direction:  p.GetDirection(),
		Amount:     int(p.GetAmount()),
		Text:       p.GetText(),
		DelayMS:    int(p.GetDelayMs()),
		DurationMS: int(p.GetDurationMs()),
	}
	if len(p.GetKeys()) > 0 {
		a.Keys = append(Keys(nil), p.GetKeys()...)
	}
	for _, pt := range p.GetPath() {
		a.Path = append(a.Path, [2]int{int(pt.GetX()), int(pt.GetY())})
	}
	if p.X != nil {
		x := int(*p.X)
		a.X = &x
	}
	if p.Y != nil {
		y := int(*p.Y)
		a.Y = &y
	}
	if s := p.GetScreenshot(); s != nil {
		setScreenshot(&a, s)
	}
	return a
}

// FromScreenshotRequest returns the screenshot action that r describes. It
// does not validate: run Normalize on the result.
func FromScreenshotRequest(r *desktop.ScreenshotRequest) Action {
	a := Action{Type: TypeScreenshot}
	if r != nil {
		setScreenshot(&a, r)
	}
	return a
}

func setScreenshot(a *Action, s *desktop.ScreenshotRequest) {
	a.Format = s.GetFormat()
	a.Quality = int(s.GetQuality())
	a.Scale = s.GetScale()
	a.Width = int(s.GetWidth())
	a.Cursor = s.GetCursor()
	a.SettleMS = int(s.GetSettleMs())
	a.SettleMaxMS = int(s.GetSettleMaxMs())
	if r := s.GetRegion(); r != nil {
		x, y := int(r.GetX()), int(r.GetY())
		a.X, a.Y = &x, &y
		a.W, a.H = int(r.GetW()), int(r.GetH())
	}
}
