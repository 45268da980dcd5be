package backend

import "sync"

// Group runs the goroutines a Locker leaves behind its callers (an attempt
// whose caller stopped waiting, the clean-up of a grant nobody took, a
// release that must still reach the store) so that Close can wait for them
// rather than leak them. The zero Group is ready to use.
type Group struct {
	mu      sync.Mutex
	stopped bool
	done    chan struct{}
	running sync.WaitGroup
}

// Go runs fn in a goroutine that Wait waits for, and reports true; after
// Stop it runs nothing and reports false, so that nothing starts once Close
// has begun to wait.
func (g *Group) Go(fn func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.running.Go(fn)
	return true
}

// Done is closed by Stop: the Locker's shutdown signal, for Grant.Closed,
// Poller.Closed and the waits of the goroutines themselves.
func (g *Group) Done() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.doneLocked()
}

func (g *Group) doneLocked() chan struct{} {
	if g.done == nil {
		g.done = make(chan struct{})
	}
	return g.done
}

// Stop refuses every later Go and closes Done. It does not wait for the
// goroutines already running: Wait does. Stopping twice is harmless.
func (g *Group) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.stopped {
		g.stopped = true
		close(g.doneLocked())
	}
}

// Wait returns once every goroutine Go started has returned. Call it after
// Stop, or new ones may keep starting.
func (g *Group) Wait() { g.running.Wait() }
