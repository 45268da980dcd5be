package main

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// requestIDKey is the context key of the request's id, which the
// requestID middleware sets and requestIDHandler reads.
type requestIDKey struct{}

// requestIDHandler adds request_id and trace_id to every record logged with
// a request's context, whichever package logs it (a domain, gorm's
// slow-query log, go-redis), so that one grep finds everything a request
// did, and the trace id leads from a log line to its trace.
type requestIDHandler struct{ slog.Handler }

func (h requestIDHandler) Handle(ctx context.Context, r slog.Record) error {
	id, ok := ctx.Value(requestIDKey{}).(string)
	sc := trace.SpanContextFromContext(ctx)
	if ok || sc.HasTraceID() {
		r = r.Clone()
	}
	if ok {
		r.AddAttrs(slog.String("request_id", id))
	}
	if sc.HasTraceID() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestIDHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(attrs)}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
}
