package lockkit

import "context"

// holdContext is the context Do runs fn with: ctx, with what the lease
// adds to it when it has something to add (cmd/shop's tracing puts the
// span of the lock hold there, so that fn's work is traced inside it).
func holdContext(ctx context.Context, lease Lease) context.Context {
	if h, ok := lease.(interface {
		HoldContext(context.Context) context.Context
	}); ok {
		return h.HoldContext(ctx)
	}
	return ctx
}
