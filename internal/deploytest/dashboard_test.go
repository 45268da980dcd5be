package deploytest

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"
)

// metric is one metric family the service registers.
type metric struct {
	kind   string // Counter, Gauge, Histogram, Summary
	labels []string
	where  string
}

// registeredMetrics finds the metrics the service registers by reading its
// source: every prometheus.<Kind>Opts literal with a constant name, and the
// label names passed beside it.
//
// Reading the source, not scraping /metrics of a running shop, because a
// labelled metric (a *Vec) shows nothing in /metrics until its first
// observation: a fresh process lists no shop_lock_lost_total, and the test
// would have to lose a lease first to see it. The source lists them all.
func registeredMetrics(t *testing.T) map[string]metric {
	t.Helper()
	root := repoRoot(t)
	out := map[string]metric{}
	fset := token.NewFileSet()
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil
				}
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				lit, ok := call.Args[0].(*ast.CompositeLit)
				if !ok {
					return true
				}
				kind, ok := optsKind(lit.Type)
				if !ok {
					return true
				}
				name := optsName(lit)
				if name == "" {
					t.Logf("%s: a %sOpts without a constant name: the dashboard test cannot see it", fset.Position(lit.Pos()), kind)
					return true
				}
				m := metric{kind: kind, where: fset.Position(lit.Pos()).String()}
				if len(call.Args) > 1 {
					m.labels = stringSlice(call.Args[1])
				}
				out[name] = m
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// optsKind reads prometheus.HistogramOpts as "Histogram".
func optsKind(e ast.Expr) (string, bool) {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" {
		return "", false
	}
	kind, ok := strings.CutSuffix(sel.Sel.Name, "Opts")
	return kind, ok && kind != ""
}

// optsName joins Namespace, Subsystem and Name as prometheus.BuildFQName.
func optsName(lit *ast.CompositeLit) string {
	parts := map[string]string{}
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key, _ := kv.Key.(*ast.Ident)
		val, ok := kv.Value.(*ast.BasicLit)
		if key == nil || !ok || val.Kind != token.STRING {
			continue
		}
		s, err := strconv.Unquote(val.Value)
		if err == nil {
			parts[key.Name] = s
		}
	}
	if parts["Name"] == "" {
		return ""
	}
	var name []string
	for _, k := range []string{"Namespace", "Subsystem", "Name"} {
		if parts[k] != "" {
			name = append(name, parts[k])
		}
	}
	return strings.Join(name, "_")
}

func stringSlice(e ast.Expr) []string {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil
	}
	var out []string
	for _, el := range lit.Elts {
		if b, ok := el.(*ast.BasicLit); ok && b.Kind == token.STRING {
			if s, err := strconv.Unquote(b.Value); err == nil {
				out = append(out, s)
			}
		}
	}
	return out
}

// required are the metrics the dashboard must show: the operations doc
// promises a panel for each.
var required = []string{
	"shop_lock_wait_seconds", "shop_lock_hold_seconds", "shop_lock_lost_total",
	"shop_fenced_writes_total", "shop_http_requests_total", "shop_http_request_duration_seconds",
}

// targetLabels are labels Prometheus adds to every series at scrape time,
// and le, which every histogram bucket has.
var targetLabels = []string{"instance", "job", "le"}

var (
	metricRef  = regexp.MustCompile(`\bshop_[a-z0-9_]+\b`)
	groupLabel = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	selector   = regexp.MustCompile(`\b(shop_[a-z0-9_]+)\s*\{([^}]*)\}`)
	matchLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	labelValue = regexp.MustCompile(`label_values\(\s*[a-zA-Z0-9_:]+\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

func TestDashboardQueriesRegisteredMetrics(t *testing.T) {
	root := repoRoot(t)
	registered := registeredMetrics(t)
	if len(registered) == 0 {
		t.Fatal("found no prometheus.*Opts in cmd/ or internal/")
	}
	path := filepath.Join(root, "deploy/grafana/dashboards/shop.json")
	var dash map[string]any
	if err := json.Unmarshal([]byte(readFile(t, path)), &dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", path, err)
	}
	queries := dashboardQueries(dash)
	if len(queries) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	used := map[string]bool{}
	for _, q := range queries {
		for _, family := range checkQuery(t, q, registered) {
			used[family] = true
		}
	}
	for _, name := range required {
		if !used[name] {
			t.Errorf("the dashboard does not show %s", name)
		}
	}
}

// checkQuery reports each shop_ metric of the PromQL query q that the
// service does not register, and each label it groups or matches by that
// the metric lacks. It returns the families q uses.
func checkQuery(t *testing.T, q string, registered map[string]metric) []string {
	t.Helper()
	var families []string
	for _, name := range metricRef.FindAllString(q, -1) {
		family, ok := familyOf(name, registered)
		if !ok {
			t.Errorf("query %q: %s is not a metric the service registers", q, name)
			continue
		}
		families = append(families, family)
	}
	// A label no series has makes `sum by` collapse everything into one
	// line and a matcher select nothing: the panel shows "No data", or the
	// alert never fires, without any error.
	// A matcher selects series of its own metric; a grouping label must be
	// on every metric the query reads.
	check := func(label, family string) {
		if !slices.Contains(registered[family].labels, label) && !slices.Contains(targetLabels, label) {
			t.Errorf("query %q: %s has no label %q (it has %v)", q, family, label, registered[family].labels)
		}
	}
	for _, sel := range selector.FindAllStringSubmatch(q, -1) {
		family, ok := familyOf(sel[1], registered)
		for _, m := range matchLabel.FindAllStringSubmatch(sel[2], -1) {
			if ok {
				check(m[1], family)
			}
		}
	}
	for _, label := range queryLabels(q) {
		for _, family := range families {
			check(label, family)
		}
	}
	return families
}

// familyOf maps a series name to its metric family: a histogram's
// _bucket, _sum and _count belong to it; a counter is queried by its name.
func familyOf(name string, registered map[string]metric) (string, bool) {
	if m, ok := registered[name]; ok {
		// A bare histogram name selects nothing in PromQL.
		return name, m.kind != "Histogram"
	}
	for suffix, kinds := range map[string][]string{
		"_bucket": {"Histogram"},
		"_sum":    {"Histogram", "Summary"},
		"_count":  {"Histogram", "Summary"},
	} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if m, ok := registered[base]; ok && slices.Contains(kinds, m.kind) {
				return base, true
			}
		}
	}
	return "", false
}

// queryLabels are the labels a query groups by or lists the values of.
func queryLabels(q string) []string {
	var out []string
	for _, m := range groupLabel.FindAllStringSubmatch(q, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	for _, m := range labelValue.FindAllStringSubmatch(q, -1) {
		out = append(out, m[1])
	}
	return out
}

// dashboardQueries collects every PromQL string of the dashboard: panel
// targets (also inside collapsed rows) and template variable queries.
func dashboardQueries(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
				out = append(out, s)
			}
			if k == "query" {
				if s, ok := x.(string); ok {
					out = append(out, s)
				}
			}
			out = append(out, dashboardQueries(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, dashboardQueries(x)...)
		}
	}
	return out
}

// TestGrafanaProvisioning checks the chain compose → provisioning →
// dashboard: the dashboards folder the provider reads is the one compose
// mounts, and every panel's data source is the provisioned Prometheus.
func TestGrafanaProvisioning(t *testing.T) {
	root := repoRoot(t)
	p := loadCompose(t, nil)
	grafana := p.Services["grafana"]

	var provider struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	unmarshalYAML(t, filepath.Join(root, "deploy/grafana/provisioning/dashboards/shop.yml"), &provider)
	if len(provider.Providers) != 1 {
		t.Fatalf("%d dashboard providers, want 1", len(provider.Providers))
	}
	mounted := map[string]string{} // container path -> repository path
	for _, v := range grafana.Volumes {
		rel, _ := filepath.Rel(root, v.Source)
		mounted[v.Target] = rel
	}
	if got := mounted[provider.Providers[0].Options.Path]; got != "deploy/grafana/dashboards" {
		t.Errorf("the provider reads %s, where compose mounts %q, not deploy/grafana/dashboards",
			provider.Providers[0].Options.Path, got)
	}
	if got := mounted["/etc/grafana/provisioning"]; got != "deploy/grafana/provisioning" {
		t.Errorf("compose mounts %q as Grafana's provisioning", got)
	}

	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	unmarshalYAML(t, filepath.Join(root, "deploy/grafana/provisioning/datasources/prometheus.yml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" {
		t.Fatalf("want one prometheus data source, have %+v", ds.Datasources)
	}
	if want := "http://prometheus:9090"; ds.Datasources[0].URL != want {
		t.Errorf("data source URL %s, want %s", ds.Datasources[0].URL, want)
	}
	if _, ok := p.Services["prometheus"]; !ok {
		t.Error("no prometheus service for the data source")
	}

	var dash map[string]any
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(root, "deploy/grafana/dashboards/shop.json"))), &dash); err != nil {
		t.Fatal(err)
	}
	uids := map[string]bool{}
	collectDatasourceUIDs(dash, uids)
	for uid := range uids {
		if uid != ds.Datasources[0].UID {
			t.Errorf("the dashboard uses data source %q; the provisioned one is %q", uid, ds.Datasources[0].UID)
		}
	}
	if len(uids) == 0 {
		t.Error("the dashboard names no data source uid")
	}
}

func collectDatasourceUIDs(v any, uids map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		if d, ok := v["datasource"].(map[string]any); ok {
			if uid, ok := d["uid"].(string); ok {
				uids[uid] = true
			}
		}
		for _, x := range v {
			collectDatasourceUIDs(x, uids)
		}
	case []any:
		for _, x := range v {
			collectDatasourceUIDs(x, uids)
		}
	}
}

func unmarshalYAML(t *testing.T, path string, v any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(readFile(t, path)), v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// prometheusTargets lists the static targets of job in a Prometheus config.
func prometheusTargets(t *testing.T, path, job string) []string {
	t.Helper()
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	unmarshalYAML(t, path, &cfg)
	var out []string
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName == job {
			for _, s := range sc.StaticConfigs {
				out = append(out, s.Targets...)
			}
		}
	}
	return out
}

// TestGrafanaTraceSource: the trace data source points at the compose
// service the shop instances export to.
func TestGrafanaTraceSource(t *testing.T) {
	root := repoRoot(t)
	var ds struct {
		Datasources []struct {
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	unmarshalYAML(t, filepath.Join(root, "deploy/grafana/provisioning/datasources/jaeger.yml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "jaeger" {
		t.Fatalf("want one jaeger data source, have %+v", ds.Datasources)
	}
	p := loadCompose(t, nil)
	if _, ok := p.Services["jaeger"]; !ok {
		t.Fatal("no jaeger service for the data source")
	}
	for _, s := range shopServices(p) {
		if got := envOf(s)["OTEL_EXPORTER_OTLP_ENDPOINT"]; got != "http://jaeger:4318" {
			t.Errorf("%s exports traces to %q, want Jaeger's OTLP/HTTP http://jaeger:4318", s.Name, got)
		}
	}
	if !strings.HasPrefix(ds.Datasources[0].URL, "http://jaeger:16686") {
		t.Errorf("data source URL %s, want Jaeger's query port", ds.Datasources[0].URL)
	}
}
