package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// TestRequestLogLinesCarryRequestAndTraceIDs: a line logged with a
// request's context names its request id and its trace id, so that a log
// line leads to the request's trace.
func TestRequestLogLinesCarryRequestAndTraceIDs(t *testing.T) {
	var out strings.Builder
	log := slog.New(requestIDHandler{slog.NewJSONHandler(&out, nil)})
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.WithValue(context.Background(), requestIDKey{}, "r-1"),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	log.InfoContext(ctx, "request")
	log.Info("no request")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(lines[0], `"request_id":"r-1"`) || !strings.Contains(lines[0], `"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"`) {
		t.Errorf("request line %s: want request_id and trace_id", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") || strings.Contains(lines[1], "request_id") {
		t.Errorf("a line outside a request names one: %s", lines[1])
	}
}
