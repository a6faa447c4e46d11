package inflight

import (
	"sync"
	"testing"
)

func TestLimiter(t *testing.T) {
	l := New(2)
	r1, ok1 := l.Acquire("a")
	r2, ok2 := l.Acquire("a")
	if !ok1 || !ok2 {
		t.Fatal("first two refused")
	}
	if _, ok := l.Acquire("a"); ok {
		t.Fatal("third of a accepted over a bound of 2")
	}
	rb, ok := l.Acquire("b")
	if !ok {
		t.Fatal("b refused because of a")
	}
	r1()
	r1() // a second release must not free another slot
	if got := l.InFlight("a"); got != 1 {
		t.Fatalf("a in flight = %d after one release, want 1", got)
	}
	r3, ok := l.Acquire("a")
	if !ok {
		t.Fatal("a refused after a release")
	}
	r2()
	r3()
	rb()
	if l.Sandboxes() != 0 {
		t.Fatalf("%d sandboxes left in the map after every release", l.Sandboxes())
	}
}

func TestUnlimited(t *testing.T) {
	l := New(0)
	var rs []func()
	for range 1000 {
		r, ok := l.Acquire("a")
		if !ok {
			t.Fatal("refused without a limit")
		}
		rs = append(rs, r)
	}
	for _, r := range rs {
		r()
	}
	if l.InFlight("a") != 0 || l.Max() != 0 {
		t.Fatal("counts left")
	}
}

// TestConcurrent: under contention the bound holds exactly and every count
// returns to zero.
func TestConcurrent(t *testing.T) {
	l := New(5)
	var mu sync.Mutex
	peak, cur := 0, 0
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				r, ok := l.Acquire("x")
				if !ok {
					continue
				}
				mu.Lock()
				cur++
				peak = max(peak, cur)
				mu.Unlock()
				mu.Lock()
				cur--
				mu.Unlock()
				r()
			}
		}()
	}
	wg.Wait()
	if peak > 5 || l.Sandboxes() != 0 {
		t.Fatalf("peak %d (bound 5), %d sandboxes left", peak, l.Sandboxes())
	}
}
