package desktop

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/cubicle-dev/cubicle/internal/action"
)

// restoreAfter is how long keycodes remapped for typing stay bound after the
// last use. Clients translate a key event with the mapping they hold when
// they read it, not when it was sent, so unbinding right after the release
// (as xdotool does) can make a slow client see the wrong character.
// Keeping the binding a while also spares repeated mapping changes, each of
// which makes every client reload its keymap.
var restoreAfter = 2 * time.Second

// keyPos is where a keysym sits in the keyboard mapping.
type keyPos struct {
	code  xproto.Keycode
	shift bool // the keysym is on the shifted level
}

// keyboard caches the server's keyboard mapping and manages the spare
// keycodes that the agent remaps to type keysyms the keyboard lacks. Its
// methods other than invalidate are called with Desktop.inputMu held.
type keyboard struct {
	d        *Desktop
	min, max xproto.Keycode

	mu    sync.Mutex
	per   int             // keysyms per keycode
	syms  []xproto.Keysym // (max-min+1)*per; nil when stale
	index map[action.Keysym]keyPos

	bound map[xproto.Keycode]*binding // spare keycodes we remapped
	tick  uint64
	held  map[xproto.Keycode]int // keycodes pressed by key_down, with counts
	timer *time.Timer
	// lastTyped is when typing last ended; bindings stay restoreAfter
	// past it.
	lastTyped time.Time
	closed    bool
}

type binding struct {
	ks   action.Keysym
	used uint64 // tick of the last use, for least-recently-used eviction
}

func newKeyboard(d *Desktop, min, max xproto.Keycode) *keyboard {
	return &keyboard{
		d: d, min: min, max: max,
		bound: map[xproto.Keycode]*binding{},
		held:  map[xproto.Keycode]int{},
	}
}

// invalidate drops the cached mapping; the next lookup reloads it. The event
// loop calls it on MappingNotify.
func (k *keyboard) invalidate() {
	k.mu.Lock()
	k.syms = nil
	k.mu.Unlock()
}

// loadLocked fetches the mapping if the cache is stale.
func (k *keyboard) loadLocked() error {
	if k.syms != nil {
		return nil
	}
	n := int(k.max) - int(k.min) + 1
	r, err := xproto.GetKeyboardMapping(k.d.conn, k.min, byte(n)).Reply()
	if err != nil {
		return fmt.Errorf("get keyboard mapping: %w", err)
	}
	per := int(r.KeysymsPerKeycode)
	if per < 1 || len(r.Keysyms) < n*per {
		return fmt.Errorf("keyboard mapping has %d keysyms for %d keycodes", len(r.Keysyms), n)
	}
	k.per, k.syms = per, r.Keysyms
	k.reindexLocked()
	return nil
}

// reindexLocked rebuilds the keysym index from syms. Only the first two
// levels (plain and shifted) are used: reaching the others needs modifiers
// (AltGr, group switch) whose keycodes vary, and remapping is simpler.
func (k *keyboard) reindexLocked() {
	n := int(k.max) - int(k.min) + 1
	k.index = make(map[action.Keysym]keyPos, n*2)
	for col := 0; col < min(2, k.per); col++ {
		for i := 0; i < n; i++ {
			ks := action.Keysym(k.syms[i*k.per+col])
			if ks == 0 {
				continue
			}
			if _, ok := k.index[ks]; !ok {
				k.index[ks] = keyPos{code: k.min + xproto.Keycode(i), shift: col == 1}
			}
		}
	}
}

// lookup finds ks in the mapping, binding a spare keycode to it when the
// keyboard has no key for it.
func (k *keyboard) lookup(ks action.Keysym) (keyPos, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.loadLocked(); err != nil {
		return keyPos{}, err
	}
	if p, ok := k.index[ks]; ok {
		if b := k.bound[p.code]; b != nil && b.ks == ks {
			k.tick++
			b.used = k.tick
		}
		return p, nil
	}
	code, err := k.bindLocked(ks)
	if err != nil {
		return keyPos{}, err
	}
	return keyPos{code: code}, nil
}

// prebind binds, before any of them is typed, the keysyms in syms (the
// rest of a text, in order) that the keyboard lacks, as many as fit
// without unbinding one another, and reports how many it bound.
//
// Binding keysyms one at a time between key events loses characters:
// Chromium, for one, now and then translates the key event of a freshly
// bound keycode with the map from before the binding, and drops the
// character. Typing "ж東✓€ß日本ü" 12 ms apart into Chromium in a runc
// sandbox lost one or more characters in 10 of 10 tries that way (xdotool:
// 14 of 15); with the keysyms bound together first and a 50 ms pause
// (bindSettle) before the first key, in none of 45 tries.
func (k *keyboard) prebind(syms []action.Keysym) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.loadLocked(); err != nil {
		return 0, err
	}
	// Keycodes this text can use: empty ones, and ones we bound for a
	// keysym the text does not need. The text's own bindings are marked
	// used now so that eviction passes them over.
	needed := map[action.Keysym]bool{}
	for _, ks := range syms {
		needed[ks] = true
	}
	free := 0
	n := int(k.max) - int(k.min) + 1
	for i := 0; i < n; i++ {
		c := k.min + xproto.Keycode(i)
		if k.held[c] > 0 {
			continue
		}
		if b := k.bound[c]; b != nil {
			if needed[b.ks] {
				k.tick++
				b.used = k.tick
			} else {
				free++
			}
			continue
		}
		if k.emptyLocked(i) {
			free++
		}
	}
	bound := 0
	for _, ks := range syms {
		if free == 0 {
			break
		}
		// bindLocked lets go of mu while it syncs, and the event loop
		// drops the cache on the MappingNotify of our own change.
		if err := k.loadLocked(); err != nil {
			return bound, err
		}
		if _, ok := k.index[ks]; ok {
			continue
		}
		if _, err := k.bindLocked(ks); err != nil {
			return bound, err
		}
		free--
		bound++
	}
	return bound, nil
}

// emptyLocked reports whether the i-th keycode has no keysym at all.
func (k *keyboard) emptyLocked(i int) bool {
	for col := 0; col < k.per; col++ {
		if k.syms[i*k.per+col] != 0 {
			return false
		}
	}
	return true
}

// has reports whether ks can be typed without binding a keycode.
func (k *keyboard) has(ks action.Keysym) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.loadLocked() != nil {
		return false
	}
	_, ok := k.index[ks]
	return ok
}

// bindLocked remaps a spare keycode (one with no keysyms, or the least
// recently used one we bound before and nobody holds) to ks on every level,
// the way xdotool types characters the keyboard lacks.
func (k *keyboard) bindLocked(ks action.Keysym) (xproto.Keycode, error) {
	var code xproto.Keycode
	found := false
	n := int(k.max) - int(k.min) + 1
	for i := n - 1; i >= 0 && !found; i-- {
		c := k.min + xproto.Keycode(i)
		if k.bound[c] != nil || k.held[c] > 0 {
			continue
		}
		if k.emptyLocked(i) {
			code, found = c, true
		}
	}
	if !found {
		var oldest *binding
		for c, b := range k.bound {
			if k.held[c] == 0 && (oldest == nil || b.used < oldest.used) {
				code, oldest, found = c, b, true
			}
		}
		if found {
			// Give clients a moment to translate the events typed with the
			// old binding before it changes under them.
			k.mu.Unlock()
			_ = k.d.sync()
			time.Sleep(20 * time.Millisecond)
			k.mu.Lock()
			if err := k.loadLocked(); err != nil {
				return 0, err
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("no spare keycode to type keysym %s", action.KeysymName(ks))
	}
	if err := k.setLocked(code, xproto.Keysym(ks)); err != nil {
		return 0, err
	}
	k.tick++
	k.bound[code] = &binding{ks: ks, used: k.tick}
	// Make sure the server has the new mapping before the key event.
	k.mu.Unlock()
	err := k.d.sync()
	k.mu.Lock()
	if err != nil {
		return 0, err
	}
	return code, nil
}

// setLocked maps code to ks on every level (0 unmaps it) and updates the
// cache to match.
func (k *keyboard) setLocked(code xproto.Keycode, ks xproto.Keysym) error {
	list := make([]xproto.Keysym, k.per)
	for i := range list {
		list[i] = ks
	}
	if err := xproto.ChangeKeyboardMappingChecked(k.d.conn, 1, code, byte(k.per), list).Check(); err != nil {
		return fmt.Errorf("change keyboard mapping of keycode %d: %w", code, err)
	}
	if k.syms != nil {
		copy(k.syms[int(code-k.min)*k.per:], list)
		k.reindexLocked()
	}
	return nil
}

// scheduleRestore unbinds the remapped keycodes restoreAfter from now,
// unless they are used again before.
func (k *keyboard) scheduleRestore() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.bound) == 0 || k.closed {
		return
	}
	k.lastTyped = time.Now()
	if k.timer != nil {
		k.timer.Reset(restoreAfter)
		return
	}
	k.timer = time.AfterFunc(restoreAfter, func() {
		k.d.inputMu.Lock()
		defer k.d.inputMu.Unlock()
		// The timer may have fired while typing held inputMu; the keys
		// just typed must stay bound for their full restoreAfter, or the
		// last of them are unbound microseconds after their release, the
		// very race this keyboard avoids (it lost the last character of
		// one e2e run in six).
		k.mu.Lock()
		if left := restoreAfter - time.Since(k.lastTyped); left > 0 && !k.closed {
			k.timer.Reset(left)
			k.mu.Unlock()
			return
		}
		k.mu.Unlock()
		k.restore(false)
	})
}

// restore maps the keycodes we bound back to nothing, except those held by
// key_down. With final it also stops the restore timer for good (Close).
func (k *keyboard) restore(final bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return
	}
	if final {
		k.closed = true
		if k.timer != nil {
			k.timer.Stop()
		}
	}
	var errs []error
	for code := range k.bound {
		if k.held[code] > 0 && !final {
			continue
		}
		if err := k.setLocked(code, 0); err != nil {
			errs = append(errs, err)
		}
		delete(k.bound, code)
	}
	_ = errors.Join(errs...) // best effort: a lost binding only wastes a keycode
}

// press sends a key press (down) or release of code and tracks keys held
// by key_down.
func (k *keyboard) press(code xproto.Keycode, down, hold bool) {
	typ := byte(xproto.KeyRelease)
	if down {
		typ = xproto.KeyPress
	}
	k.d.fake(typ, byte(code), 0, 0)
	if !hold {
		return
	}
	k.mu.Lock()
	if down {
		k.held[code]++
	} else if k.held[code] > 0 {
		k.held[code]--
		if k.held[code] == 0 {
			delete(k.held, code)
		}
	}
	k.mu.Unlock()
}

// releaseAll releases every key that key_down left pressed.
func (k *keyboard) releaseAll() {
	k.mu.Lock()
	codes := make([]xproto.Keycode, 0, len(k.held))
	for c := range k.held {
		codes = append(codes, c)
	}
	k.held = map[xproto.Keycode]int{}
	k.mu.Unlock()
	for _, c := range codes {
		k.d.fake(xproto.KeyRelease, byte(c), 0, 0)
	}
}
