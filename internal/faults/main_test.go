package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/internal/shoptest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	shoptest.Cleanup()
	printTable(os.Stdout)
	printEventTable(os.Stdout)
	printDeliveryTable(os.Stdout)
	if path := os.Getenv("SHOP_FAULTS_REPORT"); path != "" {
		if f, err := os.Create(path); err == nil {
			printTable(f)
			printEventTable(f)
			printDeliveryTable(f)
			f.Close()
		}
	}
	os.Exit(code)
}

// full reports whether the long form runs: every lock server restarted,
// the Sentinel failover and the partition, which take minutes. A developer's
// `go test ./...` runs the short form; SHOP_FAULTS=full (make faults) and CI,
// where nothing may be skipped, run it all.
func full() bool { return os.Getenv("SHOP_FAULTS") == "full" || os.Getenv("CI") == "true" }

func needFull(t *testing.T) {
	t.Helper()
	if !full() {
		t.Skip("long form only: SHOP_FAULTS=full (make faults); CI runs it")
	}
}

// crossProcess are the registered backends that exclude between
// processes: every fault here needs at least two shop processes.
func crossProcess() []string {
	var names []string
	for _, b := range registry.CrossProcess() {
		names = append(names, b.Name)
	}
	return names
}

// fences reports whether backend's grants carry a fencing token, so that
// the stores refuse a stale holder's write (redlock and memcached cannot:
// docs/backends-redlock-memcached-unsafe.md).
func fences(backend string) bool {
	b, _ := registry.Lookup(backend)
	return b.Capabilities.Fencing
}

// sessionSlack is how long a dead holder's grant of backend may outlive
// its TTL: the session timeout of the session-based backends, memcached's
// whole-second clock.
func sessionSlack(backend string) time.Duration {
	b, _ := registry.Lookup(backend)
	return b.Slack
}

// row is one line of the table.
type row struct {
	Fault, Backend string
	// Overlap counts grants of one key that were live at once (a holder
	// still inside its critical section when another was granted).
	Overlap int
	// Fenced counts writes a store refused with ErrFenced.
	Fenced int
	// LostCents is the audit's balance drift: money a lost update made
	// vanish or appear.
	LostCents int64
	// Oversold is the audit's oversold units.
	Oversold int64
	// Recovery is how long the key stayed unusable after the fault.
	Recovery time.Duration
	// Linearizable is porcupine's verdict on the client-side histories
	// ("-" when the fault recorded none).
	Linearizable string
	// Stale is what happened to the stale (paused, crashed, cut off)
	// holder's request.
	Stale string
}

var table struct {
	mu   sync.Mutex
	rows []row
}

func report(r row) {
	table.mu.Lock()
	defer table.mu.Unlock()
	table.rows = append(table.rows, r)
}

func printTable(w io.Writer) {
	table.mu.Lock()
	defer table.mu.Unlock()
	if len(table.rows) == 0 {
		return
	}
	rows := append([]row(nil), table.rows...)
	sort.SliceStable(rows, func(i, j int) bool {
		if ri, rj := faultRank(rows[i].Fault), faultRank(rows[j].Fault); ri != rj {
			return ri < rj
		}
		if rows[i].Fault != rows[j].Fault {
			return rows[i].Fault < rows[j].Fault
		}
		return rows[i].Backend < rows[j].Backend
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FAULT\tBACKEND\tOVERLAP\tFENCED\tLOST CENTS\tOVERSOLD\tUSABLE AGAIN\tLINEARIZABLE\tSTALE HOLDER")
	for _, r := range rows {
		rec := "-"
		if r.Recovery > 0 {
			rec = r.Recovery.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", r.Fault, r.Backend, r.Overlap, r.Fenced,
			r.LostCents, r.Oversold, rec, orDash(r.Linearizable), orDash(r.Stale))
	}
	tw.Flush()
}

// faultRank is the number a fault's name starts with (99 for none).
func faultRank(f string) int {
	num, _, _ := strings.Cut(f, " ")
	n, err := strconv.Atoi(num)
	if err != nil {
		return 99
	}
	return n
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// lockEnv is the part of a shop process's environment that points backend
// at the shared test servers. The mysql backends need nothing more: newRig
// gives every rig a private database.
func lockEnv(t *testing.T, backend string) map[string]string {
	t.Helper()
	env := map[string]string{"SHOP_LOCK_BACKEND": backend}
	b, ok := registry.Lookup(backend)
	if !ok {
		t.Fatalf("backend %q is not registered", backend)
	}
	if srv := b.Server; srv.Setting != "" && srv.Kind != registry.MariaDB {
		env[srv.Setting] = shoptest.Env(t, srv.TestEnv)
	}
	return env
}

// rig is a set of shop processes sharing one database and one lock
// namespace, and a client that records every account operation.
type rig struct {
	t      *testing.T
	bin    string
	env    map[string]string
	secret string
	admin  string
	client *shoptest.Client
	hist   *history
}

// newRig prepares the environment of the shop processes: production mode
// with fresh secrets, a private database on the shared MariaDB unless env
// names one, a unique key prefix, and env on top.
func newRig(t *testing.T, env map[string]string) *rig {
	t.Helper()
	r := &rig{
		t: t, bin: shoptest.Build(t), secret: shoptest.Random(32), admin: shoptest.Random(16),
		client: shoptest.NewClient(64), hist: newHistory(),
	}
	t.Cleanup(r.client.Close)
	r.env = map[string]string{
		"SHOP_ENV":               "production",
		"SHOP_JWT_SECRET":        r.secret,
		"SHOP_ADMIN_TOKEN":       r.admin,
		"SHOP_KEY_PREFIX":        shoptest.Prefix("faults"),
		"SHOP_LOCK_WAIT_TIMEOUT": "60s",
		"SHOP_DB_MAX_CONNS":      "8",
	}
	if env["SHOP_MYSQL_DSN"] == "" {
		r.env["SHOP_MYSQL_DSN"] = shoptest.MySQL(t)
	}
	for k, v := range env {
		r.env[k] = v
	}
	return r
}

// start runs one more shop process. A process the test stopped with
// SIGSTOP is continued before shoptest's cleanup sends it SIGTERM.
func (r *rig) start() *shoptest.Instance {
	r.t.Helper()
	in := shoptest.Start(r.t, r.bin, r.env)
	r.t.Cleanup(func() { _ = in.Signal(sigCont) })
	return in
}

func (r *rig) token(user int64) string { return shoptest.Token(r.t, r.secret, user) }

// account creates account id with balance on the instance at url, and
// tells the history its opening balance.
func (r *rig) account(url string, id, balance int64) {
	r.t.Helper()
	r.client.Must(r.t, http.StatusCreated, "POST", url+"/admin/v1/accounts", r.admin,
		map[string]any{"id": id, "balance_cents": balance})
	r.hist.open(id, balance)
}

func (r *rig) product(url, sku string, stock int64) {
	r.t.Helper()
	r.client.Must(r.t, http.StatusCreated, "POST", url+"/admin/v1/products", r.admin,
		map[string]any{"sku": sku, "name": sku, "stock": stock, "price_cents": 1})
}

type auditReport struct {
	OK            bool `json:"ok"`
	OversoldUnits struct {
		Total int64            `json:"total"`
		BySKU map[string]int64 `json:"by_sku"`
	} `json:"oversold_units"`
	BalanceDrift struct {
		Total     int64            `json:"total"`
		ByAccount map[string]int64 `json:"by_account"`
	} `json:"balance_drift"`
}

// audit asks url for the audit, retrying while the instance answers 503
// (a lock server or the database coming back).
func (r *rig) audit(url string) auditReport {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := r.client.Do(context.Background(), "GET", url+"/admin/v1/audit", r.admin, nil)
		if err == nil && res.Status == http.StatusOK {
			var a auditReport
			res.JSON(r.t, &a)
			return a
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("audit: %v %d %s", err, res.Status, res.Body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// metric sums the samples of metric on url whose labels contain labels.
func (r *rig) metric(url, metric string, labels ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := r.client.Do(ctx, "GET", url+"/metrics", "", nil)
	if err != nil {
		return 0, err
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(string(res.Body)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, nil
}

// The suite's backend lists come from the registry; this pins down that a
// registered backend is never left out of them without a stated reason.
func TestSuiteCoversEveryBackend(t *testing.T) {
	restarted := map[string]bool{}
	for _, b := range restartBackends() {
		restarted[b.Name] = true
	}
	for _, b := range registry.Backends() {
		held := slices.Contains(crossProcess(), b.Name)
		if held != b.Capabilities.CrossProcess {
			t.Errorf("backend %s: in the holder faults = %v, want %v", b.Name, held, b.Capabilities.CrossProcess)
		}
		// Redlock's three masters are not one server to restart.
		if want := held && b.Server.Kind != registry.Redlock; restarted[b.Name] != want {
			t.Errorf("backend %s: in the restart fault = %v, want %v", b.Name, restarted[b.Name], want)
		}
		if held && b.Server.Setting == "" {
			t.Errorf("backend %s excludes across processes but names no server setting to point shop at", b.Name)
		}
	}
}
