package main

import (
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/config"
)

// sqlTracing is a gorm plugin that makes a client span of each statement,
// named and attributed by OpenTelemetry's database conventions, with the
// statement's text but not its values (they may be personal). It is what
// gorm.io/plugin/opentelemetry does, without that module's imports of the
// ClickHouse, Postgres and SQL Server drivers, which would ship in the
// binary for nothing.
type sqlTracing struct{ system attribute.KeyValue }

const sqlSpanKey = "shop:otel-span"

func (sqlTracing) Name() string { return "shop:sql-tracing" }

func (p sqlTracing) Initialize(db *gorm.DB) error {
	cb := db.Callback()
	return errors.Join(
		cb.Create().Before("gorm:create").Register("shop:trace_before_create", p.start),
		cb.Create().After("gorm:create").Register("shop:trace_after_create", p.end),
		cb.Query().Before("gorm:query").Register("shop:trace_before_query", p.start),
		cb.Query().After("gorm:query").Register("shop:trace_after_query", p.end),
		cb.Update().Before("gorm:update").Register("shop:trace_before_update", p.start),
		cb.Update().After("gorm:update").Register("shop:trace_after_update", p.end),
		cb.Delete().Before("gorm:delete").Register("shop:trace_before_delete", p.start),
		cb.Delete().After("gorm:delete").Register("shop:trace_after_delete", p.end),
		cb.Row().Before("gorm:row").Register("shop:trace_before_row", p.start),
		cb.Row().After("gorm:row").Register("shop:trace_after_row", p.end),
		cb.Raw().Before("gorm:raw").Register("shop:trace_before_raw", p.start),
		cb.Raw().After("gorm:raw").Register("shop:trace_after_raw", p.end),
	)
}

func (p sqlTracing) start(db *gorm.DB) {
	ctx, span := otel.Tracer(tracerName).Start(db.Statement.Context, "sql", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(p.system))
	db.Statement.Context = ctx
	db.InstanceSet(sqlSpanKey, span)
}

func (p sqlTracing) end(db *gorm.DB) {
	v, ok := db.InstanceGet(sqlSpanKey)
	if !ok {
		return
	}
	span := v.(trace.Span)
	defer span.End()
	query := db.Statement.SQL.String()
	op, _, _ := cutWord(query)
	if op != "" {
		span.SetName(op + " " + db.Statement.Table)
	}
	span.SetAttributes(semconv.DBQueryText(query), semconv.DBOperationName(op),
		semconv.DBCollectionName(db.Statement.Table), attribute.Int64("db.response.returned_rows", db.RowsAffected))
	if db.Error != nil && db.Error != gorm.ErrRecordNotFound {
		span.RecordError(db.Error)
		span.SetStatus(codes.Error, db.Error.Error())
	}
}

// cutWord returns the first word of s, upper case as SQL writes it.
func cutWord(s string) (word, rest string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' || s[i] == '\n' || s[i] == '\t' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func dbSystem(cfg config.Config) attribute.KeyValue {
	if cfg.MySQLDSN != "" {
		return semconv.DBSystemNameMariaDB
	}
	return semconv.DBSystemNameSQLite
}
