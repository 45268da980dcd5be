package report

import (
	"bytes"
	"context"
	"encoding/json"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/testenv"
)

// layoutProbe measures the page once it has loaded and writes what it
// found into the DOM, where --dump-dom shows it.
const layoutProbe = `<script>
window.addEventListener("load", () => {
  const cells = [...document.querySelectorAll("td.verdict")];
  const hidden = cells.filter(c => {
    const r = c.getBoundingClientRect();
    return r.width === 0 || r.left < 0 || r.right > window.innerWidth || getComputedStyle(c).visibility !== "visible";
  }).map(c => c.parentElement.firstElementChild.textContent);
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = JSON.stringify({scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
    verdicts: cells.length, hidden: hidden});
  document.body.appendChild(out);
});
</script>
</body>`

type layout struct {
	ScrollWidth int      `json:"scrollWidth"`
	InnerWidth  int      `json:"innerWidth"`
	Verdicts    int      `json:"verdicts"`
	Hidden      []string `json:"hidden"`
}

// measure opens page in headless Chromium in a window width pixels wide
// and returns what layoutProbe found.
func measure(t *testing.T, chromium, page string, width int) layout {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	probed := filepath.Join(t.TempDir(), "probed.html")
	if err := os.WriteFile(probed, []byte(strings.Replace(string(b), "</body>", layoutProbe, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir="+t.TempDir(),
		"--window-size="+strconv.Itoa(width)+",900", "--virtual-time-budget=5000", "--dump-dom", "file://"+probed)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	m := regexp.MustCompile(`(?s)<pre id="layout">(.*?)</pre>`).FindSubmatch(dom)
	if m == nil {
		t.Fatalf("the page did not report its layout; chromium printed:\n%s\n%s", dom, stderr.String())
	}
	var l layout
	if err := json.Unmarshal([]byte(html.UnescapeString(string(m[1]))), &l); err != nil {
		t.Fatalf("layout %s: %v", m[1], err)
	}
	return l
}

// The report is read on a laptop: at 1,280 px it must not scroll sideways,
// and every row's verdict must be on screen.
func TestReportFitsA1280PixelWindowWithEveryVerdictVisible(t *testing.T) {
	chromium := testenv.Require(t, "SHOP_TEST_CHROMIUM")
	dir := t.TempDir()
	rep := sample()
	// A failed row prints its error under the verdict, however long.
	failed := Result{Spec: Row{Name: "etcd+combined"}, Err: "dial tcp 127.0.0.1:12379: " + strings.Repeat("connection-refused/", 12)}
	failed.Judge()
	// An events row shows in both tables, with its problems under its
	// verdict in the events table.
	events := drained(eventsRow, func(e *Events) { e.Lost, e.Lag = 3, Latency{P50: 1234.5, P99: 65432.1} })
	events.Judge()
	rep.Results = append(rep.Results, failed, events)
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	l := measure(t, chromium, filepath.Join(dir, "report.html"), 1280)
	if l.InnerWidth != 1280 {
		t.Fatalf("the window is %d px wide, want 1280: the measure says nothing", l.InnerWidth)
	}
	if l.ScrollWidth > 1280 {
		t.Errorf("the page is %d px wide: at 1280 px it scrolls sideways", l.ScrollWidth)
	}
	if l.Verdicts != len(rep.Results)+1 || len(l.Hidden) > 0 {
		t.Errorf("%d verdicts for %d rows; off screen: %q", l.Verdicts, len(rep.Results), l.Hidden)
	}
}
