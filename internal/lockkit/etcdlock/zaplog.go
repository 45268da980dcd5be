package etcdlock

import (
	"context"
	"log/slog"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogLogger is the etcd client's logger: its records go to slog's default
// logger, into the service's own log stream, instead of JSON lines of the
// client's own on stderr. Its info records (dialing, balancer chatter)
// become debug ones.
func slogLogger() *zap.Logger { return zap.New(slogCore{}) }

type slogCore struct{ fields []zapcore.Field }

func (c slogCore) Enabled(l zapcore.Level) bool {
	return slog.Default().Enabled(context.Background(), slogLevel(l))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	return slogCore{fields: append(slices.Clip(c.fields), fields...)}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(slices.Clip(c.fields), fields...) {
		f.AddTo(enc)
	}
	attrs := []any{"backend", "etcd"}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range enc.Fields {
			if !yield(k) {
				return
			}
		}
	}) {
		attrs = append(attrs, k, enc.Fields[k])
	}
	slog.Log(context.Background(), slogLevel(e.Level), e.Message, attrs...)
	return nil
}

func (slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}
