package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/lockbench/shop/loadtest/runner/report"
)

// describeMachine is what the numbers are measured on: CPUs and their
// model, memory, OS, Go and k6.
func describeMachine(ctx context.Context, k6 string) report.Machine {
	m := report.Machine{CPUs: runtime.NumCPU(), CPU: "unknown", Memory: "unknown", OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version()}
	if v := procField("/proc/cpuinfo", "model name", ":"); v != "" {
		m.CPU = v
	}
	if f := strings.Fields(procField("/proc/meminfo", "MemTotal", ":")); len(f) > 0 {
		if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
			m.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	if v := procField("/etc/os-release", "PRETTY_NAME", "="); v != "" {
		m.OS = strings.Trim(v, `"`)
	}
	if out, err := output(ctx, k6, "version"); err == nil {
		m.K6 = out
	}
	return m
}

// procField is the value of the first "key<sep>value" line of a file.
func procField(path, key, sep string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, sep); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// commit is the code the run measured: the checked-out commit, marked
// dirty when the tree has changes.
func commit(ctx context.Context) string {
	c, err := output(ctx, "git", "describe", "--always", "--dirty", "--abbrev=12")
	if err != nil {
		return ""
	}
	return c
}

func output(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	return strings.TrimSpace(string(out)), err
}
