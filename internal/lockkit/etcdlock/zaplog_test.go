package etcdlock

import (
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestClientLogsGoThroughSlog: the etcd client's zap records reach slog's
// default logger with their fields, in the service's format, and its info
// chatter is debug.
func TestClientLogsGoThroughSlog(t *testing.T) {
	var out strings.Builder
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&out, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	log := slogLogger().With(zap.String("endpoint", "127.0.0.1:2379"))
	log.Warn("retrying of unary invoker failed", zap.Int("attempt", 2))
	log.Info("dialing")
	got := out.String()
	for _, want := range []string{`"level":"WARN"`, `"msg":"retrying of unary invoker failed"`, `"backend":"etcd"`,
		`"endpoint":"127.0.0.1:2379"`, `"attempt":2`} {
		if !strings.Contains(got, want) {
			t.Errorf("slog output lacks %s:\n%s", want, got)
		}
	}
	if strings.Contains(got, "dialing") {
		t.Errorf("an info record of the client reached slog at info level:\n%s", got)
	}
}
