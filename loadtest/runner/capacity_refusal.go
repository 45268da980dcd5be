package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lockbench/shop/loadtest/runner/capacity"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// refuserCommand is the bare 503 server, built beside -shop by make
// loadtest-shop.
func refuserCommand(o options) string { return filepath.Join(filepath.Dir(o.shop), "refuser") }

// measureBareRefusal starts the bare 503 server (loadtest/refuser) and
// floods it for c.Rounds steps: the median of its process CPU per request,
// in µs, timed the way the rows' CPU per refusal is.
func measureBareRefusal(ctx context.Context, log *slog.Logger, command string, c capacity.Options) (float64, error) {
	cmd := exec.CommandContext(ctx, command)
	cmd.SysProcAttr = childAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("bare 503 server: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	url, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("bare 503 server printed no address: %w", err)
	}
	b := capacity.NewBuyer([]string{strings.TrimSpace(url)}, []string{"none"}, capacitySKU)
	var per []float64
	for range max(c.Rounds, 1) {
		before := processCPU(cmd.Process.Pid)
		s := b.Offer(ctx, report.BareRefusalRate, c.Step, c.SLO, c.MaxErrors)
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if s.Busy != s.Offered {
			return 0, fmt.Errorf("bare 503 server answered %d of %d with 503: %s", s.Busy, s.Offered, s.FirstError)
		}
		per = append(per, (processCPU(cmd.Process.Pid)-before).Seconds()*1e6/float64(s.Busy))
		log.Info("bare refusal step", "rate", report.BareRefusalRate, "cpu_us_per_refusal", fmt.Sprintf("%.1f", per[len(per)-1]))
	}
	slices.Sort(per)
	return per[(len(per)-1)/2], nil
}
