package faults

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestCheckerCatchesLostUpdates proves the history check has teeth: the
// same recording, on two shop processes without a lock (backend none) and
// with a critical section wide enough for deposits to overlap, must be
// found non-linearizable, and agree with the audit's drift.
func TestCheckerCatchesLostUpdates(t *testing.T) {
	t.Parallel()
	r := newRig(t, map[string]string{"SHOP_LOCK_BACKEND": "none", "SHOP_CRITICAL_SECTION_DELAY": "200ms"})
	a, b := r.start(), r.start()
	const id = 1
	r.account(a.URL, id, opening)
	tok := r.token(id)

	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 10 {
		url := a.URL
		if i%2 == 1 {
			url = b.URL
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			o := r.hist.do(context.Background(), r.client, url, tok, id, accInput{Kind: "deposit", Amount: int64(i + 1)})
			if o.Err != nil || o.Status != http.StatusOK {
				t.Errorf("deposit without a lock: %s", o)
			}
		}()
	}
	close(start)
	wg.Wait()
	r.hist.do(context.Background(), r.client, a.URL, tok, id, accInput{Kind: "get"})

	audit := r.audit(a.URL)
	lin, verdict := r.hist.check(id)
	report(row{Fault: "6 no lock (checker's own test)", Backend: "none", Overlap: 10,
		LostCents: audit.BalanceDrift.ByAccount["1"], Linearizable: verdict})
	if lin {
		t.Errorf("10 overlapping unlocked deposits judged linearizable:\n%s", r.hist.describe(id))
	}
	if audit.BalanceDrift.ByAccount["1"] == 0 {
		t.Errorf("audit found no drift: %+v", audit)
	}
}

// TestModel checks the register model on hand-made histories: a lost
// update, a refused withdrawal, and an operation whose outcome is unknown.
func TestModel(t *testing.T) {
	op := func(call, ret int64, in accInput, out accOutput) porcupine.Operation {
		if out.Unknown {
			ret = 1 << 40
		}
		return porcupine.Operation{Call: call, Return: ret, Input: in, Output: out}
	}
	dep := func(n int64) accInput { return accInput{Kind: "deposit", Amount: n} }
	cases := []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"sequential", []porcupine.Operation{
			op(0, 1, dep(5), accOutput{Balance: 105}), op(2, 3, dep(1), accOutput{Balance: 106}),
		}, true},
		{"concurrent in either order", []porcupine.Operation{
			op(0, 5, dep(5), accOutput{Balance: 106}), op(1, 4, dep(1), accOutput{Balance: 101}),
		}, true},
		{"lost update", []porcupine.Operation{
			op(0, 5, dep(5), accOutput{Balance: 105}), op(1, 4, dep(1), accOutput{Balance: 101}),
		}, false},
		{"lost update seen by a later read", []porcupine.Operation{
			op(0, 1, dep(5), accOutput{Balance: 105}), op(2, 3, accInput{Kind: "get"}, accOutput{Balance: 100}),
		}, false},
		{"refused withdrawal", []porcupine.Operation{
			op(0, 1, accInput{Kind: "withdraw", Amount: 500}, accOutput{Insufficient: true}),
			op(2, 3, accInput{Kind: "withdraw", Amount: 50}, accOutput{Balance: 50}),
		}, true},
		{"unknown outcome applied", []porcupine.Operation{
			op(0, 0, dep(5), accOutput{Unknown: true}), op(2, 3, accInput{Kind: "get"}, accOutput{Balance: 105}),
		}, true},
		{"unknown outcome not applied", []porcupine.Operation{
			op(0, 0, dep(5), accOutput{Unknown: true}), op(2, 3, accInput{Kind: "get"}, accOutput{Balance: 100}),
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := accountModel
			m.Init = func() []any { return []any{int64(100)} }
			got := porcupine.CheckOperationsTimeout(m.ToModel(), c.ops, 10*time.Second) == porcupine.Ok
			if got != c.want {
				t.Errorf("linearizable = %v, want %v", got, c.want)
			}
		})
	}
}
