package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/shoptest"
)

// An account is a register with three operations; a history of them, as
// the clients saw them (call and return times, results), is linearizable
// when some order of the operations, each placed between its call and its
// return, explains every result. A lost update is not: two deposits that
// both report the balance before plus their own amount cannot both be
// placed.

type accInput struct {
	Kind   string // deposit, withdraw or get
	Amount int64
}

type accOutput struct {
	Balance      int64
	Insufficient bool // 422: the withdrawal was refused, nothing changed
	// Unknown marks an operation whose result the client never got (the
	// connection died, the server crashed): it may or may not have taken
	// effect, so it returns "at the end of time" and matches any balance.
	Unknown bool
}

var accountModel = porcupine.NondeterministicModel{
	Init: func() []any { panic("set per account") },
	Step: func(state, input, output any) []any {
		s, in, out := state.(int64), input.(accInput), output.(accOutput)
		switch in.Kind {
		case "get":
			if out.Unknown || out.Balance == s {
				return []any{s}
			}
		case "deposit":
			if out.Unknown {
				return []any{s, s + in.Amount}
			}
			if out.Balance == s+in.Amount {
				return []any{s + in.Amount}
			}
		case "withdraw":
			switch {
			case out.Unknown && s >= in.Amount:
				return []any{s, s - in.Amount}
			case out.Unknown:
				return []any{s}
			case out.Insufficient && s < in.Amount:
				return []any{s}
			case !out.Insufficient && s >= in.Amount && out.Balance == s-in.Amount:
				return []any{s - in.Amount}
			}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(accInput), output.(accOutput)
		switch {
		case out.Unknown:
			return fmt.Sprintf("%s(%d) -> ?", in.Kind, in.Amount)
		case out.Insufficient:
			return fmt.Sprintf("%s(%d) -> insufficient", in.Kind, in.Amount)
		}
		return fmt.Sprintf("%s(%d) -> %d", in.Kind, in.Amount, out.Balance)
	},
}

// history records the account operations of one test, per account.
type history struct {
	mu      sync.Mutex
	start   time.Time
	opening map[int64]int64
	ops     map[int64][]porcupine.Operation
	clients int
}

func newHistory() *history {
	return &history{start: time.Now(), opening: map[int64]int64{}, ops: map[int64][]porcupine.Operation{}}
}

func (h *history) open(id, balance int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.opening[id] = balance
}

// outcome is what one request got.
type outcome struct {
	Status       int
	Type         string // the problem type's slug, for error answers
	ContentType  string
	Balance      int64
	Err          error // transport error
	Call, Return time.Time
}

// refused reports an answer that promises nothing was changed: a problem
// whose type shop documents as "nothing was changed", or a 4xx.
func (o outcome) refused() bool {
	if o.Err != nil {
		return false
	}
	if o.Status >= 400 && o.Status < 500 && o.Status != http.StatusUnprocessableEntity {
		return true
	}
	switch o.Type {
	case "lock-busy", "lease-lost", "fenced", "unavailable", "shutting-down":
		return true
	}
	return false
}

func (o outcome) String() string {
	if o.Err != nil {
		return "error: " + o.Err.Error()
	}
	if o.Type != "" {
		return fmt.Sprintf("%d %s", o.Status, o.Type)
	}
	return fmt.Sprintf("%d", o.Status)
}

// do sends one account operation to url as the owner of account id and
// records it: a success with its balance, a refusal not at all (it changed
// nothing, which the check then holds the service to), anything else as an
// operation of unknown outcome.
func (h *history) do(ctx context.Context, c *shoptest.Client, url, token string, id int64, in accInput) outcome {
	method, path, body := "GET", fmt.Sprintf("/api/v1/accounts/%d", id), any(nil)
	if in.Kind != "get" {
		method, path = "POST", path+"/"+in.Kind
		body = map[string]int64{"amount_cents": in.Amount}
	}
	o := outcome{Call: time.Now()}
	res, err := c.Do(ctx, method, url+path, token, body)
	o.Return = time.Now()
	o.Status, o.Err, o.ContentType = res.Status, err, res.Header.Get("Content-Type")
	if err == nil {
		if res.Status == http.StatusOK {
			var a struct {
				Balance int64 `json:"balance_cents"`
			}
			if json.Unmarshal(res.Body, &a) != nil {
				o.Err = fmt.Errorf("undecodable 200: %s", res.Body)
			}
			o.Balance = a.Balance
		} else {
			var p problem.Details
			_ = json.Unmarshal(res.Body, &p)
			o.Type = strings.TrimPrefix(p.Type, problem.TypeBase)
		}
	}

	op := porcupine.Operation{Input: in, Call: int64(o.Call.Sub(h.start)), Return: int64(o.Return.Sub(h.start))}
	switch {
	case o.Err == nil && o.Status == http.StatusOK:
		op.Output = accOutput{Balance: o.Balance}
	case o.Err == nil && o.Status == http.StatusUnprocessableEntity && o.Type == "insufficient-funds":
		op.Output = accOutput{Insufficient: true}
	case o.refused():
		return o
	default:
		op.Output = accOutput{Unknown: true}
		op.Return = math.MaxInt64 / 2
	}
	h.mu.Lock()
	op.ClientId = h.clients
	h.clients++
	h.ops[id] = append(h.ops[id], op)
	h.mu.Unlock()
	return o
}

// check runs porcupine on the history of each account in ids (every
// account if none): "yes", or "NO" naming the first account whose history
// no order explains.
func (h *history) check(ids ...int64) (ok bool, verdict string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(ids) == 0 {
		for id := range h.ops {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		ops := h.ops[id]
		m := accountModel
		opening := h.opening[id]
		m.Init = func() []any { return []any{opening} }
		res, _ := porcupine.CheckOperationsVerbose(m.ToModel(), ops, 60*time.Second)
		switch res {
		case porcupine.Illegal:
			return false, fmt.Sprintf("NO (account %d: %d operations, no linearization)", id, len(ops))
		case porcupine.Unknown:
			return false, fmt.Sprintf("UNKNOWN (account %d: checker timed out)", id)
		}
	}
	return true, "yes"
}

// describe lists an account's operations, for a failure message.
func (h *history) describe(id int64) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, op := range h.ops[id] {
		ret := "∞"
		if op.Return < math.MaxInt64/2 {
			ret = time.Duration(op.Return).Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "  [%s, %s] %s\n", time.Duration(op.Call).Round(time.Millisecond), ret,
			accountModel.DescribeOperation(op.Input, op.Output))
	}
	return b.String()
}
