package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// make loadtest and make capacity keep a dated copy of their report; the
// smoke, which passes no directory, keeps none.
func TestRecordKeepsADatedCopyOnlyWhenAskedTo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	at := time.Date(2026, 11, 26, 16, 21, 0, 0, time.UTC)
	if err := record("", "loadtest", at, "# report\n"); err != nil {
		t.Fatal(err)
	}
	if err := record(dir, "capacity", at, "# report\n"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "capacity-2026-11-26.md"))
	if err != nil || string(b) != "# report\n" {
		t.Errorf("record: %q, %v", b, err)
	}
}

func TestOptionsOutOfBoundsAreAllNamed(t *testing.T) {
	var o options
	o.Instances, o.Duration, o.Fraction, o.Stock, o.MaxVUs, o.Users = 9, time.Hour, 0.7, 1, 400, 500
	o.Probe.SLO, o.Probe.Step, o.Probe.Start, o.Probe.Max, o.Probe.Factor, o.Probe.Rounds = time.Second, time.Second, 20, 10, 1.25, 3
	err := o.validate()
	for _, want := range []string{"-instances is 9", "-duration is 1h0m0s", "-start-rate 20, -max-rate 10"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %q", err, want)
		}
	}
	o.Instances, o.Duration, o.Probe.Max = 3, 15*time.Second, 400
	if err := o.validate(); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
}

// The recorded command names the binaries relative to the repository, as
// the Makefile's absolute $(BIN) would otherwise name the machine it ran
// on; arguments outside the repository are kept as given.
func TestTheRecordedCommandNamesPathsInsideTheRepositoryRelatively(t *testing.T) {
	repo := t.TempDir()
	t.Chdir(repo)
	got := command([]string{"-shop", filepath.Join(repo, "bin", "shop"), "-ceiling", filepath.Join(repo, "bin", "ceiling") + " -rounds 3",
		"-k6=" + filepath.Join(repo, "bin", "k6"), "-out", "/var/tmp" + repo + "/report", "-record", "docs/results"})
	want := "go run ./loadtest/runner -shop bin/shop -ceiling 'bin/ceiling -rounds 3' -k6=bin/k6 -out /var/tmp" + repo + "/report -record docs/results"
	if got != want {
		t.Errorf("command:\n %s\nwant\n %s", got, want)
	}
}
