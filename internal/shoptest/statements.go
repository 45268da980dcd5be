package shoptest

import (
	"context"
	"sync"
	"time"

	"gorm.io/gorm/logger"
)

// StatementLog is a gorm logger that records every statement run, for
// tests that count what a flow sends (each round trip inside a critical
// section is paid by every writer queued behind it).
type StatementLog struct {
	logger.Interface
	mu  sync.Mutex
	sql []string
}

// NewStatementLog returns a StatementLog that prints nothing.
func NewStatementLog() *StatementLog { return &StatementLog{Interface: logger.Discard} }

func (l *StatementLog) LogMode(logger.LogLevel) logger.Interface { return l }

func (l *StatementLog) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, sql)
}

// Take returns the statements recorded since the last Take and forgets them.
func (l *StatementLog) Take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	sql := l.sql
	l.sql = nil
	return sql
}
