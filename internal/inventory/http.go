package inventory

import (
	"context"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/problem"
)

// Problems are the inventory errors' rows of the API's problem table.
func Problems() []problem.Mapping {
	return []problem.Mapping{
		{Target: ErrNotFound, Status: http.StatusNotFound, Slug: "product-not-found", Title: "Product not found"},
		{Target: ErrSoldOut, Status: http.StatusConflict, Slug: "sold-out", Title: "Sold out"},
		{Target: ErrLimitExceeded, Status: http.StatusConflict, Slug: "purchase-limit", Title: "Purchase limit exceeded"},
		{Target: ErrInvalidQuantity, Status: http.StatusBadRequest, Slug: "invalid-input", Title: "Invalid input"},
	}
}

// Domain is the inventory domain as cmd/shop wires it.
type Domain struct {
	Service Service
	Store   *Store
	// Idempotent guards the purchase (idem's Optional: a retry with the
	// same Idempotency-Key gets the first answer); nil leaves it a plain
	// POST.
	Idempotent gin.HandlerFunc
}

// Register adds the user routes to api and the admin routes to admin.
func (d *Domain) Register(api, admin *gin.RouterGroup) {
	api.GET("/products/:sku", problem.Handle(d.get))
	if d.Idempotent != nil {
		api.POST("/seckill/:sku/purchase", d.Idempotent, problem.Handle(d.purchase))
	} else {
		api.POST("/seckill/:sku/purchase", problem.Handle(d.purchase))
	}
	admin.POST("/products", problem.Handle(d.put))
}

// Reset implements audit.Resetter.
func (d *Domain) Reset(ctx context.Context, fixture string) error { return d.Store.Reset(ctx, fixture) }

// ResetCommitted implements audit.CommitListener: it drops the mirrors of
// the fixture's products again, which a sale may have loaded from the rows
// the reset replaced before its transaction committed.
func (d *Domain) ResetCommitted(ctx context.Context, fixture string) {
	if d.Store.mirror == nil {
		return
	}
	for _, p := range fixtures[fixture] {
		d.Store.mirror.Forget(ctx, p.SKU)
	}
}

// ForgetFences sets every product's fence to 0. Only for a lock store that
// restarted empty and that nobody else can reach (the embedded Redis):
// its tokens start over at 1, and the old fences would refuse every write.
func (d *Domain) ForgetFences(ctx context.Context) error {
	return d.Store.db.WithContext(ctx).Exec("UPDATE products SET fence = 0").Error
}

// Checks are the inventory invariants for the audit.
func (d *Domain) Checks() []audit.Check {
	checks := []audit.Check{
		{Name: "oversold_units", By: "by_sku", Unit: "units", Run: d.Store.Oversold},
		{Name: "stock_drift", By: "by_sku", Unit: "units", Run: d.Store.StockDrift},
		{Name: "over_limit_units", By: "by_sku_user", Unit: "units", Run: d.Store.OverLimit},
		{Name: "miscounted_limit_units", By: "by_sku_user", Unit: "units", Run: d.Store.MiscountedLimit},
	}
	if d.Store.mirror != nil {
		checks = append(checks, audit.Check{Name: "mirror_drift", By: "by_sku", Unit: "units", Run: d.Store.MirrorDrift})
	}
	return checks
}

type purchaseRequest struct {
	Quantity *int64 `json:"quantity"`
}

type putRequest struct {
	SKU          *string `json:"sku"`
	Name         *string `json:"name"`
	Stock        *int64  `json:"stock"`
	PriceCents   *int64  `json:"price_cents"`
	PerUserLimit *int64  `json:"per_user_limit"`
}

func (d *Domain) get(c *gin.Context) error {
	p, err := d.Service.Get(c.Request.Context(), c.Param("sku"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, p)
	return nil
}

func (d *Domain) purchase(c *gin.Context) error {
	var req purchaseRequest
	if err := problem.DecodeJSON(c, &req); err != nil {
		return err
	}
	if req.Quantity == nil {
		return problem.BadRequest("quantity is required: a positive integer")
	}
	keyed.Decide(c.Request.Context(), purchased)
	p, err := d.Service.Purchase(c.Request.Context(), auth.UserID(c), c.Param("sku"), *req.Quantity)
	if err != nil {
		return err
	}
	idem.Reply(c, purchased(&p))
	return nil
}

// purchased is a purchase's answer, sent and recorded alike.
func purchased(p *Purchase) keyed.Answer { return keyed.Answer{Status: http.StatusCreated, Body: p} }

func (d *Domain) put(c *gin.Context) error {
	var req putRequest
	if err := problem.DecodeJSON(c, &req); err != nil {
		return err
	}
	p, err := req.product()
	if err != nil {
		return err
	}
	created, err := d.Store.Put(c.Request.Context(), p)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	p.InitialStock = p.Stock
	c.JSON(status, p)
	return nil
}

func (r putRequest) product() (Product, error) {
	switch {
	case r.SKU == nil:
		return Product{}, problem.BadRequest("sku is required")
	case !ValidSKU(*r.SKU):
		return Product{}, problem.BadRequest(fmt.Sprintf("sku must be 1 to 64 lower-case letters, digits, '.', '-' or '_', got %q", *r.SKU))
	case r.Name == nil || *r.Name == "":
		return Product{}, problem.BadRequest("name is required")
	case utf8.RuneCountInString(*r.Name) > 200: // characters, as VARCHAR(200) and openapi's maxLength count
		return Product{}, problem.BadRequest(fmt.Sprintf("name must be at most 200 characters, got %d", utf8.RuneCountInString(*r.Name)))
	}
	for _, f := range []struct {
		name string
		v    *int64
		need bool
	}{{"stock", r.Stock, true}, {"price_cents", r.PriceCents, true}, {"per_user_limit", r.PerUserLimit, false}} {
		if f.v == nil && f.need {
			return Product{}, problem.BadRequest(f.name + " is required: a non-negative integer")
		}
		if f.v != nil && *f.v < 0 {
			return Product{}, problem.BadRequest(fmt.Sprintf("%s must be a non-negative integer, got %d", f.name, *f.v))
		}
	}
	p := Product{SKU: *r.SKU, Name: *r.Name, Stock: *r.Stock, PriceCents: *r.PriceCents}
	if r.PerUserLimit != nil {
		p.PerUserLimit = *r.PerUserLimit
	}
	return p, nil
}
