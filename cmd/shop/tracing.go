package main

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockbench/shop/internal/lockkit"
)

// setupTracing installs the process's tracer provider and the W3C
// traceparent propagator. Spans are exported over OTLP/HTTP only when
// OTEL_EXPORTER_OTLP_ENDPOINT (or its _TRACES_ form) is set, and the
// exporter reads the other standard OTEL_* variables itself. Without it
// spans are still made, unexported, so that every request has a trace id
// for its log lines and an incoming traceparent is carried on.
func setupTracing(ctx context.Context, getenv func(string) string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the defaults.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("shop"),
		semconv.ServiceVersion(readBuildInfo().Version)), resource.WithFromEnv(), resource.WithHost())
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

const tracerName = "github.com/lockbench/shop/cmd/shop"

// tracedLocker makes a span of each lock wait and each lock hold, the two
// parts of a request's time that are this project's subject. It wraps the
// Locker the domains are given, outside the metrics, so that a wait's span
// covers what shop_lock_wait_seconds measures.
type tracedLocker struct {
	lockkit.Locker
	backend string
}

func (l tracedLocker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.trace(ctx, key, opts, l.Locker.Acquire)
}

func (l tracedLocker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.trace(ctx, key, opts, l.Locker.TryAcquire)
}

func (l tracedLocker) Capabilities() lockkit.Capabilities { return lockkit.CapabilitiesOf(l.Locker) }

// Unwrap returns the traced Locker.
func (l tracedLocker) Unwrap() lockkit.Locker { return l.Locker }

func (l tracedLocker) trace(ctx context.Context, key string, opts []lockkit.Option,
	grant func(context.Context, string, ...lockkit.Option) (lockkit.Lease, error)) (lockkit.Lease, error) {
	tracer := otel.Tracer(tracerName)
	// The key itself stays out: it names a user or a SKU.
	attrs := []attribute.KeyValue{attribute.String("lock.backend", l.backend), attribute.String("lock.class", classAttr(lockkit.ClassOf(opts)))}
	// The backend's own calls (Redis commands, SQL) nest in the wait.
	waitCtx, wait := tracer.Start(ctx, "lock wait", trace.WithAttributes(attrs...))
	start := time.Now()
	lease, err := grant(waitCtx, key, opts...)
	wait.SetAttributes(attribute.Float64("lock.waited_ms", float64(time.Since(start).Microseconds())/1000),
		attribute.String("lock.outcome", outcome(err)))
	if err != nil {
		wait.RecordError(err)
		wait.SetStatus(codes.Error, outcome(err))
		wait.End()
		return nil, err
	}
	fence := attribute.Int64("lock.fence", int64(lease.Fence()))
	wait.SetAttributes(fence)
	wait.End()
	_, hold := tracer.Start(ctx, "lock hold", trace.WithAttributes(append(attrs, fence)...))
	return &tracedLease{Lease: lease, span: hold}, nil
}

// classAttr is the lock.class of an acquisition that named class
// (lockkit.WithClass); one that named none is "other", as in the metrics.
func classAttr(class string) string {
	if class == "" {
		return "other"
	}
	return class
}

func outcome(err error) string {
	switch {
	case err == nil:
		return "granted"
	case errors.Is(err, lockkit.ErrNotAcquired):
		return "busy"
	case errors.Is(err, lockkit.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "error"
}

// tracedLease ends the hold span at its release, marked if the lease was
// lost before it.
type tracedLease struct {
	lockkit.Lease
	span trace.Span
}

// HoldContext puts the hold's span in ctx, so that what runs under the
// lock (lockkit.Do's fn: its SQL, its Redis commands) is traced inside it.
func (l *tracedLease) HoldContext(ctx context.Context) context.Context {
	return trace.ContextWithSpan(ctx, l.span)
}

func (l *tracedLease) Release(ctx context.Context) error {
	select {
	case <-l.Lease.Lost():
		l.span.SetAttributes(attribute.String("lock.outcome", "lost"))
		l.span.SetStatus(codes.Error, "lease lost before release")
	default:
		l.span.SetAttributes(attribute.String("lock.outcome", "released"))
	}
	err := l.Lease.Release(ctx)
	l.span.End()
	return err
}
