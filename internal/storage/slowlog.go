package storage

import (
	"context"
	"log/slog"
	"time"

	"gorm.io/gorm/logger"
)

// slowLog is gorm's logger reduced to what shop wants from it: statements
// slower than a threshold, at WARN, through slog and with the caller's
// context (so a request's id follows). Errors are not logged here: they
// are returned, and whoever handles one logs it once, with its meaning.
type slowLog struct {
	log       *slog.Logger
	threshold time.Duration
}

func (l slowLog) LogMode(logger.LogLevel) logger.Interface { return l }

func (slowLog) Info(context.Context, string, ...any)  {}
func (slowLog) Warn(context.Context, string, ...any)  {}
func (slowLog) Error(context.Context, string, ...any) {}

func (l slowLog) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), _ error) {
	elapsed := time.Since(begin)
	if elapsed < l.threshold {
		return
	}
	sql, rows := fc()
	l.log.WarnContext(ctx, "slow query", "sql", sql, "rows", rows,
		"duration_ms", float64(elapsed.Microseconds())/1000, "threshold_ms", l.threshold.Milliseconds())
}
