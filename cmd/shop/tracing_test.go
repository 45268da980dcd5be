package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestPurchaseTraceShowsLockWaitHoldAndSQL: a purchase that arrives with a
// W3C traceparent is traced in the caller's trace as request -> lock wait
// (its Redis commands inside) -> lock hold -> the SQL statements under the
// lock; a refused purchase (sold out, found under the lock) has the same
// shape, and its request span carries the 409.
func TestPurchaseTraceShowsLockWaitHoldAndSQL(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	oldTP, oldProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(oldTP); otel.SetTextMapPropagator(oldProp) })

	srv, _ := newTestServer(t, map[string]string{"SHOP_STOCK_STRATEGY": "lock"})
	post := func(path, token, body, traceparent string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewBufferString(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if code := post("/admin/v1/products", testAdmin, `{"sku":"traced-1","name":"t","stock":1,"price_cents":1}`, ""); code != 201 {
		t.Fatalf("create product: %d", code)
	}
	for _, tc := range []struct {
		name, traceID string
		status        int
	}{
		{"sold", "4bf92f3577b34da6a3ce929d0e0e4736", 201},
		{"refused-sold-out", "5bf92f3577b34da6a3ce929d0e0e4737", 409},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const callerSpan = "00f067aa0ba902b7"
			tp := fmt.Sprintf("00-%s-%s-01", tc.traceID, callerSpan)
			if code := post("/api/v1/seckill/traced-1/purchase", shoptestToken(t, 1), `{"quantity":1}`, tp); code != tc.status {
				t.Fatalf("purchase: %d, want %d", code, tc.status)
			}
			checkPurchaseTrace(t, spansOf(spans.GetSpans(), tc.traceID), callerSpan, tc.status)
		})
	}
}

func spansOf(all tracetest.SpanStubs, traceID string) tracetest.SpanStubs {
	return slices.DeleteFunc(slices.Clone(all), func(s tracetest.SpanStub) bool { return s.SpanContext.TraceID().String() != traceID })
}

func checkPurchaseTrace(t *testing.T, spans tracetest.SpanStubs, callerSpan string, status int) {
	t.Helper()
	request := findSpan(t, spans, func(s tracetest.SpanStub) bool { return s.SpanKind == trace.SpanKindServer })
	if request.Parent.SpanID().String() != callerSpan || !request.Parent.IsRemote() {
		t.Errorf("request span's parent is %s, want the caller's %s from traceparent", request.Parent.SpanID(), callerSpan)
	}
	if got := attr(request, "http.response.status_code"); got != fmt.Sprint(status) {
		t.Errorf("request span status code %q, want %d", got, status)
	}
	wait := findSpan(t, spans, named("lock wait"))
	hold := findSpan(t, spans, named("lock hold"))
	checkLockSpans(t, request, wait, hold)
	checkCallsInsideTheLock(t, spans, wait, hold)
}

// checkLockSpans: the lock wait and the lock hold are children of the
// request span that say which lock, its fence, and how each ended.
func checkLockSpans(t *testing.T, request, wait, hold tracetest.SpanStub) {
	t.Helper()
	for _, s := range []tracetest.SpanStub{wait, hold} {
		if s.Parent.SpanID() != request.SpanContext.SpanID() {
			t.Errorf("%s is not a child of the request span", s.Name)
		}
		if attr(s, "lock.backend") != "redis" || attr(s, "lock.class") != "stock" || attr(s, "lock.fence") == "" || attr(s, "lock.fence") == "0" {
			t.Errorf("%s attributes %v: want backend redis, class stock, a fence", s.Name, s.Attributes)
		}
	}
	if attr(wait, "lock.outcome") != "granted" || attr(wait, "lock.waited_ms") == "" {
		t.Errorf("lock wait attributes %v: want outcome granted and waited_ms", wait.Attributes)
	}
	if attr(hold, "lock.outcome") != "released" {
		t.Errorf("lock hold outcome %q, want released", attr(hold, "lock.outcome"))
	}
}

// checkCallsInsideTheLock: the Redis commands of the wait and the SQL of
// the hold are traced under their lock span.
func checkCallsInsideTheLock(t *testing.T, spans tracetest.SpanStubs, wait, hold tracetest.SpanStub) {
	t.Helper()
	if !slices.ContainsFunc(spans, func(s tracetest.SpanStub) bool {
		return s.Parent.SpanID() == wait.SpanContext.SpanID() && attr(s, "db.system") == "redis"
	}) {
		t.Errorf("no Redis command span inside the lock wait")
	}
	if !slices.ContainsFunc(spans, func(s tracetest.SpanStub) bool {
		return s.Parent.SpanID() == hold.SpanContext.SpanID() && strings.Contains(attr(s, "db.query.text"), "products")
	}) {
		t.Errorf("no SQL statement on products inside the lock hold; spans: %v", names(spans))
	}
}

func findSpan(t *testing.T, spans tracetest.SpanStubs, match func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	i := slices.IndexFunc(spans, match)
	if i < 0 {
		t.Fatalf("span not found among %v", names(spans))
	}
	return spans[i]
}

func named(name string) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool { return s.Name == name }
}

func attr(s tracetest.SpanStub, key attribute.Key) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

func names(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

// TestTracesExportedOnlyWhenAnEndpointIsSet: with
// OTEL_EXPORTER_OTLP_ENDPOINT set, spans reach the collector over
// OTLP/HTTP; without it, nothing is sent anywhere.
func TestTracesExportedOnlyWhenAnEndpointIsSet(t *testing.T) {
	var posts atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
	}))
	defer collector.Close()
	oldTP, oldProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTracerProvider(oldTP); otel.SetTextMapPropagator(oldProp) })
	for _, tc := range []struct {
		endpoint string
		want     bool
	}{{"", false}, {collector.URL, true}} {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint)
		posts.Store(0)
		shutdown, err := setupTracing(context.Background(), os.Getenv)
		if err != nil {
			t.Fatal(err)
		}
		_, span := otel.Tracer("test").Start(context.Background(), "work")
		span.End()
		if err := shutdown(context.Background()); err != nil { // flushes the batch
			t.Fatal(err)
		}
		if got := posts.Load() > 0; got != tc.want {
			t.Errorf("endpoint %q: spans exported = %v, want %v", tc.endpoint, got, tc.want)
		}
	}
}
