package backend_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit/backend"
)

// Wait waits for what Go started; after Stop, Go starts nothing, so that
// Close's wait has an end.
func TestGroupWaitsForWhatItStartedAndRefusesAfterStop(t *testing.T) {
	var g backend.Group
	if backend.IsClosed(g.Done()) {
		t.Fatal("Done closed before Stop")
	}
	release := make(chan struct{})
	var finished atomic.Int32
	for range 3 {
		if !g.Go(func() { <-release; finished.Add(1) }) {
			t.Fatal("Go refused before Stop")
		}
	}
	g.Stop()
	if !backend.IsClosed(g.Done()) {
		t.Fatal("Done open after Stop")
	}
	if g.Go(func() { t.Error("ran after Stop") }) {
		t.Fatal("Go accepted after Stop")
	}
	waited := make(chan struct{})
	go func() { g.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned while goroutines still ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-waited
	if n := finished.Load(); n != 3 {
		t.Fatalf("%d goroutines finished when Wait returned, want 3", n)
	}
	g.Stop() // a second Close must not panic
}
