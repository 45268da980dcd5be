package lockkit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// A write that fn completed stands though the lease was lost after it:
// DoFenced and DoManyFenced answer nil where Do and DoMany answer
// ErrLeaseLost; an fn that failed keeps its own error.
func TestDoFencedAnswersForTheWriteThatLanded(t *testing.T) {
	ctx := context.Background()
	failed := errors.New("refused")
	for _, tc := range []struct {
		name  string
		fnErr error
		want  error
	}{
		{"landed", nil, nil},
		{"refused", failed, failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := local.New()
			defer l.Close()
			loseThen := func(ctx context.Context) error {
				l.Steal("k")
				<-ctx.Done() // the lease is lost; the write is done
				return tc.fnErr
			}
			err := lockkit.DoFenced(ctx, l, "k", func(ctx context.Context, _ uint64) error { return loseThen(ctx) },
				lockkit.WithAutoRenew(60*time.Millisecond))
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("DoFenced = %v, want %v", err, tc.want)
			}
			err = lockkit.DoManyFenced(ctx, l, []string{"k"}, func(ctx context.Context, _ map[string]uint64) error { return loseThen(ctx) },
				lockkit.WithAutoRenew(60*time.Millisecond))
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("DoManyFenced = %v, want %v", err, tc.want)
			}
		})
	}
}
