package main

import (
	"strings"
	"testing"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// Every events row is a row of -backends all, and shop accepts its
// settings as they are: a setting config refuses (an ack wait, a lease
// the duplicate window does not cover) would stop every instance.
func TestEventsRowsRunWithSettingsShopAccepts(t *testing.T) {
	e := testEnv{cluster: "127.0.0.1:7000"}
	ways := map[string]bool{}
	for _, name := range eventsRows {
		if !isRow(name) {
			t.Errorf("%s is not a row of -backends", name)
		}
		s := rowSpec(name, 3, allFlows)
		if !s.IsEvents() || len(s.Flows) != 1 || s.Flows[0] != "orders" {
			t.Errorf("%s: %+v, want an events row of the orders flow", name, s)
		}
		ways[s.Delivery+"+"+s.Dedup] = true
		r := runner{env: e}.newRow(s)
		r.db = rowDB{name: "shop", dsn: "root:@tcp(127.0.0.1:3306)/shop?parseTime=true"}
		r.events = &eventRig{broker: &broker{port: 4222}}
		env := map[string]string{}
		for _, kv := range r.shopEnv(1) {
			name, v, _ := strings.Cut(kv, "=")
			env[name] = v
		}
		cfg, err := config.Load(func(name string) string { return env[name] })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cfg.Events.Delivery != s.Delivery || cfg.Events.Dedup != s.Dedup || cfg.Events.ConsumeInServe {
			t.Errorf("%s: shop runs delivery %s, dedup %s, consumer in serve %v", name, cfg.Events.Delivery, cfg.Events.Dedup,
				cfg.Events.ConsumeInServe)
		}
	}
	for _, way := range []string{"outbox+inbox", "outbox+lock", "outbox+none", "direct+inbox"} {
		if !ways[way] {
			t.Errorf("no events row for %s", way)
		}
	}
	if s := rowSpec("events", 3, []string{"seckill"}); len(s.Flows) != 0 {
		t.Errorf("-flows seckill still runs the events row's %v", s.Flows)
	}
}

// The instance killed as the relay's leader is the one publishing now,
// not the one that published most before.
func TestTheLeaderIsTheInstancePublishingNow(t *testing.T) {
	cases := []struct {
		name          string
		before, after []float64
		want          int
	}{
		{"the one whose count grows", []float64{500, 10, 40}, []float64{500, 10, 90}, 2},
		{"nobody published in between: the one that published most", []float64{5, 70, 3}, []float64{5, 70, 3}, 1},
		{"a restarted instance counts from 0", []float64{0, 80, 0}, []float64{0, 80, 12}, 2},
		{"nothing published at all", []float64{0, 0, 0}, []float64{0, 0, 0}, 0},
	}
	for _, c := range cases {
		if got := busiest(c.before, c.after); got != c.want {
			t.Errorf("%s: instance %d, want %d", c.name, got, c.want)
		}
	}
}

func TestPercentilesAreNearestRank(t *testing.T) {
	var v []float64
	for i := 100; i >= 1; i-- {
		v = append(v, float64(i))
	}
	got := percentiles(v)
	want := report.Latency{P50: 50, P95: 95, P99: 99, Max: 100, N: 100}
	if got != want {
		t.Errorf("%+v, want %+v", got, want)
	}
	if got := percentiles([]float64{7}); got.P50 != 7 || got.P99 != 7 {
		t.Errorf("one value: %+v", got)
	}
	if got := percentiles(nil); got != (report.Latency{}) {
		t.Errorf("none: %+v", got)
	}
}
