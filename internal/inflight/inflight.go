// Package inflight bounds how many requests to one sandbox are in progress
// at once, across the native API and E2B's data plane. Each such request
// holds a goroutine, a connection and a stream to the sandbox's agent for
// as long as the client keeps it open; without a bound, one agent (or one
// slow or hostile client) could pile up thousands of them and starve the
// daemon and every other sandbox. A request over the bound is refused at
// once (429), never queued: the caller's retry is cheaper than a queue
// that hides the overload.
//
// It is a counter per sandbox ID under one mutex, removed when it drops to
// zero, so the map holds only sandboxes with requests in progress. A
// semaphore library would need the same map around it.
package inflight

import "sync"

// Limiter counts requests in progress per sandbox. The zero value is not
// usable; call New. It is safe for concurrent use.
type Limiter struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// New returns a limiter of max requests in progress per sandbox; max <= 0
// means no limit (the counts are still kept).
func New(max int) *Limiter {
	return &Limiter{max: max, n: map[string]int{}}
}

// Max is the bound per sandbox (0 = none).
func (l *Limiter) Max() int {
	if l.max < 0 {
		return 0
	}
	return l.max
}

// Acquire takes a slot of sandbox id. When ok, release must be called
// exactly once when the request ends; it is safe to call more than once.
func (l *Limiter) Acquire(id string) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.n[id] >= l.max {
		return nil, false
	}
	l.n[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.n[id]--; l.n[id] <= 0 {
				delete(l.n, id)
			}
		})
	}, true
}

// InFlight is the number of requests of sandbox id in progress.
func (l *Limiter) InFlight(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[id]
}

// Sandboxes is the number of sandboxes with a request in progress.
func (l *Limiter) Sandboxes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.n)
}
