// Package cleanup is construct-or-roll-back for multi-step creation: each
// step that takes a resource registers its undo, and on any failure the
// undos run in reverse; on success the stack is released and nothing runs.
// Every driver's Create uses it, so a failed create leaves nothing behind.
package cleanup

// Stack holds undo steps. The zero value is ready to use:
//
//	var cu cleanup.Stack
//	defer cu.Run()
//	... cu.Add(undo) after each step ...
//	cu.Release() // success: keep everything
type Stack struct{ fns []func() }

// Add registers f to run on Run, after every step added later.
func (s *Stack) Add(f func()) { s.fns = append(s.fns, f) }

// Release forgets every step: the resources now belong to the caller.
func (s *Stack) Release() { s.fns = nil }

// Run runs the registered steps in reverse order, once.
func (s *Stack) Run() {
	for i := len(s.fns) - 1; i >= 0; i-- {
		s.fns[i]()
	}
	s.fns = nil
}
