package order

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/problem"
)

func init() {
	problem.Register(ErrNotFound, http.StatusNotFound, "order-not-found", "Order not found")
	problem.Register(ErrInProgress, http.StatusConflict, "order-in-progress", "Order in progress")
	problem.Register(ErrRefundFailed, http.StatusInternalServerError, "order-refund-failed", "Order failed, refund pending")
	problem.Register(ErrTooLarge, http.StatusUnprocessableEntity, "order-too-large", "Order amount too large")
}

// Domain is the order domain as cmd/shop wires it: the token route, the
// order routes behind the idempotency middleware, the audit check.
type Domain struct {
	Service *Service
	Store   *Store
	Idem    *idem.Idem
}

// Register adds POST /idempotency-tokens, POST /orders (which requires an
// Idempotency-Key) and GET /orders/{id} to api. No admin routes.
func (d *Domain) Register(api, _ *gin.RouterGroup) {
	d.Idem.Register(api)
	api.POST("/orders", d.Idem.Middleware(), d.place)
	api.GET("/orders/:id", d.get)
}

// Reset implements audit.Resetter.
func (d *Domain) Reset(ctx context.Context, fixture string) error { return d.Store.Reset(ctx, fixture) }

// Checks are the order invariants for the audit.
func (d *Domain) Checks() []audit.Check {
	return []audit.Check{{Name: "duplicate_orders", By: "by_key", Run: d.Store.Duplicates}}
}

type placeRequest struct {
	SKU      *string `json:"sku"`
	Quantity *int64  `json:"quantity"`
}

func (d *Domain) place(c *gin.Context) {
	var req placeRequest
	if err := problem.DecodeJSON(c, &req); err != nil {
		problem.Write(c, err)
		return
	}
	if req.SKU == nil || req.Quantity == nil {
		problem.Write(c, problem.BadRequest("sku and quantity are required"))
		return
	}
	o, err := d.Service.Place(c.Request.Context(), auth.UserID(c), idem.Key(c), *req.SKU, *req.Quantity)
	if err != nil {
		if errors.Is(err, ErrInProgress) {
			// Not the answer to keep: once the earlier run is settled, a
			// retry must get the real outcome.
			idem.DoNotStore(c)
		}
		problem.Write(c, err)
		return
	}
	c.Header("Location", "/api/v1/orders/"+strconv.FormatInt(o.ID, 10))
	c.JSON(http.StatusCreated, o)
}

// get answers 404 for another user's order, as for a missing one: 403
// would confirm that the id exists.
func (d *Domain) get(c *gin.Context) {
	raw := c.Param("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		problem.Write(c, problem.BadRequest(fmt.Sprintf("order id must be a positive integer, got %q", raw)))
		return
	}
	o, err := d.Service.Get(c.Request.Context(), auth.UserID(c), id)
	if err != nil {
		problem.Write(c, err)
		return
	}
	c.JSON(http.StatusOK, o)
}
