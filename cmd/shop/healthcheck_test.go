package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestProbeURL(t *testing.T) {
	for addr, want := range map[string]string{
		"":               "http://127.0.0.1:8080/readyz",
		":8080":          "http://127.0.0.1:8080/readyz",
		"0.0.0.0:8080":   "http://127.0.0.1:8080/readyz",
		"127.0.0.1:9090": "http://127.0.0.1:9090/readyz",
		"[::]:8080":      "http://127.0.0.1:8080/readyz",
		"[::1]:8080":     "http://[::1]:8080/readyz",
		"localhost:8080": "http://localhost:8080/readyz",
	} {
		if got, err := probeURL(addr); err != nil || got != want {
			t.Errorf("probeURL(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
	for _, addr := range []string{":0", "8080", ":http", "host:99999"} {
		if got, err := probeURL(addr); err == nil {
			t.Errorf("probeURL(%q) = %q, want an error", addr, got)
		}
	}
}

// TestHealthcheck probes the real service, as the container does, through
// run: exit 0 while ready, 1 with one line on stderr otherwise.
func TestHealthcheck(t *testing.T) {
	srv, a := newTestServer(t, nil)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	probe := func(addr string) (int, string) {
		var stdout, stderr strings.Builder
		code := run([]string{"healthcheck"}, func(k string) string {
			if k == "SHOP_HTTP_ADDR" {
				return addr
			}
			return ""
		}, &stdout, &stderr)
		return code, stderr.String()
	}
	for _, addr := range []string{":" + port, "0.0.0.0:" + port, "127.0.0.1:" + port, "[::]:" + port} {
		if code, stderr := probe(addr); code != 0 || stderr != "" {
			t.Errorf("ready, SHOP_HTTP_ADDR=%s: exit %d, stderr %q", addr, code, stderr)
		}
	}

	a.stopping.Store(true) // /readyz answers 503 from here on
	code, stderr := probe(":" + port)
	if code != 1 || !strings.Contains(stderr, "503") || !strings.Contains(stderr, "down: shutdown") ||
		strings.Count(stderr, "\n") != 1 {
		t.Errorf("not ready: exit %d, stderr %q; want 1 and one line naming 503 and the reason", code, stderr)
	}

	if code, stderr := probe(":0"); code != 1 || strings.Count(stderr, "\n") != 1 {
		t.Errorf("port 0: exit %d, stderr %q", code, stderr)
	}
	srv.Close()
	if code, stderr := probe(":" + port); code != 1 || !strings.Contains(stderr, "refused") {
		t.Errorf("nothing listening: exit %d, stderr %q", code, stderr)
	}
}

func TestHealthcheckTimesOut(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	err := healthcheck(srv.Listener.Addr().String(), 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "Timeout") {
		t.Errorf("hung /readyz: %v, want a timeout", err)
	}
}
