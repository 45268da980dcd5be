package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/loadtest/runner/capacity"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// A row that fails keeps what it measured before it failed (its ceiling)
// beside its error, and the rows after it are still measured, the seckill
// alone.
func TestAFailedCapacityRowKeepsWhatItMeasured(t *testing.T) {
	rn := quietRunner("redis", "etcd")
	var flows [][]string
	results := rn.measuredRows(context.Background(), func(_ context.Context, s report.Row) (report.CapacityRow, error) {
		flows = append(flows, s.Flows)
		res := report.CapacityRow{Spec: s, Ceiling: capacity.Ceiling{CeilingPerSec: 800}}
		if s.Name == "redis" {
			return res, errors.New("probe: connection refused")
		}
		res.Held = 100
		return res, nil
	})
	if len(results) != 2 {
		t.Fatalf("%d rows measured, want 2", len(results))
	}
	if r := results[0]; r.Err != "probe: connection refused" || r.Ceiling.CeilingPerSec != 800 || r.Spec.Name != "redis" {
		t.Errorf("failed row %+v", r)
	}
	if r := results[1]; r.Err != "" || r.Held != 100 {
		t.Errorf("next row %+v", r)
	}
	for _, f := range flows {
		if len(f) != 1 || f[0] != "seckill" {
			t.Errorf("a capacity row ran flows %v", f)
		}
	}
}

func TestCapacityRowsStopAtAnInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	results := quietRunner("redis", "etcd", "mysql").measuredRows(ctx, func(_ context.Context, s report.Row) (report.CapacityRow, error) {
		n++
		cancel()
		return report.CapacityRow{Spec: s}, nil
	})
	if n != 1 || len(results) != 1 {
		t.Errorf("%d rows measured after an interrupt in the first", n)
	}
}

// heldWell is a row that held rate and, past it, turned the excess away
// and kept its sales.
func heldWell(name string, rate float64) report.CapacityRow {
	round := capacity.Round{
		AtHeld: capacity.Step{Rate: rate, SalesPerS: rate, Sold: int(rate), ServiceCPU: 0.1, WithinSLO: true},
		AtTwo:  capacity.Step{Rate: 2 * rate, SalesPerS: rate, P99: 40},
		AtFour: capacity.Step{Rate: 4 * rate, SalesPerS: rate, P99: 45},
	}
	return report.CapacityRow{Spec: report.Row{Name: name}, Held: rate, Rounds: []capacity.Round{round}}
}

// The capacity run fails on a row that did not run, held nothing, or
// queued past the SLO at twice its rate held, and names each.
func TestCapacityVerdictNamesEveryRowThatFails(t *testing.T) {
	slow := heldWell("etcd", 80)
	slow.Rounds[0].AtTwo.P99 = 900
	rep := report.CapacityReport{Results: []report.CapacityRow{
		heldWell("redis", 100), slow, {Spec: report.Row{Name: "zookeeper"}},
		{Spec: report.Row{Name: "mysql"}, Err: "start: exited"},
	}}
	rep.Options.Probe.SLO = 250 * time.Millisecond
	var stderr bytes.Buffer
	if code := capacityVerdict(rep, &stderr); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if want := "runner: capacity verdict fails etcd, zookeeper, mysql (see the verdict column)\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
	rep.Results = rep.Results[:1]
	stderr.Reset()
	if code := capacityVerdict(rep, &stderr); code != 0 || stderr.Len() != 0 {
		t.Errorf("a run whose rows all pass: exit %d, %q", code, stderr.String())
	}
}

// The ceiling is timed with the row's own environment (its database and
// key prefix) and 300 purchases; its last line is the JSON.
func TestMeasureCeilingRunsTheCommandWithTheRowsEnvironment(t *testing.T) {
	env := append(os.Environ(), "RUNNER_FAKE=ceiling", "SHOP_KEY_PREFIX=lt1-redis:")
	c, err := measureCeiling(context.Background(), os.Args[0]+" -window lock", env)
	if err != nil {
		t.Fatal(err)
	}
	want := capacity.Ceiling{Window: "lt1-redis: -window lock -n 300", SerializedMicros: 1250, CeilingPerSec: 800}
	if c != want {
		t.Errorf("ceiling %+v, want %+v", c, want)
	}
}

func TestMeasureCeilingSaysWhyItFailed(t *testing.T) {
	failing := append(os.Environ(), "RUNNER_FAKE=ceiling", "RUNNER_FAKE_EXIT=1")
	if _, err := measureCeiling(context.Background(), os.Args[0], failing); err == nil ||
		!strings.Contains(err.Error(), "cannot reach the database") {
		t.Errorf("a failing ceiling: %v, want its stderr", err)
	}
	// shop migrate prints no JSON.
	notJSON := append(os.Environ(), "RUNNER_FAKE=shop")
	if _, err := measureCeiling(context.Background(), os.Args[0]+" migrate", notJSON); err == nil ||
		!strings.Contains(err.Error(), "printed") {
		t.Errorf("a ceiling that printed no JSON: %v", err)
	}
}

// r0, the CPU a bare server spends per refusal, is timed on a real
// process that refuses every request.
func TestBareRefusalTimesARealRefusingServer(t *testing.T) {
	t.Setenv("RUNNER_FAKE", "refuser")
	c := capacity.Options{Step: 500 * time.Millisecond, SLO: time.Second, Rounds: 1}
	us, err := measureBareRefusal(context.Background(), quietRunner().log, os.Args[0], c)
	if err != nil || us <= 0 {
		t.Errorf("%.1f µs per refusal, %v", us, err)
	}
}

// A server that answers anything but 503 is not the bare refusal the
// verdict's bound is made of; one that never says where it listens is
// not measured at all.
func TestBareRefusalRefusesAServerThatDoesNotRefuse(t *testing.T) {
	c := capacity.Options{Step: 100 * time.Millisecond, SLO: time.Second, Rounds: 1}
	t.Setenv("RUNNER_FAKE", "refuser")
	t.Setenv("RUNNER_FAKE_STATUS", "200")
	if _, err := measureBareRefusal(context.Background(), quietRunner().log, os.Args[0], c); err == nil ||
		!strings.Contains(err.Error(), "with 503") {
		t.Errorf("a server answering 200: %v", err)
	}
	t.Setenv("RUNNER_FAKE_SERVE", "exit")
	if _, err := measureBareRefusal(context.Background(), quietRunner().log, os.Args[0], c); err == nil ||
		!strings.Contains(err.Error(), "printed no address") {
		t.Errorf("a server printing nothing: %v", err)
	}
}
