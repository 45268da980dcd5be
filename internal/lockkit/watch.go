package lockkit

import "context"

// Watch is how Do watches its lease, exported for work under a lease
// whose life is not one function call: it derives from ctx a context that
// is cancelled with cause ErrLeaseLost as soon as lease is lost. stop ends
// the watch and cancels the context; call it when the work is done and
// before the lease is released (a release closes Lost). It returns once
// the watch has ended, so no goroutine outlives it.
func Watch(ctx context.Context, lease Lease) (watched context.Context, stop func()) {
	watched, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-lease.Lost():
			cancel(ErrLeaseLost)
		case <-watched.Done():
		}
	}()
	return watched, func() { cancel(nil); <-done }
}
