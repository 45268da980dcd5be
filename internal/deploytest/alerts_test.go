package deploytest

import (
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lockbench/shop/internal/testenv"
)

// alertRules is deploy/prometheus/alerts.yml, as far as these tests read it.
type alertRules struct {
	Groups []struct {
		Rules []struct {
			Alert string `yaml:"alert"`
			Expr  string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRulesPromtool runs Prometheus's own checker and the rules' unit
// tests (alerts_test.yml: each alert with series that must fire it and
// series that must not). promtool comes from Debian's prometheus package,
// which scripts/testenv.sh installs; CI fails without it.
func TestAlertRulesPromtool(t *testing.T) {
	promtool := testenv.Require(t, "SHOP_TEST_PROMTOOL")
	dir := filepath.Join(repoRoot(t), "deploy", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"check", "config", "--syntax-only", "prometheus.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// TestAlertRulesQueryRegisteredMetrics: an alert on a metric or label the
// service does not export never fires, and nothing says so. Every alert
// must also have a unit test.
func TestAlertRulesQueryRegisteredMetrics(t *testing.T) {
	root := repoRoot(t)
	registered := registeredMetrics(t)
	var rules alertRules
	unmarshalYAML(t, filepath.Join(root, "deploy/prometheus/alerts.yml"), &rules)
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	unmarshalYAML(t, filepath.Join(root, "deploy/prometheus/alerts_test.yml"), &tests)
	var tested []string
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			tested = append(tested, a.Alertname)
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			checkQuery(t, r.Expr, registered)
			if !slices.Contains(tested, r.Alert) {
				t.Errorf("alert %s has no test in alerts_test.yml", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("alerts.yml has no rules")
	}
	var prom struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	unmarshalYAML(t, filepath.Join(root, "deploy/prometheus/prometheus.yml"), &prom)
	mounted := map[string]string{}
	for _, v := range loadCompose(t, nil).Services["prometheus"].Volumes {
		rel, _ := filepath.Rel(root, v.Source)
		mounted[v.Target] = rel
	}
	if len(prom.RuleFiles) != 1 || mounted[prom.RuleFiles[0]] != "deploy/prometheus/alerts.yml" {
		t.Errorf("prometheus.yml loads %v; compose mounts %v: want deploy/prometheus/alerts.yml loaded", prom.RuleFiles, mounted)
	}
}
