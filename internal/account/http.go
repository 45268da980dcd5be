package account

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/problem"
)

// Problems are the account errors' rows of the API's problem table.
func Problems() []problem.Mapping {
	return []problem.Mapping{
		{Target: ErrNotFound, Status: http.StatusNotFound, Slug: "account-not-found", Title: "Account not found"},
		{Target: ErrInsufficientFunds, Status: http.StatusUnprocessableEntity, Slug: "insufficient-funds", Title: "Insufficient funds"},
		{Target: ErrOverflow, Status: http.StatusUnprocessableEntity, Slug: "balance-overflow", Title: "Balance overflow"},
		{Target: ErrInvalidAmount, Status: http.StatusBadRequest, Slug: "invalid-input", Title: "Invalid input"},
		{Target: ErrSameAccount, Status: http.StatusBadRequest, Slug: "invalid-input", Title: "Invalid input"},
		{Target: ErrPreconditionFailed, Status: http.StatusPreconditionFailed, Slug: "precondition-failed", Title: "Precondition failed"},
	}
}

// Domain is the account domain as cmd/shop wires it: routes, fixtures and
// audit checks.
type Domain struct {
	Service Service
	Store   *Store
	// Idempotent guards the routes that move money (idem's Optional: a
	// retry with the same Idempotency-Key gets the first answer); nil
	// leaves them plain POSTs.
	Idempotent gin.HandlerFunc
}

// Register adds the user routes to api (which authenticates users) and the
// admin routes to admin (which checks the admin token).
func (d *Domain) Register(api, admin *gin.RouterGroup) {
	api.GET("/accounts/:id", problem.Handle(d.get))
	api.POST("/accounts/:id/deposit", d.guarded(d.deposit)...)
	api.POST("/accounts/:id/withdraw", d.guarded(d.withdraw)...)
	api.POST("/transfers", d.guarded(d.transfer)...)
	admin.POST("/accounts", problem.Handle(d.put))
}

func (d *Domain) guarded(h problem.Handler) []gin.HandlerFunc {
	if d.Idempotent == nil {
		return []gin.HandlerFunc{problem.Handle(h)}
	}
	return []gin.HandlerFunc{d.Idempotent, problem.Handle(h)}
}

// Reset implements audit.Resetter.
func (d *Domain) Reset(ctx context.Context, fixture string) error { return d.Store.Reset(ctx, fixture) }

// ForgetFences sets every account's fence to 0. Only for a lock store that
// restarted empty and that nobody else can reach (the embedded Redis):
// its tokens start over at 1, and the old fences would refuse every write.
func (d *Domain) ForgetFences(ctx context.Context) error {
	return d.Store.db.WithContext(ctx).Exec("UPDATE accounts SET fence = 0").Error
}

// Checks are the account invariants for the audit.
func (d *Domain) Checks() []audit.Check {
	return []audit.Check{
		{Name: "balance_drift", By: "by_account", Unit: "cents", Run: d.Store.Drift},
		{Name: "unpaired_transfer_cents", By: "by_transfer", Unit: "cents", Run: d.Store.UnpairedTransfers},
		{Name: "unbalanced_money_cents", By: "by_scope", Unit: "cents", Run: d.Store.UnbalancedMoney},
	}
}

type amountRequest struct {
	Amount *int64 `json:"amount_cents"`
}

type transferRequest struct {
	From   *int64 `json:"from"`
	To     *int64 `json:"to"`
	Amount *int64 `json:"amount_cents"`
}

type putRequest struct {
	ID      *int64 `json:"id"`
	Balance *int64 `json:"balance_cents"`
}

func (d *Domain) get(c *gin.Context) error {
	id, err := ownAccount(c)
	if err != nil {
		return err
	}
	a, err := d.Service.Get(c.Request.Context(), id)
	if err != nil {
		return err
	}
	c.Header("ETag", ETag(a.Version))
	c.JSON(http.StatusOK, a)
	return nil
}

func (d *Domain) deposit(c *gin.Context) error  { return d.change(c, d.Service.Deposit) }
func (d *Domain) withdraw(c *gin.Context) error { return d.change(c, d.Service.Withdraw) }

func (d *Domain) change(c *gin.Context, op func(context.Context, int64, int64, Precondition) (Account, error)) error {
	id, err := ownAccount(c)
	if err != nil {
		return err
	}
	pre, err := ParseIfMatch(c.Request.Header.Values("If-Match"))
	if err != nil {
		return err
	}
	var req amountRequest
	if err := problem.DecodeJSON(c, &req); err != nil {
		return err
	}
	if err := positive("amount_cents", req.Amount); err != nil {
		return err
	}
	keyed.Decide(c.Request.Context(), changed)
	a, err := op(c.Request.Context(), id, *req.Amount, pre)
	if err != nil {
		return err
	}
	idem.Reply(c, changed(&a))
	return nil
}

// changed is a balance change's answer, sent and recorded alike.
func changed(a *Account) keyed.Answer { return keyed.Answer{Status: http.StatusOK, Body: a} }

// transferred is a transfer's answer, sent and recorded alike.
func transferred(t *Transfer) keyed.Answer { return keyed.Answer{Status: http.StatusOK, Body: t} }

func (d *Domain) transfer(c *gin.Context) error {
	var req transferRequest
	if err := problem.DecodeJSON(c, &req); err != nil {
		return err
	}
	var invalid problem.Fields
	for _, f := range []struct {
		name string
		v    *int64
	}{{"from", req.From}, {"to", req.To}, {"amount_cents", req.Amount}} {
		if err := positive(f.name, f.v); err != nil {
			invalid.Add("/"+f.name, err.Error())
		}
	}
	if err := invalid.Err(); err != nil {
		return err
	}
	if err := auth.RequireSelf(c, *req.From); err != nil {
		return err
	}
	keyed.Decide(c.Request.Context(), transferred)
	t, err := d.Service.Transfer(c.Request.Context(), *req.From, *req.To, *req.Amount)
	if err != nil {
		return err
	}
	idem.Reply(c, transferred(&t))
	return nil
}

func (d *Domain) put(c *gin.Context) error {
	var req putRequest
	if err := problem.DecodeJSON(c, &req); err != nil {
		return err
	}
	var invalid problem.Fields
	if err := positive("id", req.ID); err != nil {
		invalid.Add("/id", err.Error())
	}
	switch {
	case req.Balance == nil:
		invalid.Add("/balance_cents", "balance_cents is required: a non-negative integer")
	case *req.Balance < 0:
		invalid.Add("/balance_cents", fmt.Sprintf("balance_cents must be a non-negative integer, got %d", *req.Balance))
	}
	if err := invalid.Err(); err != nil {
		return err
	}
	created, err := d.Store.Put(c.Request.Context(), *req.ID, *req.Balance)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	c.JSON(status, Account{ID: *req.ID, Balance: *req.Balance})
	return nil
}

// ownAccount parses the :id of the path and checks that it is the caller's.
func ownAccount(c *gin.Context) (int64, error) {
	raw := c.Param("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		return 0, problem.BadRequest(fmt.Sprintf("account id must be a positive integer, got %q", raw))
	}
	return id, auth.RequireSelf(c, id)
}

func positive(name string, v *int64) error {
	if v == nil {
		return problem.BadRequest(name + " is required: a positive integer")
	}
	if *v <= 0 {
		return problem.BadRequest(fmt.Sprintf("%s must be a positive integer, got %d", name, *v))
	}
	return nil
}
