package deploytest

import (
	"context"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/config"
)

// shopImage is the image the Dockerfile builds; the services running it are
// the ones whose environment config must understand.
const shopImage = "lockbench/shop:local"

// oneShot are the services that run to completion instead of staying up:
// they need no healthcheck, must not restart, and whoever waits for them
// waits for service_completed_successfully.
var oneShot = []string{"migrate", "redis-cluster-init", "k6"}

// loadCompose loads docker-compose.yml as `docker compose` would with env
// as the only environment (no .env file, nothing from this process), every
// profile enabled, interpolation on.
func loadCompose(t *testing.T, env map[string]string) *types.Project {
	t.Helper()
	root := repoRoot(t)
	// The secrets make up writes to .env; a test that wants them unset
	// passes them empty.
	full := map[string]string{"SHOP_JWT_SECRET": strings.Repeat("j", 32), "SHOP_ADMIN_TOKEN": strings.Repeat("a", 32)}
	for k, v := range env {
		full[k] = v
	}
	var list []string
	for k, v := range full {
		if v != "" {
			list = append(list, k+"="+v)
		}
	}
	opts, err := cli.NewProjectOptions(
		[]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root),
		cli.WithName("shop"),
		cli.WithEnv(list),
		cli.WithInterpolation(true),
		cli.WithProfiles([]string{"*"}),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker compose would refuse docker-compose.yml (env %v): %v", env, err)
	}
	return p
}

// shopServices are the services that run the shop binary.
func shopServices(p *types.Project) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, name := range p.ServiceNames() {
		if s := p.Services[name]; s.Image == shopImage {
			out = append(out, s)
		}
	}
	return out
}

// consumers are the shop consume services: they stay up and are scraped,
// but serve no API, so nginx does not balance them.
var consumers = []string{"consume-1", "consume-2"}

// running are the shop services that stay up: the API instances and the
// consumers (not the migrate job).
func running(p *types.Project) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, s := range shopServices(p) {
		if !slices.Contains(oneShot, s.Name) {
			out = append(out, s)
		}
	}
	return out
}

// serving are the shop services that serve the API.
func serving(p *types.Project) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, s := range running(p) {
		if !slices.Contains(consumers, s.Name) {
			out = append(out, s)
		}
	}
	return out
}

func envOf(s types.ServiceConfig) map[string]string {
	out := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			out[k] = *v
		}
	}
	return out
}

func TestComposeLoadsWithAndWithoutBackend(t *testing.T) {
	cases := map[string]string{"unset": ""}
	for _, b := range config.Backends {
		cases[b] = b
	}
	for name, backend := range cases {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{}
			want := "redis" // the documented default
			if backend != "" {
				env["SHOP_LOCK_BACKEND"] = backend
				want = backend
			}
			p := loadCompose(t, env)
			shops := serving(p)
			if len(shops) != 3 {
				t.Fatalf("%d shop instances serve traffic, want 3", len(shops))
			}
			for _, s := range shopServices(p) {
				if got := envOf(s)["SHOP_LOCK_BACKEND"]; got != want {
					t.Errorf("%s: SHOP_LOCK_BACKEND=%q, want %q", s.Name, got, want)
				}
			}
		})
	}
}

func TestComposeDependencies(t *testing.T) {
	p := loadCompose(t, nil)
	for _, name := range p.ServiceNames() {
		for dep, d := range p.Services[name].DependsOn {
			if _, ok := p.Services[dep]; !ok {
				t.Errorf("%s depends on %s, which is not a service", name, dep)
				continue
			}
			want := types.ServiceConditionHealthy
			if slices.Contains(oneShot, dep) {
				want = types.ServiceConditionCompletedSuccessfully
			}
			if d.Condition != want {
				t.Errorf("%s waits for %s with %q, want %q", name, dep, d.Condition, want)
			}
		}
	}
}

func TestComposeHealthchecks(t *testing.T) {
	p := loadCompose(t, nil)
	for _, name := range oneShot {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("one-shot job %s is not in the file: update oneShot", name)
		}
	}
	for _, name := range p.ServiceNames() {
		checkReadinessAndRestart(t, name, p.Services[name])
	}
	// Distroless has no shell: the shop healthcheck must be the exec form
	// of the binary itself, the path the Dockerfile copies it to.
	bin := dockerfileBinary(t)
	for _, s := range running(p) {
		if got := []string(s.HealthCheck.Test); len(got) < 2 || got[0] != "CMD" || got[1] != bin {
			t.Errorf("%s healthcheck is %q, want [CMD %s ...] (no shell in the image)", s.Name, got, bin)
		}
	}
}

// checkReadinessAndRestart: a one-shot job stays finished; any other
// service says when it is ready and comes back unless stopped.
func checkReadinessAndRestart(t *testing.T, name string, s types.ServiceConfig) {
	t.Helper()
	if slices.Contains(oneShot, name) {
		if s.Restart != "" && s.Restart != types.RestartPolicyNo {
			t.Errorf("one-shot job %s has restart %q: a job that finished must stay finished", name, s.Restart)
		}
		return
	}
	hc := s.HealthCheck
	if hc == nil || hc.Disable || len(hc.Test) == 0 || hc.Test[0] == "NONE" {
		t.Errorf("%s has no healthcheck: nothing can wait for it to be ready", name)
	}
	if s.Restart != types.RestartPolicyUnlessStopped {
		t.Errorf("%s has restart %q, want unless-stopped", name, s.Restart)
	}
}

// TestComposeShopEnvironment checks every SHOP_* variable given to the shop
// services against the variables config.Load actually reads: a typo or a
// renamed variable would otherwise be ignored silently and the default used.
func TestComposeShopEnvironment(t *testing.T) {
	read := map[string]bool{}
	_, _ = config.Load(func(name string) string { read[name] = true; return "" })
	if len(read) == 0 {
		t.Fatal("config.Load read no variable")
	}
	p := loadCompose(t, nil)
	for _, s := range shopServices(p) {
		for name := range envOf(s) {
			if strings.HasPrefix(name, "SHOP_") && !read[name] {
				t.Errorf("%s sets %s, which internal/config does not read", s.Name, name)
			}
		}
	}
}

// TestComposeEveryBackendConfigured loads the shop services' environment
// through config.Load for every backend name it accepts, and follows every
// address to the service it names.
func TestComposeEveryBackendConfigured(t *testing.T) {
	for _, backend := range config.Backends {
		t.Run(backend, func(t *testing.T) {
			p := loadCompose(t, map[string]string{"SHOP_LOCK_BACKEND": backend})
			for _, s := range shopServices(p) {
				env := envOf(s)
				cfg, err := config.Load(func(name string) string { return env[name] })
				if err != nil {
					t.Fatalf("%s: config refuses the compose environment: %v", s.Name, err)
				}
				// Three instances on an embedded Redis or a private SQLite
				// file would each lock and count alone: every lock would
				// "work" and the stock would still be oversold.
				if cfg.EmbeddedRedis() {
					t.Errorf("%s: SHOP_REDIS_ADDRS is empty: each instance would run its own Redis", s.Name)
				}
				if cfg.MySQLDSN == "" {
					t.Errorf("%s: SHOP_MYSQL_DSN is empty: each instance would have its own SQLite", s.Name)
				}
				checkAddresses(t, p, s, cfg)
			}
		})
	}
}

// TestComposeRedisCluster runs the shop services against the cluster, as
// docs/operations.md says to.
func TestComposeRedisCluster(t *testing.T) {
	const nodes = "redis-cluster-1:6379,redis-cluster-2:6379,redis-cluster-3:6379"
	p := loadCompose(t, map[string]string{"SHOP_REDIS_ADDRS": nodes})
	for _, s := range shopServices(p) {
		env := envOf(s)
		cfg, err := config.Load(func(name string) string { return env[name] })
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		for _, target := range checkAddresses(t, p, s, cfg)["SHOP_REDIS_ADDRS"] {
			if !clustered(target) {
				t.Errorf("%s: %s is not a cluster node", s.Name, target.Name)
			}
		}
	}
	init := p.Services["redis-cluster-init"]
	if got := envOf(init)["CLUSTER_NODES"]; strings.Join(strings.Fields(got), ",") != nodes {
		t.Errorf("redis-cluster-init joins %q, the docs point shop at %q", got, nodes)
	}
}

// TestComposeLockRedisKeepsLocks: backend redis's locks live on a Redis
// of their own that neither evicts a key nor forgets a write at a restart
// (docs/operations.md).
func TestComposeLockRedisKeepsLocks(t *testing.T) {
	p := loadCompose(t, nil)
	for _, s := range shopServices(p) {
		env := envOf(s)
		cfg, err := config.Load(func(name string) string { return env[name] })
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		reached := checkAddresses(t, p, s, cfg)
		if len(reached["SHOP_LOCK_REDIS_ADDRS"]) == 0 {
			t.Fatalf("%s: SHOP_LOCK_REDIS_ADDRS reaches no Redis: the locks share the main one", s.Name)
		}
		for _, target := range reached["SHOP_LOCK_REDIS_ADDRS"] {
			for _, main := range reached["SHOP_REDIS_ADDRS"] {
				if main.Name == target.Name {
					t.Errorf("%s: the lock Redis %s is the main Redis", s.Name, target.Name)
				}
			}
			if policy := orDefault(flagValue(target.Command, "--maxmemory-policy"), "noeviction"); policy != "noeviction" {
				t.Errorf("%s: maxmemory-policy %s may evict held locks; want noeviction", target.Name, policy)
			}
			if flagValue(target.Command, "--appendonly") != "yes" {
				t.Errorf("%s: no append-only file: a restart would free every held lock", target.Name)
			}
		}
	}
}

// checkAddresses follows each address of cfg to a service of p that runs
// the right server on that port and that s waits for. It returns the
// services each variable reaches.
func checkAddresses(t *testing.T, p *types.Project, s types.ServiceConfig, cfg config.Config) map[string][]types.ServiceConfig {
	t.Helper()
	dsn, err := mysql.ParseDSN(cfg.MySQLDSN)
	if err != nil {
		t.Fatalf("%s: SHOP_MYSQL_DSN: %v", s.Name, err)
	}
	vars := []addressVar{
		{"SHOP_MYSQL_DSN", "mariadb", []string{dsn.Addr}},
		{"SHOP_REDIS_ADDRS", "redis", cfg.RedisAddrs},
		{"SHOP_LOCK_REDIS_ADDRS", "redis", cfg.LockRedisAddrs},
		{"SHOP_REDLOCK_ADDRS", "redis", cfg.RedlockAddrs},
		{"SHOP_ZK_ADDRS", "zookeeper", cfg.ZKAddrs},
		{"SHOP_ETCD_ENDPOINTS", "etcd", cfg.EtcdEndpoints},
		{"SHOP_MEMCACHED_ADDRS", "memcached", cfg.MemcachedAddrs},
	}
	reached := map[string][]types.ServiceConfig{}
	for _, v := range vars {
		if len(v.addrs) == 0 {
			t.Errorf("%s: %s is empty: the backends that need it would not start", s.Name, v.name)
		}
		for _, addr := range v.addrs {
			if target, ok := checkAddress(t, p, s, v, addr); ok {
				reached[v.name] = append(reached[v.name], target)
			}
		}
	}
	checkRedlockMastersIndependent(t, s, reached)
	return reached
}

// addressVar is one variable of addresses and the server it must name.
type addressVar struct {
	name   string
	server string // image repository
	addrs  []string
}

// checkAddress follows addr of v to the service it names, and checks that
// the service runs v's server on that port and that s waits for it. It
// returns the service, or false if addr names none.
func checkAddress(t *testing.T, p *types.Project, s types.ServiceConfig, v addressVar, addr string) (types.ServiceConfig, bool) {
	t.Helper()
	host, port, err := splitAddr(addr)
	if err != nil {
		t.Errorf("%s: %s: %v", s.Name, v.name, err)
		return types.ServiceConfig{}, false
	}
	target, ok := p.Services[host]
	if !ok {
		t.Errorf("%s: %s names %s, which is not a service", s.Name, v.name, host)
		return types.ServiceConfig{}, false
	}
	if got := imageRepo(target.Image); got != v.server {
		t.Errorf("%s: %s names %s, which runs %s, not %s", s.Name, v.name, host, got, v.server)
	}
	if want := listenPort(t, target); port != want {
		t.Errorf("%s: %s names %s:%d, but %s listens on %d", s.Name, v.name, host, port, host, want)
	}
	// migrate only needs MySQL; what it is given beyond that is
	// there so that config.Load accepts the same environment.
	waits := s.Name != "migrate" || v.server == "mariadb"
	if _, ok := s.DependsOn[host]; waits && !ok && !clustered(target) {
		t.Errorf("%s does not wait for %s, which %s names", s.Name, host, v.name)
	}
	if waits && clustered(target) {
		if _, ok := s.DependsOn["redis-cluster-init"]; !ok {
			t.Errorf("%s uses cluster node %s without waiting for redis-cluster-init", s.Name, host)
		}
	}
	return target, true
}

// checkRedlockMastersIndependent: Redlock's safety argument needs
// independent masters: one of them being also the main Redis, a cluster
// node or named twice would let one failure count as several.
func checkRedlockMastersIndependent(t *testing.T, s types.ServiceConfig, reached map[string][]types.ServiceConfig) {
	t.Helper()
	seen := map[string]bool{}
	for _, target := range slices.Concat(reached["SHOP_REDIS_ADDRS"], reached["SHOP_LOCK_REDIS_ADDRS"]) {
		seen[target.Name] = true
	}
	for _, target := range reached["SHOP_REDLOCK_ADDRS"] {
		if seen[target.Name] || clustered(target) {
			t.Errorf("%s: redlock master %s is not an independent Redis", s.Name, target.Name)
		}
		seen[target.Name] = true
	}
	if n := len(reached["SHOP_REDLOCK_ADDRS"]); n < 3 {
		t.Errorf("%s: %d redlock masters; a majority of fewer than 3 tolerates no failure", s.Name, n)
	}
}

// splitAddr reads host:port or an etcd-style URL (http://host:port).
func splitAddr(addr string) (string, int, error) {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return "", 0, err
		}
		addr = u.Host
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return host, port, err
}

// imageRepo is the last path element of an image name without its tag:
// "quay.io/coreos/etcd:v3.5.21" is "etcd".
func imageRepo(image string) string {
	image = image[strings.LastIndex(image, "/")+1:]
	name, _, _ := strings.Cut(image, ":")
	return name
}

func clustered(s types.ServiceConfig) bool {
	return flagValue(s.Command, "--cluster-enabled") == "yes"
}

// flagValue is the argument after flag in cmd ("--port 7000"), or "".
func flagValue(cmd []string, flag string) string {
	for i, arg := range cmd {
		if arg == flag && i+1 < len(cmd) {
			return cmd[i+1]
		}
		if v, ok := strings.CutPrefix(arg, flag+"="); ok {
			return v
		}
	}
	return ""
}

// listenPort is the port the server in s listens on: its image's default
// unless its command or environment changes it.
func listenPort(t *testing.T, s types.ServiceConfig) int {
	t.Helper()
	var port string
	switch imageRepo(s.Image) {
	case "redis":
		port = orDefault(flagValue(s.Command, "--port"), "6379")
	case "mariadb":
		port = orDefault(flagValue(s.Command, "--port"), "3306")
	case "zookeeper":
		port = orDefault(envOf(s)["ZOO_PORT"], "2181")
	case "memcached":
		port = orDefault(flagValue(s.Command, "-p"), "11211")
	case "etcd":
		urls := envOf(s)["ETCD_LISTEN_CLIENT_URLS"]
		if urls == "" {
			port = "2379"
		} else if _, p, err := splitAddr(strings.Split(urls, ",")[0]); err == nil {
			port = strconv.Itoa(p)
		}
	default:
		t.Fatalf("%s runs %s: teach listenPort its port", s.Name, s.Image)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("%s: port %q: %v", s.Name, port, err)
	}
	return n
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func TestComposePublishedPortsUnique(t *testing.T) {
	p := loadCompose(t, nil)
	owner := map[string]string{}
	for _, name := range p.ServiceNames() {
		for _, port := range p.Services[name].Ports {
			if port.Published == "" {
				continue
			}
			// 127.0.0.1:8080 and 0.0.0.0:8080 clash too: count by port.
			key := port.Published + "/" + orDefault(port.Protocol, "tcp")
			if other, dup := owner[key]; dup {
				t.Errorf("host port %s published by both %s and %s", key, other, name)
			}
			owner[key] = name
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %s on %q: bind it to 127.0.0.1 (Grafana lets anyone view, the dev tokens are public)",
					name, port.Published, port.HostIP)
			}
		}
	}
	for _, want := range []string{"lb", "prometheus", "grafana"} {
		if !slices.Contains(mapsValues(owner), want) {
			t.Errorf("%s publishes no port: docs/operations.md tells people to open it", want)
		}
	}
}

func mapsValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestComposeMountsExist checks the bind mounts from deploy/ point at files
// of the repository: docker would mount a missing one as an empty
// directory and the service would start on its defaults, silently.
func TestComposeMountsExist(t *testing.T) {
	root := repoRoot(t)
	p := loadCompose(t, nil)
	for _, name := range p.ServiceNames() {
		for _, v := range p.Services[name].Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			rel, err := filepath.Rel(root, v.Source)
			if err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s mounts %s, outside the repository", name, v.Source)
				continue
			}
			if !v.ReadOnly {
				t.Errorf("%s mounts %s read-write", name, rel)
			}
			if _, err := statPath(v.Source); err != nil {
				if strings.HasPrefix(rel, "deploy") {
					t.Errorf("%s mounts %s: %v", name, rel, err)
				} else {
					t.Logf("%s mounts %s, not in the tree yet: %v", name, rel, err)
				}
			}
		}
	}
}

// TestComposeScrapesAndBalancesEveryInstance checks that Prometheus and
// nginx each know exactly the shop instances, on the port they listen on.
func TestComposeScrapesAndBalancesEveryInstance(t *testing.T) {
	root := repoRoot(t)
	p := loadCompose(t, nil)
	want, _ := shopInstanceAddrs(t, p, serving(p))
	_, wantScraped := shopInstanceAddrs(t, p, running(p))

	scraped := prometheusTargets(t, filepath.Join(root, "deploy/prometheus/prometheus.yml"), "shop")
	slices.Sort(scraped)
	if !slices.Equal(scraped, wantScraped) {
		t.Errorf("Prometheus scrapes %v, the shop instances serve /metrics on %v", scraped, wantScraped)
	}

	nginx := readFile(t, filepath.Join(root, "deploy/nginx/nginx.conf"))
	if balanced := nginxUpstream(t, nginx); !slices.Equal(balanced, want) {
		t.Errorf("nginx balances %v, the shop instances are %v", balanced, want)
	}
	checkLoadBalancer(t, p, nginx)

	// k6 reaches nginx on loopback from inside its network namespace.
	k6 := p.Services["k6"]
	if k6.NetworkMode != "service:lb" {
		t.Errorf("k6 runs in network %q, want service:lb (the scripts accept only loopback URLs)", k6.NetworkMode)
	}
	if got, want := envOf(k6)["SHOP_URLS"], "http://127.0.0.1:8080"; got != want || !strings.Contains(nginx, "listen 8080;") {
		t.Errorf("k6 SHOP_URLS is %q, want %q where nginx listens", got, want)
	}
}

// shopInstanceAddrs are services as host:port, sorted: where each serves
// HTTP, and where each serves /metrics.
func shopInstanceAddrs(t *testing.T, p *types.Project, services []types.ServiceConfig) (api, metrics []string) {
	t.Helper()
	for _, s := range services {
		_, port, err := net.SplitHostPort(envOf(s)["SHOP_HTTP_ADDR"])
		if err != nil {
			t.Fatalf("%s: SHOP_HTTP_ADDR: %v", s.Name, err)
		}
		api = append(api, s.Name+":"+port)
		// /metrics is served on SHOP_METRICS_ADDR only: unset, on the
		// container's loopback, where Prometheus cannot scrape it.
		addr := envOf(s)["SHOP_METRICS_ADDR"]
		host, metricsPort, err := net.SplitHostPort(addr)
		switch {
		case err != nil:
			t.Fatalf("%s: SHOP_METRICS_ADDR %q: %v (unset, shop listens on %s, which Prometheus cannot reach)",
				s.Name, addr, err, config.DefaultMetricsAddr)
		case metricsPort == port || loopbackHost(host):
			t.Errorf("%s: SHOP_METRICS_ADDR %q: want a port of its own, not the public API port, on an interface Prometheus reaches", s.Name, addr)
		}
		metrics = append(metrics, s.Name+":"+metricsPort)
	}
	slices.Sort(api)
	slices.Sort(metrics)
	return api, metrics
}

// nginxUpstream are the servers of nginx.conf's shop upstream, sorted.
func nginxUpstream(t *testing.T, nginx string) []string {
	t.Helper()
	upstream := regexp.MustCompile(`(?s)upstream shop \{(.*?)\}`).FindStringSubmatch(nginx)
	if upstream == nil {
		t.Fatal("deploy/nginx/nginx.conf has no upstream shop block")
	}
	var balanced []string
	for _, m := range regexp.MustCompile(`(?m)^\s*server\s+(\S+)`).FindAllStringSubmatch(upstream[1], -1) {
		balanced = append(balanced, m[1])
	}
	slices.Sort(balanced)
	return balanced
}

// checkLoadBalancer: lb waits for every instance to be healthy and
// publishes the port nginx listens on.
func checkLoadBalancer(t *testing.T, p *types.Project, nginx string) {
	t.Helper()
	lb := p.Services["lb"]
	for _, s := range serving(p) {
		if d, ok := lb.DependsOn[s.Name]; !ok || d.Condition != types.ServiceConditionHealthy {
			t.Errorf("lb does not wait for %s to be healthy", s.Name)
		}
	}
	for _, port := range lb.Ports {
		if port.Target != 8080 || !strings.Contains(nginx, "listen 8080;") {
			t.Errorf("lb publishes container port %d; nginx.conf must listen on it", port.Target)
		}
	}
}

// TestComposeNeedsSecrets: the stack runs in production, so compose itself
// refuses to start it without secrets of its own (make up writes them to
// .env), rather than shop failing in a restart loop.
func TestComposeNeedsSecrets(t *testing.T) {
	root := repoRoot(t)
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root), cli.WithName("shop"), cli.WithEnv(nil), cli.WithInterpolation(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := opts.LoadProject(context.Background()); err == nil || !strings.Contains(err.Error(), "SHOP_JWT_SECRET") {
		t.Errorf("compose loads without SHOP_JWT_SECRET (%v); want it refused", err)
	}
	for _, s := range shopServices(loadCompose(t, nil)) {
		if got := envOf(s)["SHOP_ENV"]; got != "production" {
			t.Errorf("%s: SHOP_ENV=%q by default, want production", s.Name, got)
		}
	}
}

// pinned is an image reference with a full version (1.2.3, v1.2.3, maybe a
// variant suffix) or a digest: a floating tag such as 7.4 or latest
// changes under a stack that was tested with another release.
var pinned = regexp.MustCompile(`(:v?\d+\.\d+\.\d+(-[a-z0-9.]+)?(@sha256:[0-9a-f]{64})?|@sha256:[0-9a-f]{64})$`)

func TestComposeImagesPinned(t *testing.T) {
	p := loadCompose(t, nil)
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if s.Build != nil {
			continue // built here, from the pinned Dockerfile
		}
		if !pinned.MatchString(s.Image) {
			t.Errorf("%s runs %s: pin a full version (or a digest)", name, s.Image)
		}
	}
}

// loopbackHost reports whether a listen address's host accepts
// connections from the machine (or container) itself only.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
