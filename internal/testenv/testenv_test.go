package testenv

import (
	"fmt"
	"testing"
)

// recorder notes whether Require skipped or failed instead of doing it.
type recorder struct {
	testing.TB
	skipped, failed bool
}

func (r *recorder) Helper()                   {}
func (r *recorder) Skipf(string, ...any)      { r.skipped = true }
func (r *recorder) Fatalf(f string, a ...any) { r.failed = true; _ = fmt.Sprintf(f, a...) }

func TestRequire(t *testing.T) {
	const name = "SHOP_TEST_TESTENV_PROBE"
	for _, tc := range []struct {
		name, value, ci string
		skipped, failed bool
		want            []string
	}{
		{name: "set", value: "a:1,b:2", want: []string{"a:1", "b:2"}},
		{name: "unset-skips", skipped: true},
		{name: "unset-in-ci-fails", ci: "true", failed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(name, tc.value)
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			got := RequireList(r, name)
			if r.skipped != tc.skipped || r.failed != tc.failed {
				t.Fatalf("skipped %v failed %v, want %v %v", r.skipped, r.failed, tc.skipped, tc.failed)
			}
			if tc.want != nil && fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("RequireList = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNATSProcessRestartsOnItsPort(t *testing.T) {
	p := StartNATS(t)
	url := p.URL()
	p.Stop()
	p.Start()
	if p.URL() != url {
		t.Fatalf("URL changed across a restart: %s, then %s", url, p.URL())
	}
}
