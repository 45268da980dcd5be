package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// combinedSuffix marks a lock row whose instances combine the buyers of
// one SKU under one grant (SHOP_STOCK_COMBINE=combineBatch).
const (
	combinedSuffix = "+combined"
	combineBatch   = 32
)

// limit is the per-user limit of the fixture's limited SKU: atomic under
// every strategy, so every row runs it and none may sell past it.
var allFlows = []string{"seckill", "balance", "likes", "orders", "limit"}

// rowSpec is what the row name means. flows limits the flows every row
// runs (the reference rows run the seckill only, if at all).
func rowSpec(name string, instances int, flows []string) report.Row {
	s := baseSpec(name, instances)
	var keep []string
	for _, f := range s.Flows {
		if slices.Contains(flows, f) {
			keep = append(keep, f)
		}
	}
	s.Flows = keep
	return s
}

func baseSpec(name string, instances int) report.Row {
	if base, ok := strings.CutSuffix(name, combinedSuffix); ok {
		s := baseSpec(base, instances)
		s.Name, s.Combine = name, combineBatch
		s.Why += fmt.Sprintf("; up to %d queued buyers per grant", combineBatch)
		return s
	}
	if s, ok := eventsSpec(name); ok {
		return s
	}
	lock := func(expect report.Expectation, why string) report.Row {
		return report.Row{Name: name, Backend: name, Strategy: "lock", Flows: allFlows, Expect: expect, Why: why, NoFence: unfenced(name)}
	}
	switch name {
	case "none":
		return lock(report.ExpectDamage, "no lock: read-modify-writes interleave")
	case "local":
		if instances > 1 {
			return lock(report.ExpectDamage, fmt.Sprintf("an in-process mutex excludes nothing across %d processes", instances))
		}
		return lock(report.ExpectClean, "one process: an in-process mutex is enough")
	case "optimistic":
		// No lock: stock and balances are written over the version they
		// read. Likes and orders would run under none, so they stay out.
		return report.Row{Name: name, Backend: "none", Strategy: name, Flows: []string{"seckill", "balance", "limit"}, Expect: report.ExpectClean,
			Why: "versioned writes, retried; no lock"}
	case "atomic-sql", "atomic-redis":
		// Reference rows: the stock needs no lock, so only the sales run
		// and the lock backend is none (nothing else may be guarded by it).
		return report.Row{Name: name, Backend: "none", Strategy: name, Flows: []string{"seckill", "limit"}, Expect: report.ExpectClean,
			Why: "one atomic operation decides each sale; no lock"}
	}
	return lock(report.ExpectClean, "a lock shared by every instance")
}

// unfenced reports whether backend is a lock across processes that issues
// no fencing token, as its registered capabilities declare: its clean row
// proves nothing about a holder paused past its lease.
func unfenced(backend string) bool {
	b, ok := registry.Lookup(backend)
	return ok && b.Capabilities.CrossProcess && !b.Capabilities.Fencing
}
